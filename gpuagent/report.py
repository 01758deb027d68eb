"""The tick's report: the one writer of the state schema, and the status line.

:func:`build` turns the sources' views (:mod:`gpuagent.views`) and the health verdict into an
immutable :class:`Report`; every output — the state file, the Prometheus textfile, the
sd_notify STATUS — is drawn from it.  The state's shape is the :class:`State` TypedDict that
``gpuagent status`` and the metrics read (schema :data:`gpuagent.state.SCHEMA`).  Times are
Unix time in seconds unless a key says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from .health import OK, UNKNOWN, Problem, worst
from .smi import Value
from .statusline import Problems, status_line
from .views import BusView, KernelView, ProbeState, ProbeView, SamplesView

__all__ = [
    "ClearEntry",
    "Exit",
    "GpuEntry",
    "Origin",
    "PciEntry",
    "ProbeEntry",
    "ProblemEntry",
    "Problems",
    "Report",
    "SXidEntry",
    "State",
    "XidEntry",
    "build",
    "finished",
    "status_line",
    "with_problems",
]


class ProblemEntry(TypedDict):
    """A problem on a GPU or the host: ``severity`` warning or critical, ``action`` one of
    :data:`gpuagent.health.ACTIONS`, ``since`` when it started; ``xid`` for kind ``xid``."""

    kind: str
    severity: str
    action: str
    message: str
    since: float
    xid: NotRequired[int]


class XidEntry(TypedDict):
    """One Xid code counted on a GPU this boot: ``first`` and ``last`` record's time,
    ``severity`` none, warning or critical."""

    xid: int
    count: int
    first: float
    last: float
    name: str
    severity: str
    action: str


class SXidEntry(TypedDict):
    """One SXid code counted on an NVSwitch (its slot, or ``nvswitchN``) this boot."""

    pci_slot: str
    sxid: int
    count: int
    first: float
    last: float
    fatal: bool


class ClearEntry(TypedDict):
    """An operator's clear of ``kind`` (``all``: every latching kind) ``by`` a user ``at``."""

    kind: str
    by: str
    at: float


class GpuEntry(TypedDict):
    """One GPU the agent knows: its last sample's ``fields`` by nvidia-smi query field (empty
    without one), when it was taken, whether it is ``stale``, its ``health`` (ok, warning,
    critical, unknown), problems and Xid counts; ``cleared`` the last operator's clear while
    the GPU has no problem since."""

    pci_slot: str
    uuid: str | None
    fields: dict[str, Value]
    sampled_at: float | None
    stale: bool
    health: str
    problems: list[ProblemEntry]
    xids: list[XidEntry]
    cleared: NotRequired[ClearEntry]


# "class" is a keyword: the functional form.
PciEntry = TypedDict(
    "PciEntry", {"slot": str, "device_id": str, "class": str, "driver": str | None}
)


class ProbeEntry(TypedDict):
    """The probe: ``state`` (:class:`~gpuagent.views.ProbeState`), ``gate`` while one holds,
    the failing probe's ``failure_class``, ``next_probe_in_ticks`` (None while gated),
    ``duration`` of the last run (s)."""

    state: str
    gate: str | None
    failure_class: str | None
    consecutive_failures: int
    next_probe_in_ticks: int | None
    spawns_total: int
    last_error: str | None
    last_success_at: float | None
    fields: list[str]
    duration: float | None


class Exit(TypedDict):
    """How the agent ended: ``reason`` ``ticks`` (ran the ticks asked for) or ``signal``."""

    reason: str
    at: float


class State(TypedDict):
    """The state file.  ``problems`` is the agent's own trouble (``sysfs``, ``journal``,
    ``textfile``, ``internal`` …), by kind; ``missing`` the GPUs bound to nvidia that
    nvidia-smi does not report; ``history`` what is known of the earlier boots (reading
    earlier boots, this boot only, N earlier boots)."""

    schema: int
    version: str
    pid: int
    started_at: float
    updated_at: float
    ticks: int
    interval: float
    exit: Exit | None
    status: str
    pci: list[PciEntry]
    probe: ProbeEntry
    gpus: list[GpuEntry]
    sxids: list[SXidEntry]
    host_problems: list[ProblemEntry]
    missing: list[str]
    problems: dict[str, str]
    history: str


@dataclass(frozen=True)
class Report:
    """One tick's outcome: the tick's number, the status line and the state it writes."""

    ticks: int
    status: str
    state: State


@dataclass(frozen=True)
class Origin:
    """Who reports: schema, version, pid, start time (s) and the tick interval (s)."""

    schema: int
    version: str
    pid: int
    started_at: float
    interval: float


def _problem(p: Problem) -> ProblemEntry:
    f = p.finding
    entry: ProblemEntry = {
        "kind": f.kind,
        "severity": f.severity,
        "action": f.action,
        "message": f.message,
        "since": p.since,
    }
    for key, value in f.extra:
        if key == "xid" and isinstance(value, int):
            entry["xid"] = value
    return entry


