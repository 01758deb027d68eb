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

from gpuagent.health import OK, UNKNOWN, Problem, worst
from gpuagent.schema import (
    ClearEntry,
    Exit,
    GpuEntry,
    NvlinkEntry,
    PciEntry,
    ProbeEntry,
    ProbeState,
    ProblemEntry,
    ProcessEntry,
    ServiceEntry,
    State,
    SXidEntry,
    XidEntry,
)
from gpuagent.statusline import Problems, status_line, with_trouble
from gpuagent.views import (
    BusView,
    KernelView,
    NvlinkGpu,
    NvlinkView,
    ProbeView,
    ProcessesView,
    ProcessView,
    SamplesView,
    ServicesView,
)

__all__ = [
    "ClearEntry",
    "Exit",
    "GpuEntry",
    "NvlinkEntry",
    "Origin",
    "PciEntry",
    "ProbeEntry",
    "ProblemEntry",
    "Problems",
    "ProcessEntry",
    "Report",
    "SXidEntry",
    "ServiceEntry",
    "State",
    "XidEntry",
    "build",
    "finished",
    "with_problems",
]


@dataclass(frozen=True)
class Report:
    """One tick's outcome: the tick's number, the status line (the agent's trouble named in
    it) and the state it writes; ``line`` is the status line without the trouble."""

    ticks: int
    status: str
    state: State
    line: str


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
        elif key == "cause" and isinstance(value, str):
            entry["cause"] = value
    if f.unit is not None:
        entry["unit"] = f.unit
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


def _nvlink(gpu: NvlinkGpu) -> NvlinkEntry:
    return {
        "links": gpu.links,
        "active": gpu.links - len(gpu.inactive),
        "inactive": list(gpu.inactive),
        "counters": {
            str(n): {_counter(name): v for name, v in values.items()}
            for n, values in sorted(gpu.counters.items())
        },
    }


def _counter(name: str) -> str:
    """``Recovery Errors`` -> ``recovery``, ``CRC Errors`` -> ``crc``."""
    return name.lower().removesuffix(" errors").replace(" ", "_")


def _process(p: ProcessView) -> ProcessEntry:
    return {
        "pid": p.pid,
        "name": p.name,
        "used_memory_mib": p.used_memory_mib,
        "unit": p.unit,
        "unit_kind": p.kind,
        "unit_ref": p.ref,
    }


def _gpus(
    bus: BusView,
    samples: SamplesView,
    kernel: KernelView,
    problems: Problems,
    *,
    nvlink: NvlinkView,
    processes: ProcessesView,
) -> list[GpuEntry]:
    """One entry per GPU known: on the bus now, seen on it before, named by nvidia-smi or by
    the kernel."""
    on_bus = {g.slot: g for g in bus.gpus}
    xids = _xids(kernel)
    slots = (set(bus.seen) | set(samples.samples) | set(problems) | set(xids)) - {""}
    out: list[GpuEntry] = []
    links = nvlink.gpus
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
        out.append(
            {
                "pci_slot": slot,
                "uuid": kernel.uuids.get(slot) or (smi_uuid if isinstance(smi_uuid, str) else None),
                "fields": fields,
                "sampled_at": s.sampled_at if s else None,
                "stale": s is not None and slot not in samples.fresh,
                "health": health,
                "problems": [_problem(p) for p in mine],
                "xids": xids.get(slot, []),
            }
        )
        if slot in links:
            out[-1]["nvlink"] = _nvlink(links[slot])
        if processes.gpus is not None and slot in processes.gpus:
            out[-1]["processes"] = [_process(p) for p in processes.gpus[slot]]
        c = kernel.cleared.get(slot)
        if c is not None and not mine:
            out[-1]["cleared"] = {"kind": c.kind, "by": c.by, "at": c.at}
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
    nvlink: NvlinkView,
    services: ServicesView,
    problems: Problems,
    processes: ProcessesView | None = None,
    trouble: Mapping[str, str],
    history: str = "this boot only",
) -> Report:
    """The report of tick ``ticks`` at wall time ``now``: ``problems`` the verdict's, by slot
    (``""``: the host; only slots with a problem), ``trouble`` the agent's own by kind."""
    line = status_line(bus, probe, samples.missing, problems, origin.interval)
    status = with_trouble(line, trouble)
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
        "gpus": _gpus(
            bus,
            samples,
            kernel,
            problems,
            nvlink=nvlink,
            processes=processes or ProcessesView(),
        ),
        "sxids": _sxids(kernel),
        "host_problems": [_problem(p) for p in problems.get("", ())],
        "missing": list(samples.missing),
        "services": {
            name: {
                "load_state": u.load_state,
                "active_state": u.active_state,
                "sub_state": u.sub_state,
                "result": u.result,
                "restarts": u.restarts,
            }
            for name, u in sorted(services.units.items())
        },
        "problems": dict(sorted(trouble.items())),
        "history": history,
    }
    return Report(ticks, status, state, line)


def with_problems(report: Report, trouble: Mapping[str, str]) -> Report:
    """``report`` with more of the agent's own trouble (the publisher's), by kind."""
    if not trouble:
        return report
    problems = dict(sorted({**report.state["problems"], **trouble}.items()))
    status = with_trouble(report.line, problems)
    state: State = {**report.state, "status": status, "problems": problems}
    return Report(report.ticks, status, state, report.line)


def finished(report: Report, reason: str, now: float) -> State:
    """The last state an agent writes, at wall time ``now``: ``exit`` says why it ended
    (``ticks``, ``signal``)."""
    return {**report.state, "updated_at": now, "exit": {"reason": reason, "at": now}}
