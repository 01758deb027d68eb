"""What the earlier boots' read has read, kept across the agent's restarts: ``earlier.json``.

The read of the earlier boots (:mod:`gpuagent.sources.kernel.earlier`) goes a slice a tick; a
restart must not start it over.  It keeps, by boot id, what each boot's entries gave (the
critical hits, root's clears, the boards replaced, each board's first wear record, the driver's
UUID lines and the Xids already stepped), with the journal cursor it got to, the journal it read
and where in time it began, in the directory systemd names in ``$STATE_DIRECTORY``
(:class:`gpuagent.edges.statedir.StateFile`: written atomically, read back through the safe
reader, at most :data:`MAX_SIZE` bytes).  A file that is misshapen, of another journal, or
begun later than the read would begin now is not used: the read starts over.

Of a boot's hits of one kind and code on one GPU the file keeps the first and the last: the
boots a problem recurs in are the same (a boot counts where its last hit is after the GPU's
last clear); where a clear fell between them, the date a recurrence is said "since" is that
boot's last hit rather than its first after the clear.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuagent.edges.statedir import StateFile
from gpuagent.logs import EventLog
from gpuagent.sources.kernel.recurrence import Hit
from gpuagent.sources.wear.counters import FIELDS as WEAR_FIELDS

__all__ = ["FILE", "MAX_SIZE", "BootRead", "Kept", "KeptFile", "parse", "shape"]

FILE = "earlier.json"
# A few hundred bytes a boot: more than this is not the agent's (and is not written).
MAX_SIZE = 4 * 1024 * 1024
_WHAT = "what was read of the earlier boots"
_VERSION = 1
_BOOT = re.compile(r"[0-9a-f]{32}")
_WEAR = frozenset(WEAR_FIELDS.values())
# sd-journal's cursors are about 150 characters.
_CURSOR_MAX = 1024


@dataclass
class BootRead:
    """What one earlier boot's entries gave: its ``last`` entry's time (realtime us), its
    critical ``hits``, root's ``clears`` (time s, slot, kind), the boards replaced ``swaps``
    (time s, slot), each board's first ``wear`` record (by UUID, lower case), the driver's
    UUID lines by device (``uuids``) and the (device, Xid code) pairs stepped (``told``)."""

    last: int = 0
    hits: list[Hit] = field(default_factory=list)
    clears: list[tuple[float, str, str]] = field(default_factory=list)
    swaps: list[tuple[float, str]] = field(default_factory=list)
    wear: dict[str, Mapping[str, int]] = field(default_factory=dict)
    uuids: dict[str, str] = field(default_factory=dict)
    told: set[tuple[str, int]] = field(default_factory=set)


@dataclass
class Kept:
    """The read so far: the ``journal`` it read (``""``: the system journal), the time it began
    at (``since``, s since the epoch), the ``cursor`` of the last entry it took and that entry's
    time (``at``, realtime us), and each boot's :class:`BootRead` in journal order."""

    journal: str
    since: float
    cursor: str | None = None
    at: int = 0
    boots: dict[str, BootRead] = field(default_factory=dict)


def _ends(hits: list[Hit]) -> list[Hit]:
    """The first and the last hit of each (slot, UUID, kind, code), in their order."""
    first: dict[tuple[str, str | None, str, int], Hit] = {}
    last: dict[tuple[str, str | None, str, int], Hit] = {}
    for h in hits:
        key = (h.slot, h.uuid, h.kind, h.code)
        first.setdefault(key, h)
        last[key] = h
    kept = {id(h) for h in (*first.values(), *last.values())}
    return [h for h in hits if id(h) in kept]


def shape(kept: Kept) -> dict[str, object]:
    """``kept`` as the file's JSON object."""
    return {
        "version": _VERSION,
        "journal": kept.journal,
        "since": kept.since,
        "cursor": kept.cursor,
        "at": kept.at,
        "boots": {
            boot: {
                "last": b.last,
                "hits": [[h.at, h.slot, h.uuid, h.kind, h.code] for h in _ends(b.hits)],
                "clears": [list(c) for c in b.clears],
                "swaps": [list(s) for s in b.swaps],
                "wear": {u: dict(w) for u, w in b.wear.items()},
                "uuids": dict(b.uuids),
                "told": sorted([d, c] for d, c in b.told),
            }
            for boot, b in kept.boots.items()
        },
    }


