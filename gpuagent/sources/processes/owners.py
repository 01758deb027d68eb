"""Which systemd unit each GPU process is in, asked of systemd once per process (no I/O here).

systemd answers ``GetUnitByPID`` for any PID over the system bus, also where the agent's
sandbox (``ProtectProc=invisible``) hides ``/proc/<pid>/cgroup``; where it hides the
process's ``comm`` as well, the name is taken from the command line systemd lists for the
process in its unit (``GetUnitProcesses``, asked with the unit, once).  An answer is kept for
a process while it stays on a GPU — keyed by PID and ``comm`` (``None`` where hidden), so a
PID the kernel gives to another program is asked about again — and the last place each PID
was seen is remembered (a bounded number of them) for the Xid that names it after the
process is gone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

from gpuagent.edges.systemd.unitname import classify, is_slurm_scope
from gpuagent.edges.systemd.units import PidResult, UnitProcess, Watch
from gpuagent.sources.processes import comm
from gpuagent.views import Seen

__all__ = ["REMEMBERED", "Owners", "PidLookup", "source_words"]

# PIDs remembered after they leave the GPUs: a day of short jobs on a busy host, in a few
# hundred KiB.
REMEMBERED = 4096


class PidLookup(Protocol):
    """What asks systemd (:class:`gpuagent.edges.systemd.units.Units`; tests give a fake)."""

    def unit_for_pid(self, pid: int) -> PidResult: ...

    def process_in(self, unit: str, pid: int) -> UnitProcess | None: ...


class Owners:
    """Call :meth:`resolve` with the processes of each read."""

    def __init__(self, lookup: PidLookup, *, remember: int = REMEMBERED) -> None:
        self.lookup = lookup
        self.remember = remember
        self.error: str | None = None
        self.asked = 0
        self._live: dict[tuple[int, str | None], Seen] = {}
        self._history: OrderedDict[int, Seen] = OrderedDict()

    def resolve(self, processes: Iterable[tuple[int, str | None, str | None]]) -> dict[int, Seen]:
        """Each of ``processes`` (PID, its ``comm`` or ``None``, GPU slot) with its unit and
        name, by PID.

        Asks systemd only about processes not seen on the last call (where there is no
        system bus socket, not again about one either); after a bus failure
        the rest of this call's are left unknown and asked about on the next (a hung bus
        costs one timeout per read, not one per process).  ``error`` is the failure's one
        line until a lookup succeeds."""
        live: dict[tuple[int, str | None], Seen] = {}
        out: dict[int, Seen] = {}
        failed = False
        for pid, name, slot in processes:
            key = (pid, name)
            seen = self._live.get(key) or live.get(key)
            if seen is None:
                if failed:
                    seen = Seen(pid, name, None, None, slot)
                else:
                    seen, failed = self._ask(pid, name, slot)
                    if not failed:
                        live[key] = seen  # no bus socket at all: not asked again either
            elif seen.slot != slot:
                seen = Seen(seen.pid, seen.name, seen.unit, seen.owner, slot)
                live[key] = seen
            else:
                live[key] = seen
            out[pid] = seen
            self._history[pid] = seen
            self._history.move_to_end(pid)
        self._live = live
        while len(self._history) > self.remember:
            self._history.popitem(last=False)
        return out

    def last_seen(self, pid: int) -> Seen | None:
        """Where ``pid`` was last seen on a GPU, or ``None``: never (or too long ago)."""
        return self._history.get(pid)

    def history(self) -> dict[int, Seen]:
        """Where each process remembered was last seen on a GPU, by PID (a copy)."""
        return dict(self._history)

    def _ask(self, pid: int, name: str | None, slot: str | None) -> tuple[Seen, bool]:
        self.asked += 1
        answer = self.lookup.unit_for_pid(pid)
        if answer.watch is Watch.ERROR:
            self.error = answer.error
            return Seen(pid, name, None, None, slot), True
        if answer.watch is Watch.NOT_WATCHED:
            return Seen(pid, name, None, None, slot), False
        self.error = None
        listed = None
        # One more call, with the unit: only where systemd has what this process lacks.
        if answer.unit is not None and (name is None or is_slurm_scope(answer.unit)):
            listed = self.lookup.process_in(answer.unit, pid)
        if listed is None:
            return Seen(pid, name, answer.unit, classify(answer.unit), slot), False
        name = name or comm.from_cmdline(listed.cmdline)
        return Seen(pid, name, answer.unit, classify(answer.unit, listed.cgroup), slot), False


def source_words(pid: int, name: str | None, seen: Seen | None) -> tuple[str, str | None]:
    """How an Xid's line names the process its record names (``pid``, ``name``), and that
    process's unit: `` from train@3.service (pid 48213 python3)`` where it was seen in one;
    ``seen`` is where it was last seen on a GPU (``None``: never)."""
    name = name or (seen.name if seen is not None else None)
    who = f"pid {pid} {name}" if name else f"pid {pid}"
    if seen is None:
        return f" from {who} (never seen on a GPU by the agent)", None
    if seen.unit is not None:
        return f" from {seen.unit} ({who})", seen.unit
    if seen.owner is None:
        return f" from {who} (its unit not known)", None
    return f" from {who} (in no systemd unit)", None
