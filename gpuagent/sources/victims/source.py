"""The victims source: for each critical Xid the kernel source heard, one FAULT_VICTIMS
record naming the processes it hit (:mod:`gpuagent.sources.victims.rule`), once its window
for the driver's teardown records is over.

Reads the tick's ``kernel`` (the Xid records heard this step) and the last ``processes``
(who was on each GPU, and the agent's memory of each process's unit).  Spawns nothing, so it
runs in event steps too: a fault's record is told within :data:`~.rule.WINDOW` s and a step.
A process's user is known where its unit says it (``user@UID.service``), its job where its
control group says it (a Slurm job's id or SLUID).
"""

from __future__ import annotations

import json
import logging

from gpuagent.edges.users import user_name
from gpuagent.health import CRITICAL
from gpuagent.logs import Event, EventLog
from gpuagent.sources import Outcome, Source
from gpuagent.sources.victims.rule import TEARDOWN, Fault, Victims, as_json, describe
from gpuagent.views import ProcessesView, Tick

__all__ = ["VictimsSource"]


class VictimsSource(Source):
    """One FAULT_VICTIMS record per critical Xid heard."""

    name = "victims"

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.victims = Victims()

    def step(self, tick: Tick) -> Outcome:
        seen = tick.processes
        for h in tick.kernel.heard:
            record = Fault(h.slot, h.code, h.at, h.pid, h.process)
            if h.code == TEARDOWN:
                self.victims.teardown(record, h.cause, lambda pid: _who(seen, pid))
            elif h.severity == CRITICAL:
                on_gpu = [(p.pid, p.name) for p in (seen.gpus or {}).get(h.slot, ())]
                self.victims.fault(record, on_gpu, lambda pid: _who(seen, pid))
        for fault, hit in self.victims.due(tick.now):
            self.log(
                logging.INFO,
                Event.FAULT_VICTIMS,
                f"GPU {fault.slot}: Xid {fault.code} hit {describe(hit)}",
                pci_slot=fault.slot,
                gpu_uuid=tick.uuid(fault.slot),
                xid=fault.code,
                fault_at=f"{fault.at:.6f}",
                victims=json.dumps([as_json(v) for v in hit], separators=(",", ":")),
                victim_count=len(hit),
            )
        return Outcome()


def _who(seen: ProcessesView, pid: int) -> tuple[str | None, str | None, str | None]:
    """Process ``pid``'s unit, Slurm job and user as the processes read last knew them."""
    for procs in (seen.gpus or {}).values():
        for p in procs:
            if p.pid == pid:
                return p.unit, _job(p.kind, p.ref), _user(p.kind, p.ref)
    known = seen.last_seen.get(pid)
    if known is None:
        return None, None, None
    kind, ref = (known.owner.kind, known.owner.ref) if known.owner else (None, None)
    return known.unit, _job(kind, ref), _user(kind, ref)


def _job(kind: str | None, ref: str | None) -> str | None:
    return ref if kind == "slurm" else None


def _user(kind: str | None, ref: str | None) -> str | None:
    if kind != "user" or ref is None or not ref.isascii() or not ref.isdigit():
        return None
    return user_name(int(ref)) or f"uid {ref}"
