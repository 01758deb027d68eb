"""Who a critical GPU fault hit (pure).

A fault is a critical Xid record.  Its victims, each once, the strongest word first:

- ``named``: the process the fault's own record names (``pid=…, name=…``);
- ``torn down``: each process of an Xid 45 record that names the fault ("Preemptive cleanup,
  due to previous errors": the driver tears down the channels of every process the fault
  hit, one record each, ``… Ch 00000001 caused by previous Xid 149``).  A record that names
  the Xid it was caused by goes to the latest open fault of that code on its own GPU, else
  on any GPU (an NVLink fault, Xid 145 on one GPU, tears down processes on its peers:
  NVIDIA/open-gpu-kernel-modules#1150); one that names none, to the latest open fault on
  its GPU;
- ``on the GPU``: the processes on the fault's GPU as last read (an idle one has none).

A fault stays open :data:`WINDOW` seconds after its record for the teardown records that
follow it (the driver writes them within the same second or two), then it is told
(:meth:`Victims.due`).  Bounded: at most :data:`OPEN` faults open, :data:`MOST` victims a fault.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuagent.edges.systemd.unitname import job_words

__all__ = [
    "MOST",
    "OPEN",
    "TEARDOWN",
    "WINDOW",
    "Fault",
    "Victim",
    "Victims",
    "Who",
    "as_json",
    "describe",
    "parse_victims",
]

# The driver's teardown record: Xid 45, "Preemptive cleanup, due to previous errors".
TEARDOWN = 45
WINDOW = 10.0
OPEN = 64
MOST = 256
# The most of a record's VICTIMS field read (MOST victims take far less), and its text keys.
_JSON_MAX = 128 * 1024
_TEXT = ("how", "name", "unit", "job", "user")
# The order of the ways a fault hits a process, strongest first.
_HOW = ("named", "torn down", "on the GPU")


@dataclass(frozen=True)
class Victim:
    """A process a fault hit: ``pid``; its ``name`` (the record's ``name=``, else what the
    agent knew); its systemd ``unit``, its Slurm ``job`` (an id or a SLUID) and ``user`` where
    known (None: not known); ``how`` it was hit (``named``, ``torn down``, ``on the GPU``)."""

    pid: int
    name: str | None
    how: str
    unit: str | None = None
    job: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class Fault:
    """One critical Xid record: the GPU's ``slot``, ``code``, time ``at`` (wall s), and the
    process it names (``pid``, ``name``; None: none)."""

    slot: str
    code: int
    at: float
    pid: int | None = None
    name: str | None = None


@dataclass
class _Open:
    fault: Fault
    victims: dict[int, Victim] = field(default_factory=dict)

    def add(self, victim: Victim) -> None:
        known = self.victims.get(victim.pid)
        if known is None and len(self.victims) >= MOST:
            return
        if known is None or _HOW.index(victim.how) < _HOW.index(known.how):
            self.victims[victim.pid] = victim


# Who a process is, by pid: its unit, job and user (None where not known).
Who = Callable[[int], tuple[str | None, str | None, str | None]]


def _nobody(_pid: int) -> tuple[str | None, str | None, str | None]:
    return None, None, None


class Victims:
    """The faults open for their teardown records, in the order the records came."""

    def __init__(self) -> None:
        self._open: list[_Open] = []

    def fault(
        self, fault: Fault, on_gpu: Iterable[tuple[int, str | None]], who: Who = _nobody
    ) -> None:
        """A critical Xid record; ``on_gpu`` the processes (pid, name) on its GPU as last read,
        ``who`` each one's unit, job and user."""
        entry = _Open(fault)
        if fault.pid is not None:
            entry.add(Victim(fault.pid, fault.name, "named", *who(fault.pid)))
        for pid, name in on_gpu:
            entry.add(Victim(pid, name, "on the GPU", *who(pid)))
        self._open = [*self._open, entry][-OPEN:]

    def teardown(self, record: Fault, cause: int | None, who: Who = _nobody) -> bool:
        """An Xid 45 ``record`` and the Xid it says caused it (``cause``; None: not said);
        whether it went to an open fault (one that names no process goes nowhere)."""
        if record.pid is None:
            return False
        found = self._for(record.slot, record.at, cause)
        if found is None:
            return False
        found.add(Victim(record.pid, record.name, "torn down", *who(record.pid)))
        return True

    def _for(self, slot: str, at: float, cause: int | None) -> _Open | None:
        live = [o for o in reversed(self._open) if o.fault.at - 1.0 <= at <= o.fault.at + WINDOW]
        mine = [o for o in live if o.fault.slot == slot]
        if cause is None:
            return mine[0] if mine else None
        same = [o for o in mine if o.fault.code == cause]
        if same:
            return same[0]
        return next((o for o in live if o.fault.code == cause), None)

    def due(self, now: float) -> list[tuple[Fault, tuple[Victim, ...]]]:
        """The faults whose window is over at ``now`` (wall s), each with its victims in
        order (the strongest word first, then by pid); they are no longer open."""
        done = [o for o in self._open if o.fault.at + WINDOW < now]
        self._open = [o for o in self._open if o.fault.at + WINDOW >= now]
        return [
            (
                o.fault,
                tuple(sorted(o.victims.values(), key=lambda v: (_HOW.index(v.how), v.pid))),
            )
            for o in done
        ]

    def __len__(self) -> int:
        return len(self._open)


def describe(victims: tuple[Victim, ...], limit: int = 8) -> str:
    """The victims in a few words: ``pid 4242 python3 (Slurm job 1234), …``, at most
    ``limit`` named and ``+N more``; ``no process`` for none."""
    if not victims:
        return "no process"
    words = []
    for v in victims[:limit]:
        said = f"pid {v.pid}" + (f" {v.name}" if v.name else "")
        said_job = job_words(v.job) if v.job else None
        said_user = f"user {v.user}" if v.user else None
        whose = ", ".join(w for w in (said_job, v.unit, said_user) if w)
        words.append(f"{said} ({v.how}{', ' + whose if whose else ''})")
    more = len(victims) - limit
    return ", ".join(words) + (f", +{more} more" if more > 0 else "")


def as_json(v: Victim) -> Mapping[str, object]:
    """A victim as the record's ``VICTIMS`` JSON holds it (None left out)."""
    out: dict[str, object] = {"pid": v.pid, "how": v.how}
    for key in ("name", "unit", "job", "user"):
        value = getattr(v, key)
        if value is not None:
            out[key] = value
    return out


def parse_victims(text: str | None) -> tuple[Victim, ...]:
    """A FAULT_VICTIMS record's ``VICTIMS`` JSON (:func:`as_json`'s, anyone's words in a
    journal field): each victim with a whole ``pid`` and its text keys; anything else (too
    long, not JSON, another shape) none."""
    if text is None or len(text) > _JSON_MAX:
        return ()
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return ()
    out = []
    for v in (raw if isinstance(raw, list) else [])[:MOST]:
        if not isinstance(v, dict) or type(v.get("pid")) is not int:
            continue
        said = {k: v[k] if isinstance(v.get(k), str) else None for k in _TEXT}
        how = said["how"] or "?"
        out.append(Victim(v["pid"], said["name"], how, said["unit"], said["job"], said["user"]))
    return tuple(out)
