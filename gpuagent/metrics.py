"""Prometheus metrics: one tick's state as series, for node_exporter's textfile collector.

Only the daemon imports this module: ``gpuagent status`` must not load prometheus_client.

Values are in base units (bytes, ratios 0-1, hertz, watts, degrees Celsius) and every per-GPU
series is labelled by ``pci_slot`` (sysfs form) and ``uuid``, never by index alone, since
indices shift when a GPU disappears.  A null field is no series, and a stale GPU keeps only its
``gpuagent_gpu_info`` series, so Prometheus never graphs frozen numbers as live.  Every GPU the
agent knows has ``gpuagent_gpu_healthy``, and each problem holding on it one
``gpuagent_gpu_problem`` series; host-level problems (``gpu_count``) have empty ``pci_slot``
and ``uuid``.  The kernel driver's Xids of this boot are counters per GPU and code
(``gpuagent_gpu_xid_errors_total``, recounted from the journal when the agent restarts), with
``gpuagent_gpu_xid_info`` saying what each code means; NVSwitch SXids are
``gpuagent_nvswitch_sxid_errors_total``.  The agent's own trouble (the state's ``problems``)
is ``gpuagent_agent_problem{kind}``.  NVLink and NVIDIA's services are in
:mod:`gpuagent.sources.nvlink.nvmetrics`, who is on each GPU in
:mod:`gpuagent.sources.processes.procmetrics`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuagent.health import state_rank
from gpuagent.schema import GpuEntry, ProbeState, ProblemEntry, State
from gpuagent.sources.nvlink import nvmetrics
from gpuagent.sources.processes import procmetrics
from gpuagent.views import Series, Table

if TYPE_CHECKING:
    from prometheus_client.registry import Collector
else:
    # prometheus-client 0.9.0 (Ubuntu 22.04) has no Collector base class: a registry takes
    # any object with collect(), as every release does.
    Collector = object

__all__ = ["GPU_VALUES", "Collector", "Exposition", "families", "render", "tables"]

_MIB = 1048576
GPU_LABELS = ("pci_slot", "uuid")


def _same(v: float) -> float:
    return v


def _ratio(v: float) -> float:
    return v / 100


def _bytes(v: float) -> float:
    return v * _MIB


def _hertz(v: float) -> float:
    return v * 1_000_000


# Series, nvidia-smi field, conversion to the base unit, help text.
GPU_VALUES: tuple[tuple[str, str, Callable[[float], float], str], ...] = (
    ("gpuagent_gpu_temperature_celsius", "temperature.gpu", _same, "GPU core temperature."),
    (
        "gpuagent_gpu_temperature_limit_margin_celsius",
        "temperature.gpu.tlimit",
        _same,
        "Degrees left below the GPU's maximum operating temperature (nvidia-smi T.Limit); "
        "the GPU slows down near 0.",
    ),
    ("gpuagent_gpu_utilization_ratio", "utilization.gpu", _ratio, "GPU busy time, 0 to 1."),
    (
        "gpuagent_gpu_memory_utilization_ratio",
        "utilization.memory",
        _ratio,
        "Time the memory controller was busy, 0 to 1.",
    ),
    ("gpuagent_gpu_memory_used_bytes", "memory.used", _bytes, "GPU memory in use."),
    ("gpuagent_gpu_memory_total_bytes", "memory.total", _bytes, "GPU memory installed."),
    ("gpuagent_gpu_power_draw_watts", "power.draw", _same, "Power drawn by the board."),
    ("gpuagent_gpu_power_limit_watts", "power.limit", _same, "Power limit of the board."),
    ("gpuagent_gpu_sm_clock_hertz", "clocks.sm", _hertz, "SM clock."),
    ("gpuagent_gpu_memory_clock_hertz", "clocks.mem", _hertz, "Memory clock."),
    ("gpuagent_gpu_fan_speed_ratio", "fan.speed", _ratio, "Fan speed asked for, 0 to 1."),
    (
        "gpuagent_gpu_ecc_uncorrected_volatile_errors",
        "ecc.errors.uncorrected.volatile.total",
        _same,
        "Uncorrected ECC errors since the driver loaded.",
    ),
)
_PSTATE = re.compile(r"P(\d{1,2})")
_MIG = {"Enabled": 1.0, "Disabled": 0.0}


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _gauge(name: str, doc: str, value: float) -> Table:
    return Table("gauge", name, doc, (), (((), value),))


def _counter(name: str, doc: str, value: float) -> Table:
    return Table("counter", name, doc, (), (((), value),))


def _labelled(name: str, doc: str, label: str, values: Iterable[str]) -> Table:
    return Table("gauge", name, doc, (label,), tuple(((v,), 1.0) for v in values))


def _gpu_tables(gpus: list[GpuEntry]) -> list[Table]:
    info: list[Series] = []
    healthy: list[Series] = []
    values: dict[str, list[Series]] = {name: [] for name, _, _, _ in GPU_VALUES}
    pstate: list[Series] = []
    mig: list[Series] = []
    for gpu in gpus:
        fields = gpu["fields"]
        who = (gpu["pci_slot"], _text(fields.get("uuid")))
        healthy.append((who, 1.0 if gpu["health"] == "ok" else 0.0))
        if not fields:
            continue
        info.append(((*who, _text(fields.get("name")), _text(fields.get("driver_version"))), 1.0))
        if gpu["stale"]:
            continue
        for name, field, convert, _ in GPU_VALUES:
            number = _number(fields.get(field))
            if number is not None:
                values[name].append((who, convert(number)))
        if m := _PSTATE.fullmatch(_text(fields.get("pstate"))):
            pstate.append((who, float(m.group(1))))
        mode = _MIG.get(_text(fields.get("mig.mode.current")))
        if mode is not None:
            mig.append((who, mode))
    return [
        Table(
            "gauge",
            "gpuagent_gpu_info",
            "A GPU nvidia-smi reports, with its name and driver version; always 1.",
            (*GPU_LABELS, "name", "driver_version"),
            tuple(info),
        ),
        Table(
            "gauge",
            "gpuagent_gpu_healthy",
            "1 when the GPU's health is ok, else 0 (a problem, or its health is unknown); for "
            "every GPU the agent knows.",
            GPU_LABELS,
            tuple(healthy),
        ),
        *(
            Table("gauge", name, doc, GPU_LABELS, tuple(values[name]))
            for name, _, _, doc in GPU_VALUES
        ),
        Table(
            "gauge",
            "gpuagent_gpu_pstate",
            "Performance state: 0 (P0, fastest) to 15.",
            GPU_LABELS,
            tuple(pstate),
        ),
        Table(
            "gauge",
            "gpuagent_gpu_mig_enabled",
            "1 when MIG mode is enabled, 0 when disabled.",
            GPU_LABELS,
            tuple(mig),
        ),
    ]


def _problems(state: State) -> Table:
    owners: list[tuple[str, str, list[ProblemEntry]]] = [("", "", state["host_problems"])]
    for gpu in state["gpus"]:
        owners.append((gpu["pci_slot"], _text(gpu["fields"].get("uuid")), gpu["problems"]))
    rows: dict[tuple[str, ...], float] = {}
    for slot, uuid, problems in owners:
        for p in problems:
            # Two Xids of one kind on a GPU are one series.
            rows.setdefault((slot, uuid, p["kind"], p["severity"], p["action"]), 1.0)
    return Table(
        "gauge",
        "gpuagent_gpu_problem",
        "A problem holding on a GPU (empty pci_slot and uuid: on the host), with its kind, "
        "severity (warning, critical) and the action to take; always 1.",
        (*GPU_LABELS, "kind", "severity", "action"),
        tuple(rows.items()),
    )


def _worst(state: State) -> Table:
    rows: list[Series] = []
    for gpu in state["gpus"]:
        slot, uuid = gpu["pci_slot"], _text(gpu["fields"].get("uuid"))
        # A problem folded under a host's cause (a GPU's fabric while the fabric manager is
        # down) is that cause's to page for, not its GPU's.
        own = [p for p in gpu["problems"] if not p.get("cause")]
        if own:
            p = min(own, key=lambda p: state_rank(slot, p))
            labels = (slot, uuid, p["kind"], p["severity"], p["action"], p["message"])
            rows.append(((*labels, _text(p.get("ends"))), 1.0))
    return Table(
        "gauge",
        "gpuagent_gpu_worst_problem",
        "The one problem of a GPU whose action applies: its worst, with the journal's "
        "message and how it ends; one series a GPU with a problem (the host's: "
        "gpuagent_host_problem); always 1.",
        (*GPU_LABELS, "kind", "severity", "action", "message", "ends"),
        tuple(rows),
    )


def _host(state: State) -> Table:
    rows: dict[str, Series] = {}
    # Worst first: of two problems of one kind (Xids at addresses that are no GPU), the
    # worse one's series.
    for p in sorted(state["host_problems"], key=lambda p: state_rank("", p)):
        # One explained by other problems (gpu_count by the GPUs gone from the bus) is
        # theirs to page for.
        if p.get("cause"):
            continue
        labels = (p["kind"], p["severity"], p["action"], p["message"], _text(p.get("ends")))
        rows.setdefault(p["kind"], (labels, 1.0))
    return Table(
        "gauge",
        "gpuagent_host_problem",
        "A problem of the host (not of one GPU), with its kind, severity, action, the "
        "journal's message and how it ends; one series a kind, for each pages on its own; "
        "always 1.",
        ("kind", "severity", "action", "message", "ends"),
        tuple(rows.values()),
    )


def _xids(state: State) -> list[Table]:
    errors: list[Series] = []
    info: list[Series] = []
    for gpu in state["gpus"]:
        slot, uuid = gpu["pci_slot"], _text(gpu["uuid"])
        for c in gpu["xids"]:
            code = str(c["xid"])
            errors.append(((slot, uuid, code), float(c["count"])))
            info.append(((slot, uuid, code, c["name"], c["severity"], c["action"]), 1.0))
    sxids = [((s["pci_slot"], str(s["sxid"])), float(s["count"])) for s in state["sxids"]]
    return [
        Table(
            "counter",
            "gpuagent_gpu_xid_errors",
            "Xid records the NVIDIA driver logged for the GPU this boot, by code.",
            (*GPU_LABELS, "xid"),
            tuple(errors),
        ),
        Table(
            "gauge",
            "gpuagent_gpu_xid_info",
            "What an Xid counted on the GPU means: its name, severity (critical, warning, or "
            "none: the GPU stays healthy) and the action; always 1.",
            (*GPU_LABELS, "xid", "name", "severity", "action"),
            tuple(info),
        ),
        Table(
            "counter",
            "gpuagent_nvswitch_sxid_errors",
            "SXid records the NVIDIA driver logged for the NVSwitch this boot, by code.",
            ("pci_slot", "sxid"),
            tuple(sxids),
        ),
    ]


def tables(state: State) -> list[Table]:
    """The families of one tick's state (:class:`gpuagent.schema.State`), as data."""
    probe = state["probe"]
    probe_state = probe["state"]
    out: list[Table] = [
        _labelled(
            "gpuagent_info",
            "The running gpuagent's version; always 1.",
            "version",
            [state["version"]],
        ),
        _gauge(
            "gpuagent_probe_up",
            "1 when the last nvidia-smi probe succeeded, else 0 (failing, stuck, gated, idle).",
            1.0 if probe_state == ProbeState.OK else 0.0,
        ),
        _gauge(
            "gpuagent_probe_consecutive_failures",
            "nvidia-smi probes failed in a row.",
            float(probe["consecutive_failures"]),
        ),
        _labelled(
            "gpuagent_probe_failure_info",
            "Present while nvidia-smi is failing: the failure class; always 1.",
            "class",
            [probe["failure_class"]]
            if probe_state in (ProbeState.FAILING, ProbeState.STUCK) and probe["failure_class"]
            else [],
        ),
        _labelled(
            "gpuagent_probe_gated",
            "Present while the agent does not probe: why (no_gpu, nvidia_smi_missing, "
            "driver_not_loaded); always 1.",
            "reason",
            [probe["gate"]] if probe["gate"] else [],
        ),
        _counter(
            "gpuagent_probe_spawns_total",
            "nvidia-smi processes started since the agent started.",
            float(probe["spawns_total"]),
        ),
        _gauge(
            "gpuagent_pci_gpus",
            "NVIDIA GPUs on the PCI bus, whatever driver they are bound to.",
            float(len(state["pci"])),
        ),
        _labelled(
            "gpuagent_gpu_missing",
            "A GPU bound to nvidia on the PCI bus that nvidia-smi does not report; always 1.",
            "pci_slot",
            state["missing"],
        ),
        _labelled(
            "gpuagent_agent_problem",
            "Present while the agent itself is in trouble (the state's problems): kind journal, "
            "sysfs, state_file, textfile, internal or internal_publish; always 1.",
            "kind",
            sorted(state["problems"]),
        ),
        _gauge(
            "gpuagent_interval_seconds",
            "Seconds between ticks.",
            float(state["interval"]),
        ),
        _gauge(
            "gpuagent_last_update_timestamp_seconds",
            "When the agent last wrote its state (Unix time); it does so every tick.",
            float(state["updated_at"]),
        ),
    ]
    # Only once the probe has run (answered): no series rather than a made-up 0.
    for name, value, doc in (
        (
            "gpuagent_probe_duration_seconds",
            probe["duration"],
            "How long the last nvidia-smi run took.",
        ),
        (
            "gpuagent_probe_last_success_timestamp_seconds",
            probe["last_success_at"],
            "When nvidia-smi last answered (Unix time).",
        ),
    ):
        if value is not None:
            out.append(_gauge(name, doc, float(value)))
    out.extend(_gpu_tables(state["gpus"]))
    out.append(_problems(state))
    out.append(_worst(state))
    out.append(_host(state))
    out.extend(_xids(state))
    out.extend(nvmetrics.tables(state))
    out.extend(procmetrics.tables(state))
    return out


