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

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, cast

from gpuagent import __version__
from gpuagent.evidence.plan import NO_BUNDLES, Bundles
from gpuagent.health import CRITICAL, DRAIN_ASK, OK, UNKNOWN, Health
from gpuagent.schema import (
    ClearEntry,
    GpuEntry,
    NvlinkEntry,
    PciEntry,
    ProbeEntry,
    ProbeState,
    ProblemEntry,
    ProcessEntry,
    RemedyEntry,
    ServiceEntry,
    State,
    SXidEntry,
    VgpuEntry,
    XidEntry,
)
from gpuagent.sources.kernel import clears
from gpuagent.sources.nvlink.memo import ByIdentity
from gpuagent.state import SCHEMA
from gpuagent.statusline import Line, Problems, status_line, with_trouble
from gpuagent.views import (
    BusView,
    KernelView,
    NvlinkGpu,
    NvlinkView,
    PciGpu,
    ProbeView,
    Problem,
    ProcessesView,
    ProcessView,
    SamplesView,
    ServicesView,
    SXidCount,
    UnitView,
    VgpuView,
    uuid_of,
    worst,
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


_D = TypeVar("_D", bound=Mapping[str, object])
_V = TypeVar("_V")


# The state is read-only by construction: every dict and list of it is made by one of these
# two, of scalars and of containers made so (a copy of the whole after the fact was a fifth of
# a report's time).  Both keep the type to mypy and are still a dict and a list to ``json``.
def _sealed(entries: _D) -> _D:
    """``entries`` (scalars, and containers made by :func:`_sealed` or :func:`_listed`) in a
    dict that refuses every change."""
    return cast(_D, _ReadOnlyDict(entries))


def _listed(items: Iterable[_V]) -> list[_V]:
    """``items`` (scalars, and containers made by :func:`_sealed` or :func:`_listed`) in a
    list that refuses every change."""
    return _ReadOnlyList(items)


_NONE: list[Any] = _listed(())


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

    @classmethod
    def this_agent(cls, started_at: float, interval: float) -> Origin:
        """This process's: the schema :data:`gpuagent.state.SCHEMA`, its version and pid."""
        return cls(SCHEMA, __version__, os.getpid(), started_at, interval)


def _problem(p: Problem, evidence: Bundles = NO_BUNDLES) -> ProblemEntry:
    f = p.finding
    ends, latches = clears.ending(p.slot, f.kind, f.ends)
    entry: ProblemEntry = {
        "kind": f.kind,
        "severity": f.severity,
        "action": f.action,
        "message": f.message,
        "since": p.since,
        "ends": ends,
        "latches": latches,
    }
    for key, value in f.extra:
        if key == "xid" and isinstance(value, int):
            entry["xid"] = value
        elif key == "cause" and isinstance(value, str):
            entry["cause"] = value
        elif key == "pcie_device" and isinstance(value, str):
            entry["pcie_device"] = value
    if f.unit is not None:
        entry["unit"] = f.unit
    if f.unread is not None:
        entry["unread_since"], entry["unread"] = f.unread
    # The bundle root gathered for a critical problem, where it did.
    bundle = evidence.since(p.slot, p.since) if f.severity == CRITICAL else None
    if bundle is not None:
        entry["evidence"] = bundle
    return _sealed(entry)


def _xids(kernel: KernelView) -> dict[str, list[XidEntry]]:
    out: dict[str, list[XidEntry]] = {}
    for (slot, code), c in sorted(kernel.xids.items()):
        entry: XidEntry = {
            "xid": code,
            "count": c.count,
            "first": c.first,
            "last": c.last,
            "name": c.info.name,
            "severity": c.info.severity,
            "action": c.info.action,
        }
        out.setdefault(slot, []).append(_sealed(entry))
    return {slot: _listed(entries) for slot, entries in out.items()}


def _sxids(kernel: KernelView) -> list[SXidEntry]:
    return _listed(_sxid(slot, code, c) for (slot, code), c in sorted(kernel.sxids.items()))


def _sxid(slot: str, code: int, c: SXidCount) -> SXidEntry:
    entry: SXidEntry = {
        "pci_slot": slot,
        "sxid": code,
        "count": c.count,
        "first": c.first,
        "last": c.last,
        "fatal": c.fatal,
    }
    return _sealed(entry)


def _nvlink_entry(gpu: NvlinkGpu) -> NvlinkEntry:
    entry: NvlinkEntry = {
        "links": gpu.links,
        "active": gpu.links - len(gpu.inactive),
        "inactive": _listed(gpu.inactive),
        "counters": _sealed(
            {
                str(n): _sealed({_counter(name): v for name, v in values.items()})
                for n, values in sorted(gpu.counters.items())
            }
        ),
    }
    return _sealed(entry)


# Each GPU's links as the state has them, by the read that gave them (its NvlinkGpu): NVLink
# is read one tick in several, its 18 counters a GPU are drawn once a read, not once a tick.
_nvlink = ByIdentity(_nvlink_entry)


def _counter(name: str) -> str:
    """``Recovery Errors`` -> ``recovery``, ``CRC Errors`` -> ``crc``."""
    return name.lower().removesuffix(" errors").replace(" ", "_")


def _process(p: ProcessView) -> ProcessEntry:
    entry: ProcessEntry = {
        "pid": p.pid,
        "name": p.name,
        "used_memory_mib": p.used_memory_mib,
        "unit": p.unit,
        "unit_kind": p.kind,
        "unit_ref": p.ref,
    }
    return _sealed(entry)


def _gpus(
    bus: BusView,
    samples: SamplesView,
    kernel: KernelView,
    problems: Problems,
    *,
    nvlink: NvlinkView,
    processes: ProcessesView,
    vgpu: VgpuView,
    evidence: Bundles,
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
        health = worst(p.finding for p in mine if p.finding.unread is None)
        # A problem held as last seen (its source cannot look): unknown, unless what was read
        # is critical anyway.  Bound to another driver on purpose: ok; else ok only with a
        # fresh sample.
        if health is not Health.CRITICAL and any(p.finding.unread for p in mine):
            health = UNKNOWN
        elif health == OK and (gpu is None or gpu.probeable):
            health = OK if slot in samples.fresh else UNKNOWN
        fields = s.fields if s else {}
        entry: GpuEntry = {
            "pci_slot": slot,
            "uuid": uuid_of(slot, kernel, samples),
            # A sample's fields are scalars: a copy is theirs sealed.
            "fields": _sealed(fields),
            "sampled_at": s.sampled_at if s else None,
            "stale": s is not None and slot not in samples.fresh,
            "health": health,
            "problems": _listed(_problem(p, evidence) for p in mine),
            "xids": xids.get(slot, _NONE),
        }
        if slot in links:
            entry["nvlink"] = _nvlink(links[slot])
            if slot in nvlink.stale:
                stale: NvlinkEntry = {**entry["nvlink"], "stale": True}
                entry["nvlink"] = _sealed(stale)
        if processes.gpus is not None and slot in processes.gpus:
            entry["processes"] = _listed(_process(p) for p in processes.gpus[slot])
            if slot in processes.stale:
                entry["processes_stale"] = True
        licence = vgpu.gpus.get(slot)
        if licence is not None:
            lic: VgpuEntry = {
                "mode": licence.mode,
                "product": licence.product,
                "license_status": licence.status,
            }
            entry["vgpu"] = _sealed(lic)
        c = kernel.cleared.get(slot)
        if c is not None and not mine:
            cleared: ClearEntry = {"kind": c.kind, "by": c.by, "at": c.at}
            entry["cleared"] = _sealed(cleared)
        out.append(_sealed(entry))
    return _listed(out)


def _probe(probe: ProbeView) -> ProbeEntry:
    gated = probe.state in (ProbeState.GATED, ProbeState.IDLE)
    entry: ProbeEntry = {
        "state": probe.state,
        "gate": probe.gate,
        "failure_class": probe.failure.value if probe.failure else None,
        "consecutive_failures": probe.failures,
        "next_probe_in_ticks": None if gated else probe.next_in_ticks,
        "spawns_total": probe.spawns_total,
        "last_error": probe.last_error,
        "last_success_at": probe.last_success_at,
        "fields": _listed(probe.fields),
        "duration": probe.duration,
    }
    return _sealed(entry)


def _pci(g: PciGpu) -> PciEntry:
    entry: PciEntry = {
        "slot": g.slot,
        "device_id": g.device_id,
        "class": g.pci_class,
        "driver": g.driver,
    }
    return _sealed(entry)


def _service(u: UnitView) -> ServiceEntry:
    entry: ServiceEntry = {
        "load_state": u.load_state,
        "active_state": u.active_state,
        "sub_state": u.sub_state,
        "result": u.result,
        "restarts": u.restarts,
    }
    return _sealed(entry)


def _remedy(cure: RemedyEntry | None) -> RemedyEntry | None:
    if cure is None:
        return None
    entry: RemedyEntry = {
        **cure,
        "fixes": _listed(cure["fixes"]),
        "leaves": _listed(cure["leaves"]),
    }
    return _sealed(entry)


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
    vgpu: VgpuView | None = None,
    trouble: Mapping[str, str],
    published: Mapping[str, str] | None = None,
    history: str = "this boot only",
    evidence: Bundles = NO_BUNDLES,
    drain: str = DRAIN_ASK,
) -> Report:
    """The report of tick ``ticks`` at wall time ``now``: ``problems`` the verdict's, by slot
    (``""``: the host; only slots with a problem), ``trouble`` the agent's own by kind and
    ``published`` the publisher's as the tick before left it (``state_file``, ``textfile``,
    ``internal_publish``), both in the state's ``problems``; ``evidence`` the bundles root
    gathered, which a GPU's critical problem names; ``drain`` the config's, for the
    scheduler's hooks."""
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
        "remedy": _remedy(line.remedy),
        "drain": drain,
        "pci": _listed(_pci(g) for g in bus.gpus),
        "probe": _probe(probe),
        "gpus": _gpus(
            bus,
            samples,
            kernel,
            problems,
            nvlink=nvlink,
            processes=processes or ProcessesView(),
            vgpu=vgpu or VgpuView(),
            evidence=evidence,
        ),
        "sxids": _sxids(kernel),
        "host_problems": _listed(_problem(p) for p in problems.get("", ())),
        "missing": _listed(samples.missing),
        "services": _sealed({name: _service(u) for name, u in sorted(services.units.items())}),
        "problems": _sealed(dict(sorted(trouble.items()))),
        "history": history,
    }
    return Report(ticks, status, _sealed(state), line, _sealed(published))


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