def _is(value: Any, kind: type) -> bool:
    # bool is an int to isinstance: never a count or a time here.
    return isinstance(value, kind) and not isinstance(value, bool)


def _time(value: Any, where: str) -> float:
    if not (_is(value, int) or _is(value, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a time (s since the epoch)")
    return float(value)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ValueError(f"{where}: expected a short string")
    return value


def _count(value: Any, where: str) -> int:
    if not _is(value, int) or value < 0:
        raise ValueError(f"{where}: expected a count")
    return int(value)


def _rows(value: Any, width: int, where: str) -> list[list[Any]]:
    if not isinstance(value, list) or not all(
        isinstance(r, list) and len(r) == width for r in value
    ):
        raise ValueError(f"{where}: expected a list of {width}-element lists")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{where}: expected an object")
    return value


def _boot(boot: str, data: Any) -> BootRead:
    where = f"boots[{boot!r}]"
    d = _object(data, where)
    read = BootRead(last=_count(d.get("last"), f"{where}.last"))
    for i, (at, slot, uuid, kind, code) in enumerate(_rows(d.get("hits"), 5, f"{where}.hits")):
        w = f"{where}.hits[{i}]"
        board = None if uuid is None else _text(uuid, w)
        hit = Hit(boot, _time(at, w), _text(slot, w), board, _text(kind, w), _count(code, w))
        read.hits.append(hit)
    for i, (at, slot, kind) in enumerate(_rows(d.get("clears"), 3, f"{where}.clears")):
        w = f"{where}.clears[{i}]"
        read.clears.append((_time(at, w), _text(slot, w), _text(kind, w)))
    for i, (at, slot) in enumerate(_rows(d.get("swaps"), 2, f"{where}.swaps")):
        read.swaps.append((_time(at, f"{where}.swaps[{i}]"), _text(slot, f"{where}.swaps[{i}]")))
    for uuid, counts in _object(d.get("wear"), f"{where}.wear").items():
        w = f"{where}.wear[{uuid!r}]"
        c = _object(counts, w)
        if not all(k in _WEAR for k in c):
            raise ValueError(f"{w}: expected counts by counter name")
        read.wear[uuid.lower()] = {k: _count(v, w) for k, v in c.items()}
    for device, uuid in _object(d.get("uuids"), f"{where}.uuids").items():
        read.uuids[device] = _text(uuid, f"{where}.uuids[{device!r}]")
    for i, (device, code) in enumerate(_rows(d.get("told"), 2, f"{where}.told")):
        w = f"{where}.told[{i}]"
        read.told.add((_text(device, w), _count(code, w)))
    return read


def parse(data: Any) -> Kept:
    """The :class:`Kept` of the file's JSON; raises TypeError or ValueError naming the first
    field that is not what :func:`shape` writes."""
    d = _object(data, "the file")
    if d.get("version") != _VERSION:
        raise ValueError(f"version: expected {_VERSION}")
    journal = d.get("journal")
    if not isinstance(journal, str):
        raise TypeError("journal: expected a string")
    cursor = d.get("cursor")
    if cursor is not None and (not isinstance(cursor, str) or not 0 < len(cursor) <= _CURSOR_MAX):
        raise ValueError("cursor: expected a journal cursor or null")
    kept = Kept(journal, _time(d.get("since"), "since"), cursor, _count(d.get("at"), "at"))
    for boot, read in _object(d.get("boots"), "boots").items():
        if not _BOOT.fullmatch(boot):
            raise ValueError(f"boots[{boot!r}]: expected a boot id (32 hex digits)")
        kept.boots[boot] = _boot(boot, read)
    return kept


class KeptFile:
    """``earlier.json`` in ``directory`` (None: a hand run, which keeps nothing)."""

    def __init__(self, directory: str | None, log: EventLog) -> None:
        self.file = StateFile(
            directory, FILE, log, limit=MAX_SIZE, otherwise="reading the earlier boots afresh"
        )

    def read(self) -> Kept | None:
        """What the file keeps; None for no file or one that cannot be read or used (then a
        warning line, once)."""
        return self.file.read(parse, _WHAT)

    def write(self, kept: Kept) -> None:
        """Replace the file with ``kept``; what would be bigger than the reader takes is not
        written (the next start then reads the earlier boots afresh)."""
        data = shape(kept)
        if len(json.dumps(data, separators=(",", ":"))) <= MAX_SIZE:
            self.file.write(data, _WHAT)
