"""The health verdict: every source's findings merged, each problem logged once, and the
state's one entry per GPU.

Sources report into :attr:`Verdict.tracker` (``smi`` from the probe, ``xid`` from the kernel
log); :meth:`Verdict.judge` adds the PCI bus's and the host's findings, settles them and logs
each problem's start (warning, error when critical), a change of its severity or action, and
its end (info), each with the event of its kind.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import pci, rules
from .health import CRITICAL, OK, UNKNOWN, Problem, Tracker, worst
from .logs import Event, EventLog

if TYPE_CHECKING:
    from .agent import Sample

__all__ = ["Verdict"]

# Kinds with an event of their own; the others use logs.Event.problem(kind).
_EVENTS = {"xid": Event.XID_PROBLEM, "init_failed": Event.GPU_INIT_FAILED}


class Verdict:
    """Problems per GPU and the host, from every source; logs through ``log``."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.tracker = Tracker()

    def judge(
        self,
        now: float,
        gpus: list[pci.PciGpu],
        seen_on_bus: set[str],
        *,
        bus_listed: bool,
        sysfs_root: str,
        expected_gpus: int | None,
    ) -> None:
        """Settle the sources at wall time ``now`` (s) with the bus as scanned (``gpus``;
        ``bus_listed`` False: sysfs could not be listed) and log what started and ended."""
        # A bus that could not be listed at all says nothing about GPUs leaving it.
        if gpus or bus_listed:
            unbound = any(g.driver is None for g in gpus)
            loaded = unbound and pci.module_loaded(sysfs_root)
            self.tracker.report("pci", rules.bus_findings(gpus, seen_on_bus, module_loaded=loaded))
        self.tracker.report("host", {"": rules.count_findings(len(gpus), expected_gpus)})
        exempt = [g.slot for g in gpus if not g.probeable]
        started, ended = self.tracker.settle(now, exempt)
        for p in started:
            self._log(p, "start")
        for p in self.tracker.restated:
            self._log(p, "restated")
        for p in ended:
            self._log(p, "end")

    def _log(self, p: Problem, what: str) -> None:
        f = p.finding
        where = f"GPU {p.slot}" if p.slot else "host"
        fields = {
            "pci_slot": p.slot or None,
            "problem": f.kind,
            "severity": f.severity,
            "action": f.action,
            **dict(f.extra),
        }
        own = f.kind in _EVENTS
        if what == "end":
            self.log(logging.INFO, Event.PROBLEM_CLEARED, f"{where}: {f.name} cleared", **fields)
            return
        level = logging.ERROR if f.severity == CRITICAL else logging.WARNING
        event = _EVENTS.get(f.kind) or Event.problem(f.kind)
        kind = "" if own else f"{f.kind} "
        now = "is now " if what == "restated" else ""
        text = f"{where}: {kind}{now}{f.severity}: {f.message}; action: {f.action}"
        self.log(level, event, text, **fields)

    def entries(
        self,
        gpus: list[pci.PciGpu],
        seen_on_bus: set[str],
        samples: Mapping[str, Sample],
        *,
        fresh: set[str],
        xids: Mapping[str, list[dict[str, Any]]],
        uuids: Mapping[str, str],
    ) -> list[dict[str, Any]]:
        """One state entry per GPU known: on the bus now, seen on it before, named by
        nvidia-smi or by the kernel.  ``fresh``: the slots with a current sample; ``xids``
        and ``uuids``: the kernel's Xid counts and GPU UUIDs, by slot."""
        on_bus = {g.slot: g for g in gpus}
        slots = (seen_on_bus | set(samples) | self.tracker.slots() | set(xids)) - {""}
        out = []
        for slot in sorted(slots):
            s = samples.get(slot)
            problems = self.tracker.problems(slot)
            gpu = on_bus.get(slot)
            health = worst(p.finding for p in problems)
            # Bound to another driver on purpose: ok; else ok only with a fresh sample.
            if health == OK and (gpu is None or gpu.probeable):
                health = OK if slot in fresh else UNKNOWN
            fields = s.fields if s else {}
            smi_uuid = fields.get("uuid")
            out.append(
                {
                    "pci_slot": slot,
                    "uuid": uuids.get(slot) or (smi_uuid if isinstance(smi_uuid, str) else None),
                    "fields": fields,
                    "sampled_at": s.sampled_at if s else None,
                    "stale": s is not None and slot not in fresh,
                    "health": health,
                    "problems": [p.as_dict() for p in problems],
                    "xids": xids.get(slot, []),
                }
            )
        return out
