"""The problems that hold, remembered across the agent's restarts in this boot.

A restart or an upgrade must restate what holds, not page for it again: the file is
``problems.json`` in the directory systemd names in ``$STATE_DIRECTORY``
(:class:`gpuagent.edges.statedir.StateFile`), beside ``gpus.json`` and ``nvlink.json``.  It
keeps each open problem (host and GPU, live and latching) with the source that reports it and
its first-seen time (``since``), the lines of counted Xids and SXids logged (a boot's records
read again are no new ones), and names the boot (the kernel's ``boot_id``): after a reboot
it says nothing, since a reboot is the operator's repair and a fault seen again then is news.
It is written when the set of open problems, their severity, action or ``since`` change, or a
counted Xid's line is logged, never on a quiet tick.  A hand run without ``$STATE_DIRECTORY``
remembers nothing.  A file that cannot be read or written is one warning (the state's
``problems["open_problems"]`` while it lasts), and the agent starts afresh.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

from gpuagent.edges.statedir import StateFile
from gpuagent.logs import EventLog
from gpuagent.views import REASON_MAX, Finding

__all__ = ["FILE", "Held", "HeldProblems", "by_source"]

FILE = "problems.json"
# A few hundred bytes a problem: more than this is not the agent's.
MAX_SIZE = 1024 * 1024
_WHAT = "the problems that hold"
_OTHERWISE = "the problems seen from now"
# A time (s since the epoch) after this is none the agent wrote (the year 5138); NaN fails
# every comparison.
_TIME_END = 1e11
# Xid and SXid codes have at most six digits (the kernel records' parser takes no more).
_CODE_END = 10**6
# A counted Xid's or SXid's line logged: (slot, ``xid`` or ``sxid``, code).
Told = tuple[str, str, int]


@dataclass(frozen=True)
class Held:
    """One open problem as remembered: the verdict source that reports it (``smi``, ``pci``,
    ``xid`` …), its slot (``""``: the host), its finding and its first-seen time (``since``,
    s since the epoch)."""

    source: str
    slot: str
    finding: Finding
    since: float

    @property
    def key(self) -> tuple[str, str, tuple[str, tuple[tuple[str, int | str], ...]]]:
        """What identifies it (its source, slot and :attr:`Finding.key`)."""
        return self.source, self.slot, self.finding.key

    def _said(self) -> tuple[object, ...]:
        # What a write is for: not a new wording of the same problem (another throttle
        # reason); its going unread and read again is (a restart must know it).
        f = self.finding
        return self.key, f.severity, f.action, self.since, f.unread or ()


class HeldProblems:
    """The problems remembered in ``directory`` (None or ``""``: none are); ``boot`` is this
    boot's id (``""``: unknown, nothing is remembered, since the file could not say which boot
    it is of).  :attr:`held` is what the agent before this one left, this boot."""

    def __init__(self, directory: str | None, log: EventLog, *, boot: str) -> None:
        self.boot = boot
        # An unknown boot: nothing is remembered, since the file could not say whose it is.
        where = directory if boot else None
        self.file = StateFile(where, FILE, log, limit=MAX_SIZE, otherwise=_OTHERWISE)
        mine = self.file.read_boot(_parsed, _WHAT, boot)
        self.held: tuple[Held, ...] = mine[0] if mine else ()
        self.told: frozenset[Told] = mine[1] if mine else frozenset()
        # What the file says; None: it could not be read, so the first update replaces it.
        self._said: tuple[list[tuple[object, ...]], frozenset[Told]] | None = (
            None if self.file.error else (sorted(h._said() for h in self.held), self.told)
        )

    @property
    def error(self) -> str | None:
        """Why the file cannot be read or written, while it cannot (the state's
        ``problems["open_problems"]``)."""
        return self.file.error

    def held_for(self, slot: str, kind: str, now: float) -> float | None:
        """How long (s) the problem ``kind`` on ``slot`` had held at wall time ``now``, as
        remembered; None when it is not."""
        for h in self.held:
            if h.slot == slot and h.finding.kind == kind:
                return max(now - h.since, 0.0)
        return None

    def update(self, held: Iterable[Held], told: frozenset[Told]) -> None:
        """The problems open now (all of them) and the counted Xids' lines logged this boot
        (:attr:`gpuagent.views.KernelView.told`); writes the file when that changes what it
        holds (see :class:`Held`)."""
        held = sorted(held, key=lambda h: h._said())
        said = ([h._said() for h in held], told)
        if said == self._said:
            return
        self._said = said
        data = {
            "boot_id": self.boot,
            "problems": [_entry(h) for h in held],
            "told": [list(t) for t in sorted(told)],
        }
        self.file.write(data, _WHAT)


def _entry(h: Held) -> dict[str, object]:
    f = h.finding
    return {
        "source": h.source,
        "pci_slot": h.slot,
        "kind": f.kind,
        "severity": f.severity,
        "action": f.action,
        "message": f.message,
        "extra": [list(pair) for pair in f.extra],
        "unit": f.unit,
        "ends": f.ends,
        "since": h.since,
        "unread": list(f.unread) if f.unread else None,
    }


def _parsed(data: Any) -> tuple[str, tuple[tuple[Held, ...], frozenset[Told]]]:
    """The boot, problems and lines told of the file's JSON ``{"boot_id": str, "problems":
    [entry, ...], "told": [[slot, kind, code], ...]}`` (each entry as :func:`_entry` writes
    it); raises TypeError (or ValueError, from :class:`Finding` for a severity or action it
    does not know) naming what is not so."""
    if not isinstance(data, dict) or not isinstance(data.get("boot_id"), str):
        raise TypeError("expected an object with a boot_id string")
    entries, told = data.get("problems"), data.get("told")
    if not isinstance(entries, list):
        raise TypeError("problems: expected a list")
    if not isinstance(told, list) or not all(_told(t) for t in told):
        raise TypeError("told: expected a list of [slot, kind, code]")
    held = tuple(_held(e, i) for i, e in enumerate(entries))
    return data["boot_id"], (held, frozenset((t[0], t[1], t[2]) for t in told))


def _told(t: Any) -> bool:
    return (
        isinstance(t, list)
        and len(t) == 3
        and isinstance(t[0], str)
        and t[1] in ("xid", "sxid")
        and type(t[2]) is int
        and 0 <= t[2] < _CODE_END
    )


def _time(value: Any) -> TypeGuard[int | float]:
    # A number compared before any conversion: float() of a 400-digit int overflows.
    return type(value) in (int, float) and 0 <= value < _TIME_END


def _held(e: Any, i: int) -> Held:
    where = f"problems[{i}]"
    if not isinstance(e, dict):
        raise TypeError(f"{where}: expected an object")
    texts = [e.get(k) for k in ("source", "pci_slot", "kind", "severity", "action", "message")]
    if not all(isinstance(t, str) for t in texts):
        raise TypeError(f"{where}: expected strings for its source, slot, kind and words")
    since, unit, ends = e.get("since"), e.get("unit"), e.get("ends", "")
    if not _time(since):
        raise TypeError(f"{where}.since: expected a time in seconds since the epoch")
    if unit is not None and not isinstance(unit, str):
        raise TypeError(f"{where}.unit: expected a string or null")
    if not isinstance(ends, str):
        raise TypeError(f"{where}.ends: expected a string")
    source, slot, kind, severity, action, message = (str(t) for t in texts)
    extra = _extra(e.get("extra"), where)
    unread = _unread(e.get("unread"), where)
    finding = Finding(kind, severity, action, message, extra, unit=unit, ends=ends, unread=unread)
    return Held(source, slot, finding, float(since))


def _unread(value: Any, where: str) -> tuple[float, str] | None:
    """A held problem's ``unread``: ``[last read, why]`` while its source could not look
    (absent in an older agent's file), or None."""
    if value is None:
        return None
    ok = (
        isinstance(value, list)
        and len(value) == 2
        and _time(value[0])
        and isinstance(value[1], str)
        and len(value[1]) <= REASON_MAX
    )
    if not ok:
        raise TypeError(f"{where}.unread: expected [a time in seconds, a reason] or null")
    return float(value[0]), value[1]


def _extra(pairs: Any, where: str) -> tuple[tuple[str, int | str], ...]:
    ok = isinstance(pairs, list) and all(
        isinstance(p, list)
        and len(p) == 2
        and isinstance(p[0], str)
        and (isinstance(p[1], str) or (type(p[1]) is int and abs(p[1]) < 2**63))
        for p in pairs
    )
    if not ok:
        raise TypeError(f"{where}.extra: expected a list of [name, number or string] pairs")
    return tuple((str(k), v) for k, v in pairs)


def by_source(held: Iterable[Held]) -> dict[str, dict[str, list[Finding]]]:
    """``held`` as each source's findings by slot, each dated (``at``) by its ``since``."""
    out: dict[str, dict[str, list[Finding]]] = {}
    for h in held:
        out.setdefault(h.source, {}).setdefault(h.slot, []).append(replace(h.finding, at=h.since))
    return out
