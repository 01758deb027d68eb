"""The health verdict: every source's findings merged and each problem logged once (no I/O).

Sources report with :meth:`Verdict.report` (``smi`` from the probe, ``xid`` from the kernel
log); :meth:`Verdict.judge` adds the PCI bus's and the host's findings, settles them and logs
each problem's start (warning, error when critical), a change of its severity or action, and
its end (info), each with the event of its kind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from gpuagent.health import CRITICAL, Finding, Problem, Tracker
from gpuagent.logs import Event, EventLog
from gpuagent.sources.kernel import clears
from gpuagent.sources.probe import rules
from gpuagent.views import BusView, Clear

__all__ = ["Verdict"]

# Kinds with an event of their own; the others use logs.Event.problem(kind).
_EVENTS = {
    "xid": Event.XID_PROBLEM,
    "init_failed": Event.GPU_INIT_FAILED,
    "missing": Event.GPU_MISSING,
}


class Verdict:
    """Problems per GPU and the host, from every source; logs through ``log``.  A problem
    whose fault happened before ``started`` (wall s: this agent's start; a restart, an
    upgrade) is no new fault: its start is restated at info, ``still …, since 07:30:39``."""

    def __init__(self, log: EventLog, started: float = 0.0) -> None:
        self.log = log
        self.started = started
        self.tracker = Tracker()
        self._cleared: Mapping[str, Clear] = {}

    def judge(
        self,
        now: float,
        bus: BusView,
        expected_gpus: int | None,
        cleared: Mapping[str, Clear] | None = None,
    ) -> None:
        """Settle the sources at wall time ``now`` (s) with the bus as scanned and log what
        started, changed and ended; ``cleared`` is each GPU's last operator's clear (an end
        it covers says so)."""
        self._cleared = cleared or {}
        gpus = list(bus.gpus)
        # A bus that sysfs could not list says nothing about GPUs leaving it.
        if gpus or not bus.problems:
            loaded = any(g.driver is None for g in gpus) and bus.module_loaded
            found = rules.bus_findings(
                gpus,
                set(bus.seen),
                module_loaded=loaded,
                not_back=bus.not_back,
                gone_since=bus.gone_since,
            )
            for slot, wrong in rules.wrong_driver_findings(gpus).items():
                found.setdefault(slot, []).extend(wrong)
            self.tracker.report("pci", found)
        missing = bus.seen - {g.slot for g in gpus}
        # Root's clear of a gone_from_bus (it left for good) ends its share of the count.
        removed = [s for s, n in bus.removed.items() if n == expected_gpus]
        count = rules.count_findings(len(gpus), expected_gpus, missing, removed)
        self.tracker.report("host", {"": count})
        # Passthrough (vfio-pci …) is on purpose; a display driver holding the GPU is not.
        exempt = [g.slot for g in gpus if rules.deliberate(g)]
        started, ended = self.tracker.settle(now, exempt)
        # A problem with a cause (a GPU's fabric under fabricmanager_down) is the cause's to
        # say: no line of its own, nor for its uncaused self ending or starting beside it.
        quiet = {(p.slot, p.finding.kind) for p in [*started, *ended] if p.finding.caused}
        for p in started:
            if (p.slot, p.finding.kind) not in quiet:
                self._log(p, "start")
        for p in self.tracker.restated:
            if not p.finding.caused:
                self._log(p, "restated")
        for p in ended:
            if (p.slot, p.finding.kind) not in quiet:
                self._log(p, "end")

    def _log(self, p: Problem, what: str) -> None:
        f = p.finding
        where = f"GPU {p.slot}" if p.slot else "host"
        fields = {
            "pci_slot": p.slot or None,
            "problem": f.kind,
            "severity": f.severity,
            "action": f.action,
            "unit": f.unit,
            **dict(f.extra),
        }
        if what == "end":
            by = self._cleared.get(p.slot)
            if by is not None and clears.covers(by.kind, f.kind):
                at = time.strftime("%H:%M:%S", time.localtime(by.at))
                text = f"{where}: {f.name} cleared by an operator ({by.by} at {at})"
                self.log(logging.INFO, Event.PROBLEM_CLEARED, text, cleared_by=by.by, **fields)
                return
            self.log(logging.INFO, Event.PROBLEM_CLEARED, f"{where}: {f.name} cleared", **fields)
            return
        level = logging.ERROR if f.severity == CRITICAL else logging.WARNING
        event = _EVENTS.get(f.kind) or Event.problem(f.kind)
        # One shape for every problem, Xids included: GPU <slot>: <severity> <kind>: <text>;
        # action: <action>; <how it ends>.
        ends, _ = clears.ending(p.slot, f.kind, f.ends)
        text = f"{where}: {f.severity} {f.kind}: {f.message}; action: {f.action}; {ends}"
        if what == "start" and p.since < self.started:
            level, text = logging.INFO, f"{where}: still {text[len(where) + 2 :]}"
            text += f"; since {time.strftime('%H:%M:%S', time.localtime(p.since))}"
        self.log(level, event, text, **fields)

    def report(self, source: str, findings: Mapping[str, Iterable[Finding]]) -> None:
        """Replace everything ``source`` (``smi``, ``xid``, ``nvlink``, ``services``,
        ``persistence``) found with ``findings`` (by slot)."""
        self.tracker.report(source, findings)

    def problems(self) -> dict[str, list[Problem]]:
        """The problems holding, worst first, by slot (``""``: the host); only slots with one."""
        return {slot: self.tracker.problems(slot) for slot in sorted(self.tracker.slots())}
