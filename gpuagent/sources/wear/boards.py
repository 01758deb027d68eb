"""The boards' wear in one journal record: its ``WEAR_BOARDS`` field, written and read (pure).

A boot's wear read is one ``wear_recorded`` record whose ``WEAR_BOARDS`` field is compact
JSON, a list of one object a board: ``[{"pci_slot": "0000:18:00.0", "gpu_uuid": "GPU-…",
"serial": "1320221034567", "remapped_rows_correctable": 3, …}]``, each key the lower case of
a field of the per-board records of agents before 0.9.0 (``serial`` where it was read, each
counter where the board offers it).  A record carries at most :data:`BOARDS_MAX` boards and
each text at most :data:`TEXT_MAX` characters, so the field stays under :data:`FIELD_MAX`
bytes; the journal is anyone's to write into, so :func:`read` takes no more than that and
drops what is not a board's (a field of another shape is no board at all).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from gpuagent.sources.wear.counters import FIELDS, LABELS, Counters, said
from gpuagent.untrusted import whole

__all__ = ["BOARDS_MAX", "FIELD", "FIELD_MAX", "TEXT_MAX", "Board", "message", "read", "records"]

FIELD = "WEAR_BOARDS"
# Boards a record carries: an 8-GPU host's read is one record; a larger host's, a few.
BOARDS_MAX = 16
# Longest slot, UUID or serial kept (real ones are 12, 40 and 13 characters).
TEXT_MAX = 64
# The longest field read: BOARDS_MAX boards of TEXT_MAX texts and 20-digit counters fit
# (about 9 KB); below sd-journal's 64 KiB data threshold, so a reader gets it whole.
FIELD_MAX = 16_384
# Boards a record's message names, with their counters above 0.
_NAMED = 3
_COUNTERS = frozenset(FIELDS.values())


@dataclass(frozen=True)
class Board:
    """One board's wear in a record: ``pci_slot`` (sysfs form), ``gpu_uuid`` ("": not
    named), ``serial`` (None: not read), ``counts`` by counter name
    (:data:`gpuagent.sources.wear.counters.FIELDS`' values)."""

    pci_slot: str
    gpu_uuid: str
    serial: str | None
    counts: Counters


def records(boards: list[Board]) -> list[tuple[str, str]]:
    """The records of ``boards``' wear, ``(MESSAGE, WEAR_BOARDS)``: one for up to
    :data:`BOARDS_MAX` boards (a larger host's read, a few), none for none; each text is cut
    to :data:`TEXT_MAX`."""
    parts = [boards[i : i + BOARDS_MAX] for i in range(0, len(boards), BOARDS_MAX)]
    return [(message(part), _field(part)) for part in parts]


def _field(boards: list[Board]) -> str:
    out: list[dict[str, object]] = []
    for b in boards:
        d: dict[str, object] = {
            "pci_slot": b.pci_slot[:TEXT_MAX],
            "gpu_uuid": b.gpu_uuid[:TEXT_MAX],
        }
        if b.serial:
            d["serial"] = b.serial[:TEXT_MAX]
        d.update((n, b.counts[n]) for n in LABELS if n in b.counts)
        out.append(d)
    return json.dumps(out, separators=(",", ":"), ensure_ascii=True)


def message(boards: list[Board]) -> str:
    """The record's one line: how many GPUs, and the first few with a counter above 0
    (``wear of 8 GPUs recorded: every counter 0``)."""
    grown = [b for b in boards if any(b.counts.values())]
    head = f"wear of {len(boards)} GPU{'s' if len(boards) != 1 else ''} recorded: "
    if not grown:
        return head + "every counter 0"
    named = "; ".join(
        f"{b.pci_slot} {said({n: v for n, v in b.counts.items() if v})}" for b in grown[:_NAMED]
    )
    more = f"; {len(grown) - _NAMED} more above 0" if len(grown) > _NAMED else ""
    return head + named + more


def read(text: str) -> list[Board]:
    """The boards of a ``WEAR_BOARDS`` value: those that name a slot, a UUID or neither
    ("") and a count at least; a value over :data:`FIELD_MAX`, not JSON, or not a list
    gives none, and past :data:`BOARDS_MAX` boards the rest are dropped."""
    if len(text) > FIELD_MAX:
        return []
    try:
        got = json.loads(text)
    except (ValueError, RecursionError):
        return []  # RecursionError: nesting deeper than the parser goes
    if not isinstance(got, list):
        return []
    out: list[Board] = []
    for item in got[:BOARDS_MAX]:
        if isinstance(item, dict) and (board := _board(item)) is not None:
            out.append(board)
    return out


def _board(item: Mapping[str, object]) -> Board | None:
    slot, uuid, serial = (item.get(k) for k in ("pci_slot", "gpu_uuid", "serial"))
    if not isinstance(slot, str) or not slot or len(slot) > TEXT_MAX:
        return None
    if not isinstance(uuid, str) or len(uuid) > TEXT_MAX:
        return None
    counts: Counters = {}
    for name in _COUNTERS & item.keys():
        value = item[name]
        # bool is an int to Python; a count is a whole number of at most 20 digits.
        if type(value) is int and (got := whole(str(value), 20)) is not None:
            counts[name] = got
    if not counts:
        return None
    kept = serial[:TEXT_MAX] if isinstance(serial, str) and serial else None
    return Board(slot, uuid, kept, counts)
