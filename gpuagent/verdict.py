"""The health verdict: every source's findings merged and each problem logged once (no I/O).

Sources report with :meth:`Verdict.report` (``smi`` from the probe, ``xid`` from the kernel
log); :meth:`Verdict.judge` adds the PCI bus's and the host's findings, settles them and logs
each problem's start (warning, error when critical), a change of its severity or action, and
its end (info), each with the event of its kind; of a problem that its source's own line
tells (an outage's: :attr:`gpuagent.views.Finding.told`), only the change.  The problems
the agent before a restart left open (:mod:`gpuagent.held`) hold from the first tick with
their first ``since``, restated at info with an event of their own (``still_holds``: no new
start), until their source has had a complete look of its own.  No read, no change: what a
source found on a slot it cannot read now holds as last seen, marked unread, until a read
shows its cause gone or root clears it (:meth:`Verdict.report`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from gpuagent.health import CRITICAL
from gpuagent.held import Held, by_source
from gpuagent.logs import Event, EventLog
from gpuagent.sources import EVERY, Unread
from gpuagent.sources.kernel import clears
from gpuagent.sources.kernel.drivercatalog import Cause
from gpuagent.sources.probe import outage, rules
from gpuagent.views import BusView, Clear, Finding, PciGpu, Problem

__all__ = ["KINDS", "Tracker", "Verdict"]

# Kinds with an event of their own; the others use logs.Event.problem(kind).
_EVENTS = {
    "xid": Event.XID_PROBLEM,
    "init_failed": Event.GPU_INIT_FAILED,
    "missing": Event.GPU_MISSING,
}
# Every kind of problem there is (gpuagent-problems(7) lists them): those with an event of
# their own, the probe's outages (told by its own lines) and every other kind, which
# Event.problem names (a kind without its PROBLEM_ event cannot be logged).
KINDS = frozenset(
    {
        *_EVENTS,
        *outage.KINDS,
        *(
            e.name.removeprefix("PROBLEM_").lower()
            for e in Event
            if e.name.startswith("PROBLEM_") and e is not Event.PROBLEM_CLEARED
        ),
    }
)


# The findings a source reported before the restart hold under this name until it has had a
# complete look of its own.
_BEFORE = "before the restart: "
Key = tuple[str, tuple[str, tuple[tuple[str, int | str], ...]]]


class Verdict:
    """Problems per GPU and the host, from every source; logs through ``log``.  A problem
    whose fault happened before ``started`` (wall s: this agent's start) says when,
    ``…; since 07:30:39``, at its own severity: no agent told it.  ``held`` are the problems
    the agent before this one left open this boot (told already): restated at info at the
    first :meth:`judge`, ``still …, seen before the restart``, with the event
    ``still_holds``."""

    def __init__(self, log: EventLog, started: float = 0.0, held: Iterable[Held] = ()) -> None:
        self.log = log
        self.started = started
        self.tracker = Tracker()
        self._cleared: Mapping[str, Clear] = {}
        self._uuid: Callable[[str], str | None] = lambda slot: None
        # When each (source, slot) was last read with something found there (wall s), and
        # those read this tick, stamped at its judge: the "not read since" of what holds dark.
        self._read_at: dict[tuple[str, str], float] = {}
        self._reading: set[tuple[str, str]] = set()
        self._judged: float | None = None
        # Each remembered problem's first-seen time by its source, until that source's first
        # complete look; the problems the first judge restates as seen before the restart.
        self._before: dict[str, dict[Key, float]] = {}
        for source, found in by_source(held).items():
            self.tracker.report(_BEFORE + source, found)
            self._before[source] = {
                (slot, f.key): f.at for slot, fs in found.items() for f in fs if f.at is not None
            }
        self._restating = {k for before in self._before.values() for k in before}

    def judge(
        self,
        now: float,
        bus: BusView,
        expected_gpus: int | None,
        cleared: Mapping[str, Clear] | None = None,
        *,
        uuid: Callable[[str], str | None] = lambda slot: None,
        serial: Callable[[str], str | None] = lambda slot: None,
        causes: Mapping[str, Cause] | None = None,
    ) -> None:
        """Settle the sources at wall time ``now`` (s) with the bus as scanned and log what
        started, changed and ended; ``cleared`` is each GPU's last operator's clear (an end
        it covers says so), ``uuid`` a GPU's UUID by slot (its lines' ``GPU_UUID``: the
        board's story in ``gpuagent history``, whatever slot it was in) and ``serial`` its
        board's serial number (with the UUID, what tells a board back after an RMA), and
        ``causes`` the driver's own words on why it could not take a GPU, by slot (a GPU
        bound to no driver says so)."""
        self._cleared = cleared or {}
        self._uuid = uuid
        for read in self._reading:
            self._read_at[read] = now
        self._reading.clear()
        self._judged = now
        gpus = list(bus.gpus)
        away = bus.seen - {g.slot for g in gpus}
        waiting, moved = _not_gone(gpus, away, bus.boards, uuid) if away else (set(), set())
        # A bus that sysfs could not list says nothing about GPUs leaving it.
        if gpus or not bus.problems:
            loaded = any(g.driver is None for g in gpus) and bus.module_loaded
            found = rules.bus_findings(
                gpus,
                set(bus.seen) - waiting - moved,
                module_loaded=loaded,
                not_back=bus.not_back,
                gone_since=bus.gone_since,
                causes=causes,
            )
            for slot, wrong in rules.wrong_driver_findings(gpus).items():
                found.setdefault(slot, []).extend(wrong)
            self.report("pci", found)
        missing = away - moved
        # Root's clear of a gone_from_bus (it left for good) ends its share of the count.
        removed = [s for s, n in bus.removed.items() if n == expected_gpus]
        count = rules.count_findings(len(gpus), expected_gpus, missing, removed)
        self.report("host", {"": count})
        # Passthrough (vfio-pci …) is on purpose; a display driver holding the GPU is not.
        exempt = [g.slot for g in gpus if rules.deliberate(g)]
        # A board back after an RMA (its UUID, or its serial after a repair that gave it
        # another GPU): each of its problems says so.
        notes: dict[str, str] = {}
        for g in gpus if bus.departed else ():
            keys = ((uuid(g.slot) or "").lower(), serial(g.slot) or "")
            note = next((bus.departed[k] for k in keys if k and k in bus.departed), None)
            if note is not None:
                notes[g.slot] = note
        started, ended = self.tracker.settle(now, exempt, notes)
        # A problem with a cause (a GPU's fabric under fabricmanager_down) is the cause's to
        # say: no line of its own, nor for its uncaused self ending or starting beside it.
        # One told by its source's own line (an outage's) has no start or end line here.
        quiet = {(p.slot, p.finding.kind) for p in [*started, *ended] if p.finding.caused}
        for p in started:
            if (p.slot, p.finding.kind) not in quiet and not p.finding.told:
                self._log(p, "start")
        for p in self.tracker.restated:
            if not p.finding.caused:
                self._log(p, "restated")
        for p in ended:
            if (p.slot, p.finding.kind) not in quiet and not p.finding.told:
                self._log(p, "end")
        self._restating = set()

    def _log(self, p: Problem, what: str) -> None:
        f = p.finding
        where = f"GPU {p.slot}" if p.slot else "host"
        fields = {
            "pci_slot": p.slot or None,
            "gpu_uuid": self._uuid(p.slot) if p.slot else None,
            "problem": f.kind,
            "severity": f.severity,
            "action": f.action,
            "unit": f.unit,
            **dict(f.extra),
        }
        if what == "end":
            by = self._cleared.get(p.slot)
            unread = f.unread is not None and self._cleared_unread(p.slot, f.kind, f.unread[0])
            if by is not None and (clears.covers(by.kind, f.kind) or unread):
                at = time.strftime("%H:%M:%S", time.localtime(by.at))
                text = f"{where}: {f.name} cleared by an operator ({by.by} at {at})"
                self.log(logging.INFO, Event.PROBLEM_CLEARED, text, cleared_by=by.by, **fields)
                return
            # A lapse says why it ended: no record for its hold, nobody's repair.
            said = f"{f.name}: {f.lapse}; ended" if f.lapse else f"{f.name} cleared"
            self.log(logging.INFO, Event.PROBLEM_CLEARED, f"{where}: {said}", **fields)
            return
        level = logging.ERROR if f.severity == CRITICAL else logging.WARNING
        event = _EVENTS.get(f.kind) or Event.problem(f.kind)
        # One shape for every problem, Xids included: GPU <slot>: <severity> <kind>: <text>;
        # action: <action>; <how it ends>.
        ends, _ = clears.ending(p.slot, f.kind, f.ends)
        text = f"{where}: {f.severity} {f.kind}: {f.message}; action: {f.action}; {ends}"
        # First told at its own severity, whatever its record's time (a boot-time Xid, one
        # logged while the service was down): only what an earlier agent of this boot told
        # (problems.json) is restated, at info.
        again = what == "start" and (p.slot, f.key) in self._restating
        if again:
            level, event = logging.INFO, Event.STILL_HOLDS
            text = f"{where}: still {text[len(where) + 2 :]}"
        if what == "start" and (again or p.since < self.started):
            text += f"; since {time.strftime('%H:%M:%S', time.localtime(p.since))}"
        if again:
            text += ", seen before the restart"
        self.log(level, event, text, **fields)

    def report(
        self,
        source: str,
        findings: Mapping[str, Iterable[Finding]],
        *,
        complete: bool = True,
        unread: Unread | None = None,
    ) -> None:
        """Replace everything ``source`` (``smi``, ``xid``, ``nvlink``, ``services``,
        ``persistence``) found with ``findings`` (by slot); ``complete``: the source had a
        whole look (not a boot's records read in part), so what it found before the restart
        and does not find now ends, and what it finds again keeps its first ``since``.

        ``unread``: the slots (:data:`~gpuagent.sources.EVERY`: all) ``source`` could not
        read this time, each with why.  No read, no change: what it found there at its last
        read holds, marked :attr:`Finding.unread` (the GPU's health is then unknown), beside
        anything ``findings`` has for the slot; a slot read ends what it no longer finds."""
        if unread:
            findings = self._dark(source, findings, unread)
            complete = False
        else:
            self._reading.update((source, slot) for slot, fs in findings.items() if fs)
        before = self._before.pop(source, None) if complete else None
        if before is not None:
            self.tracker.report(_BEFORE + source, {})
            findings = {
                slot: [_dated(f, before.get((slot, f.key))) for f in fs]
                for slot, fs in findings.items()
            }
        self.tracker.report(source, findings)

    def _dark(
        self, source: str, findings: Mapping[str, Iterable[Finding]], unread: Unread
    ) -> dict[str, list[Finding]]:
        """``findings``, and on each slot of ``unread`` what ``source`` last found there and
        does not find now, held as last seen.  (What it held before the restart holds as
        such until its first complete look.)"""
        out = {slot: list(fs) for slot, fs in findings.items()}
        self._reading.update(
            (source, slot) for slot, fs in out.items() if fs and _why(unread, slot) is None
        )
        for slot, fs in self.tracker.found(source).items():
            why = _why(unread, slot)
            if why is None:
                continue
            kept = out.setdefault(slot, [])
            new = {f.key for f in kept}
            at = self._read_at.get((source, slot), self._judged)
            for f in fs:
                first = f.unread[0] if f.unread else at
                first = first if first is not None else 0.0
                # Root's clear of it since it was last read ends it (nothing else can).
                if f.key not in new and not self._cleared_unread(slot, f.kind, first):
                    kept.append(replace(f, unread=(first, why)))
        return out

    def _cleared_unread(self, slot: str, kind: str, since: float) -> bool:
        """Whether root cleared ``kind`` on ``slot`` (by its name) since ``since`` (wall s,
        when it was last read): the one end of a problem held unread besides a read."""
        by = self._cleared.get(slot)
        return by is not None and by.kind == kind and by.at >= since

    def held(self) -> list[Held]:
        """The problems open now, each with the source that reports it (what
        :class:`gpuagent.held.HeldProblems` remembers)."""
        out: list[Held] = []
        for slot in sorted(self.tracker.slots()):
            for p in self.tracker.problems(slot):
                source = (self.tracker.reporter(p) or "").removeprefix(_BEFORE)
                out.append(Held(source, slot, p.finding, p.since))
        return out

    def problems(self) -> dict[str, list[Problem]]:
        """The problems holding, worst first, by slot (``""``: the host); only slots with one."""
        return {slot: self.tracker.problems(slot) for slot in sorted(self.tracker.slots())}


def _not_gone(
    gpus: Iterable[PciGpu],
    away: Iterable[str],
    boards: Mapping[str, str],
    uuid: Callable[[str], str | None],
) -> tuple[set[str], set[str]]:
    """Of the slots seen that are ``away`` from the bus now, those not to be called gone: the
    ones whose remembered board (``boards``) may be a GPU in a slot that had none and has not
    said its UUID yet (no tick judges a board before its identity is read), and the ones
    whose board answers in another slot (the bus renumbered)."""
    gpus = list(gpus)
    remembered = {s for s in away if s in boards}
    unread = any(g.probeable and g.slot not in boards and uuid(g.slot) is None for g in gpus)
    here = {u.lower() for g in gpus if (u := uuid(g.slot))}
    moved = {s for s in remembered if boards[s].lower() in here}
    return (remembered if unread else set()), moved


def _why(unread: Unread, slot: str) -> str | None:
    """Why ``slot`` was not read (``unread``'s word for it, or for every slot), or None
    where it was (``""``: a slot read, whatever :data:`EVERY` says)."""
    return unread.get(slot, unread.get(EVERY)) or None


def _dated(f: Finding, first: float | None) -> Finding:
    """``f`` dated no later than ``first``, its first-seen time before the restart."""
    if first is None:
        return f
    return replace(f, at=first if f.at is None else min(f.at, first))


class Tracker:
    """Problems from several sources (``smi``, ``pci``, ``xid`` …), each problem's start and end.

    Each source calls :meth:`report` with all it currently finds, ``{slot: [Finding, ...]}``;
    a source's findings hold until it reports again.  :meth:`settle` then merges them: a
    problem (slot and :attr:`Finding.key`) seen by any source holds; its ``since`` is the time
    of the first :meth:`settle` that saw it.  :attr:`restated` lists the problems whose
    severity or action the last :meth:`settle` changed (a Nonfatal NVLink Xid turned Fatal).
    """

    def __init__(self) -> None:
        self._sources: dict[str, dict[str, list[Finding]]] = {}
        self._open: dict[tuple[str, tuple[str, tuple[tuple[str, int | str], ...]]], Problem] = {}
        self.restated: list[Problem] = []

    def report(self, source: str, findings: Mapping[str, Iterable[Finding]]) -> None:
        """Replace everything ``source`` found with ``findings`` (by slot)."""
        self._sources[source] = {slot: list(fs) for slot, fs in findings.items()}

    def found(self, source: str) -> dict[str, list[Finding]]:
        """What ``source`` reported last, by slot (a copy)."""
        return {slot: list(fs) for slot, fs in self._sources.get(source, {}).items()}

    def settle(
        self, now: float, exempt: Iterable[str] = (), notes: Mapping[str, str] | None = None
    ) -> tuple[list[Problem], list[Problem]]:
        """Merge the sources at wall time ``now`` (s); returns the problems that started and
        those that ended, in slot order.  Slots in ``exempt`` (a GPU bound to another driver
        on purpose) have no problems; each problem of a slot in ``notes`` ends its message
        with the slot's note (a board back after an RMA)."""
        skip = set(exempt)
        current: dict[tuple[str, tuple[str, tuple[tuple[str, int | str], ...]]], Finding] = {}
        for findings in self._sources.values():
            for slot, fs in findings.items():
                if slot in skip:
                    continue
                note = (notes or {}).get(slot)
                for f in fs:
                    said = f if note is None else replace(f, message=f"{f.message}; {note}")
                    current.setdefault((slot, f.key), said)
        started: list[Problem] = []
        self.restated = []
        ended = [p for key, p in self._open.items() if key not in current]
        for key in [k for k in self._open if k not in current]:
            del self._open[key]
        for key, f in current.items():
            old = self._open.get(key)
            if old is None:
                since = now if f.at is None else min(now, f.at)
                self._open[key] = Problem(key[0], f, since)
                started.append(self._open[key])
            elif old.finding != f:
                # Same problem, new wording (another throttle reason): no new start.
                self._open[key] = Problem(key[0], f, old.since)
                was = old.finding
                if (was.severity, was.action) != (f.severity, f.action):
                    self.restated.append(self._open[key])
        self.restated.sort(key=_slot_order)
        return sorted(started, key=_slot_order), sorted(ended, key=_slot_order)

    def problems(self, slot: str) -> list[Problem]:
        """The problems holding on ``slot``, worst first (:func:`rank`): the first one's
        action is the one that applies."""
        mine = [p for (s, _), p in self._open.items() if s == slot]
        return sorted(mine, key=lambda p: p.rank)

    def slots(self) -> set[str]:
        """Every slot with a problem (``""`` for the host)."""
        return {s for s, _ in self._open}

    def reporter(self, p: Problem) -> str | None:
        """The source whose findings hold ``p`` (the first to report it, as :meth:`settle`
        takes it), or None."""
        for source, findings in self._sources.items():
            if any(f.key == p.finding.key for f in findings.get(p.slot, ())):
                return source
        return None


def _slot_order(p: Problem) -> tuple[str, str]:
    return p.slot, p.finding.kind