_KINDS: dict[str, type[GaugeMetricFamily] | type[CounterMetricFamily]] = {
    "gauge": GaugeMetricFamily,
    "counter": CounterMetricFamily,
}


def _family(table: Table) -> Metric:
    """prometheus_client's family of ``table``."""
    family = _KINDS[table.kind](table.name, table.doc, labels=list(table.labels))
    for labels, value in table.rows:
        family.add_metric(list(labels), value)
    return family


def families(state: State) -> list[Metric]:
    """The series for one tick's state (:class:`gpuagent.schema.State`), each family with
    at least one."""
    return [_family(t) for t in tables(state) if t.rows]


class _One(Collector):
    """A registry's one collector: the family it is given."""

    def __init__(self) -> None:
        self.family: Metric | None = None

    def collect(self) -> Iterable[Metric]:
        return [] if self.family is None else [self.family]


def _key(table: Table) -> Hashable:
    """What ``table`` prints, compared: a zero by its text too, for -0.0 == 0.0 but prints
    "-0.0"."""
    rows = tuple((labels, value or repr(value)) for labels, value in table.rows)
    return table.kind, table.name, table.doc, table.labels, rows


class Exposition:
    """The textfile's bytes for each tick's state, each family formatted by prometheus_client.

    A family whose samples are the same as at the last render is neither made nor formatted
    again: the library's family and text for 185 samples are a sixth of an 8-GPU tick's own
    CPU (docs/performance.md), and on a quiet host most families do not change from one tick
    to the next (the GPUs' info and health, the limits and clocks, the NVLink counters
    between two reads, who is on each GPU).  Its text is the library's for the family alone:
    the library writes a registry's families one after another, so the file is byte for
    byte what one ``generate_latest`` of all of them gives."""

    def __init__(self) -> None:
        self._one = _One()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self._one)
        self._last: dict[Hashable, bytes] = {}

    def render(self, state: State) -> bytes:
        """The exposition text of ``state`` (:func:`families`)."""
        texts: dict[Hashable, bytes] = {}
        out: list[bytes] = []
        for table in tables(state):
            if not table.rows:
                continue
            key = _key(table)
            text = self._last.get(key)
            if text is None:
                self._one.family = _family(table)
                text = generate_latest(self._registry)
            texts[key] = text
            out.append(text)
        self._one.family = None
        self._last = texts
        return b"".join(out)


def render(state: State) -> str:
    """The exposition text of one tick's state (what the textfile holds)."""
    return Exposition().render(state).decode()
