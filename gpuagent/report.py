"""The tick's report: the one writer of the state schema, and the status line.

:func:`build` turns the sources' views (:mod:`gpuagent.views`), the health verdict and the
agent's own trouble — the publisher's from the tick before among it — into an immutable
:class:`Report`: one :class:`~gpuagent.schema.State` a tick, which nothing changes after.
Every output is drawn from it: the Prometheus textfile and the sd_notify STATUS as it is, the
state file through :func:`stored` (the one rule by which the file differs) and, at the end,
:func:`finished`.  The state's shape is :mod:`gpuagent.schema`'s, which its readers import
(schema :data:`gpuagent.state.SCHEMA`).  Times are Unix time in seconds unless a key says
otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from gpuagent.health import OK, UNKNOWN, Problem, worst
from gpuagent.schema import (
    GpuEntry,
    NvlinkEntry,
    ProbeEntry,
    ProbeState,
    ProblemEntry,
    ProcessEntry,
    State,
    SXidEntry,
    XidEntry,
)
from gpuagent.statusline import Line, Problems, status_line, with_trouble
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

__all__ = ["STATE_FILE", "Origin", "Report", "build", "finished", "stored"]

# The publisher's trouble writing the state file: the one kind the state file never carries.
STATE_FILE = "state_file"


def _refuse(*_: object, **__: object) -> NoReturn:
    raise TypeError("a report's state does not change after its tick")


class _ReadOnlyDict(dict[str, Any]):
    """A dict that refuses every change (for ``json`` and ``==`` still a dict)."""

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse


class _ReadOnlyList(list[Any]):
    """A list that refuses every change (for ``json`` and ``==`` still a list)."""

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _refuse


_CONTAINERS = (dict, list)


def _read_only(value: Any) -> Any:
    """``value`` (what :func:`build` made: dicts, lists, scalars) copied into containers that
    refuse every change, at every depth: the same type to mypy and to the JSON writer.  What
    is read-only already is shared, not copied."""
    if isinstance(value, _ReadOnlyDict | _ReadOnlyList):
        return value
    if isinstance(value, dict):
        return _ReadOnlyDict(
            {k: _read_only(v) if isinstance(v, _CONTAINERS) else v for k, v in value.items()}
        )
    if isinstance(value, list):
        return _ReadOnlyList([_read_only(v) if isinstance(v, _CONTAINERS) else v for v in value])
    return value


@dataclass(frozen=True)
class Report:
    """One tick's outcome: the tick's number, the status line (the agent's trouble named in
    it), the state (read-only at every depth: a change raises ``TypeError``), ``line`` the
    status line's parts (to name other trouble in), and ``published`` the publisher's
    trouble the report was built with (among the state's ``problems``)."""

    ticks: int
    status: str
    state: State
    line: Line
    published: Mapping[str, str]


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


# Each GPU's links as the state has them, by the read that gave them (its NvlinkGpu, kept so
# that its id is not reused): NVLink is read one tick in several, its 18 counters a GPU are
# drawn once a read, not once a tick.
_NVLINK: dict[int, tuple[NvlinkGpu, NvlinkEntry]] = {}
_NVLINK_KEPT = 64


def _nvlink(gpu: NvlinkGpu) -> NvlinkEntry:
    kept = _NVLINK.get(id(gpu))
    if kept is not None and kept[0] is gpu:
        return kept[1]
    if len(_NVLINK) >= _NVLINK_KEPT:
        _NVLINK.clear()
    entry: NvlinkEntry = _read_only(_nvlink_entry(gpu))
    _NVLINK[id(gpu)] = (gpu, entry)
    return entry


def _nvlink_entry(gpu: NvlinkGpu) -> NvlinkEntry:
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
    published: Mapping[str, str] | None = None,
    history: str = "this boot only",
) -> Report:
    """The report of tick ``ticks`` at wall time ``now``: ``problems`` the verdict's, by slot
    (``""``: the host; only slots with a problem), ``trouble`` the agent's own by kind and
    ``published`` the publisher's as the tick before left it (``state_file``, ``textfile``,
    ``internal_publish``), both in the state's ``problems``."""
    line = status_line(bus, probe, problems, origin.interval)
    published = dict(published or {})
    trouble = {**trouble, **published}
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
    return Report(ticks, status, _read_only(state), line, _read_only(published))


def stored(report: Report, published: Mapping[str, str] | None = None) -> State:
    """What the state file gets of ``report``: its state, with the publisher's trouble
    ``published`` in place of what the report was built with (None: as built), less
    :data:`STATE_FILE`: a state file that is read could be written, so it never says it could
    not (that trouble is the textfile's and STATUS's to say)."""
    st = report.state
    kept = {k: v for k, v in st["problems"].items() if k not in report.published}
    kept.update(report.published if published is None else published)
    kept.pop(STATE_FILE, None)
    problems = dict(sorted(kept.items()))
    if problems == st["problems"]:
        return st
    return {**st, "status": with_trouble(report.line, problems), "problems": problems}


def finished(
    report: Report, reason: str, now: float, published: Mapping[str, str] | None = None
) -> State:
    """The last state an agent writes, at wall time ``now`` (:func:`stored`'s, with the
    publisher's trouble ``published`` as the run left it): ``exit`` says why it ended
    (``ticks``, ``signal``)."""
    return {**stored(report, published), "updated_at": now, "exit": {"reason": reason, "at": now}}