def _xids(kernel: KernelView) -> dict[str, list[XidEntry]]:
    out: dict[str, list[XidEntry]] = {}
    for (slot, code), c in sorted(kernel.xids.items()):
        out.setdefault(slot, []).append(
            {
                "xid": code,
                "count": c.count,
                "first": c.first,
                "last": c.last,
                "name": c.info.name,
                "severity": c.info.severity,
                "action": c.info.action,
            }
        )
    return out


def _sxids(kernel: KernelView) -> list[SXidEntry]:
    return [
        {
            "pci_slot": slot,
            "sxid": code,
            "count": c.count,
            "first": c.first,
            "last": c.last,
            "fatal": c.fatal,
        }
        for (slot, code), c in sorted(kernel.sxids.items())
    ]


def _gpus(
    bus: BusView, samples: SamplesView, kernel: KernelView, problems: Problems
) -> list[GpuEntry]:
    """One entry per GPU known: on the bus now, seen on it before, named by nvidia-smi or by
    the kernel."""
    on_bus = {g.slot: g for g in bus.gpus}
    xids = _xids(kernel)
    slots = (set(bus.seen) | set(samples.samples) | set(problems) | set(xids)) - {""}
    out: list[GpuEntry] = []
    for slot in sorted(slots):
        s = samples.samples.get(slot)
        mine = problems.get(slot, ())
        gpu = on_bus.get(slot)
        health = worst(p.finding for p in mine)
        # Bound to another driver on purpose: ok; else ok only with a fresh sample.
        if health == OK and (gpu is None or gpu.probeable):
            health = OK if slot in samples.fresh else UNKNOWN
        fields = s.fields if s else {}
        smi_uuid = fields.get("uuid")
        entry: GpuEntry = {
            "pci_slot": slot,
            "uuid": kernel.uuids.get(slot) or (smi_uuid if isinstance(smi_uuid, str) else None),
            "fields": fields,
            "sampled_at": s.sampled_at if s else None,
            "stale": s is not None and slot not in samples.fresh,
            "health": health,
            "problems": [_problem(p) for p in mine],
            "xids": xids.get(slot, []),
        }
        c = kernel.cleared.get(slot)
        if c is not None and not mine:
            entry["cleared"] = {"kind": c.kind, "by": c.by, "at": c.at}
        out.append(entry)
    return out


def _probe(probe: ProbeView) -> ProbeEntry:
    gated = probe.state in (ProbeState.GATED, ProbeState.IDLE)
    return {
        "state": probe.state,
        "gate": probe.gate,
        "failure_class": probe.failure.value if probe.failure else None,
        "consecutive_failures": probe.failures,
        "next_probe_in_ticks": None if gated else probe.next_in_ticks,
        "spawns_total": probe.spawns_total,
        "last_error": probe.last_error,
        "last_success_at": probe.last_success_at,
        "fields": list(probe.fields),
        "duration": probe.duration,
    }


def build(
    origin: Origin,
    *,
    now: float,
    ticks: int,
    bus: BusView,
    probe: ProbeView,
    samples: SamplesView,
    kernel: KernelView,
    problems: Problems,
    trouble: Mapping[str, str],
    history: str = "this boot only",
) -> Report:
    """The report of tick ``ticks`` at wall time ``now``: ``problems`` the verdict's, by slot
    (``""``: the host; only slots with a problem), ``trouble`` the agent's own by kind."""
    status = status_line(bus, probe, samples.missing, problems, origin.interval)
    state: State = {
        "schema": origin.schema,
        "version": origin.version,
        "pid": origin.pid,
        "started_at": origin.started_at,
        "updated_at": now,
        "ticks": ticks,
        "interval": origin.interval,
        "exit": None,
        "status": status,
        "pci": [
            {"slot": g.slot, "device_id": g.device_id, "class": g.pci_class, "driver": g.driver}
            for g in bus.gpus
        ],
        "probe": _probe(probe),
        "gpus": _gpus(bus, samples, kernel, problems),
        "sxids": _sxids(kernel),
        "host_problems": [_problem(p) for p in problems.get("", ())],
        "missing": list(samples.missing),
        "problems": dict(sorted(trouble.items())),
        "history": history,
    }
    return Report(ticks, status, state)


def with_problems(report: Report, trouble: Mapping[str, str]) -> Report:
    """``report`` with more of the agent's own trouble (the publisher's), by kind."""
    if not trouble:
        return report
    problems = dict(sorted({**report.state["problems"], **trouble}.items()))
    return Report(report.ticks, report.status, {**report.state, "problems": problems})


def finished(report: Report, reason: str, now: float) -> State:
    """The last state an agent writes, at wall time ``now``: ``exit`` says why it ended
    (``ticks``, ``signal``)."""
    return {**report.state, "updated_at": now, "exit": {"reason": reason, "at": now}}
