"""The evidence bundles' rules, pure: slot names, bundle names, the rate limit and the caps.

A bundle is the directory ``<UTC time>-<slot>`` (``20250102T030405Z-0000:18:00.0``): names
sort as their times do, and a board's bundles are found by its slot.  The ledger is the list
of automatic bundles admitted (slot, boot, wall time): one per GPU per boot, and at most
``per_hour`` per host in any hour, whatever the requests.
"""

from __future__ import annotations

import calendar
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "HOUR",
    "NO_BUNDLES",
    "Admission",
    "Bundles",
    "Entry",
    "admit",
    "bundle_name",
    "is_bundle",
    "is_slot",
    "ledger_entries",
    "slot_of",
    "to_drop",
]

HOUR = 3600.0
# sysfs's spelling only (lower case, a domain of 4 to 8 digits): one slot, one name, so
# that no second spelling gets a second bundle this boot.
_SLOT = r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"
_SLOT_RE = re.compile(_SLOT, re.ASCII)
_BUNDLE_RE = re.compile(rf"(?P<time>[0-9]{{8}}T[0-9]{{6}}Z)-(?P<slot>{_SLOT})", re.ASCII)


def is_slot(text: str) -> bool:
    """Whether ``text`` is a PCI slot as sysfs writes it (``0000:18:00.0``)."""
    return _SLOT_RE.fullmatch(text) is not None


def bundle_name(now: float, slot: str) -> str:
    """The bundle directory's name for ``slot`` at wall time ``now`` (s): ``<UTC>-<slot>``.

    Raises ``ValueError`` for a ``slot`` that :func:`is_slot` refuses."""
    if not is_slot(slot):
        raise ValueError(f"not a PCI slot: {slot!r}")
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}-{slot}"


def is_bundle(name: str) -> bool:
    """Whether ``name`` is a bundle directory's name."""
    return _BUNDLE_RE.fullmatch(name) is not None


def slot_of(name: str) -> str | None:
    """The slot a bundle's ``name`` names, None for another name."""
    m = _BUNDLE_RE.fullmatch(name)
    return m["slot"] if m else None


def bundle_time(name: str) -> float | None:
    """The wall time (s, whole) a bundle's ``name`` gives, None for another name."""
    m = _BUNDLE_RE.fullmatch(name)
    return float(calendar.timegm(time.strptime(m["time"], "%Y%m%dT%H%M%SZ"))) if m else None


@dataclass(frozen=True)
class Bundles:
    """The bundle names found in ``directory`` (others left out), as the agent listed it."""

    directory: str = ""
    names: tuple[str, ...] = ()

    def since(self, slot: str, since: float) -> str | None:
        """The path of ``slot``'s newest bundle gathered at or after wall time ``since`` (s;
        a name keeps whole seconds), or None: none since."""
        after = [
            n
            for n in self.names
            if slot_of(n) == slot and (bundle_time(n) or 0.0) >= float(int(since))
        ]
        return os.path.join(self.directory, max(after)) if after else None


NO_BUNDLES = Bundles()


def to_drop(
    bundles: Sequence[tuple[str, int]], keep: str, max_count: int, max_bytes: int
) -> list[str]:
    """The bundles to remove, oldest first, so that at most ``max_count`` remain and their
    bytes are at most ``max_bytes``: ``bundles`` are (name, bytes); ``keep`` (the one just
    made) is never dropped, even alone over the cap."""
    ordered = sorted(bundles)
    count, total = len(ordered), sum(size for _, size in ordered)
    dropped: list[str] = []
    for name, size in ordered:
        if count <= max_count and total <= max_bytes:
            break
        if name == keep:
            continue
        dropped.append(name)
        count, total = count - 1, total - size
    return dropped


class Entry(NamedTuple):
    """An automatic bundle admitted: its GPU's ``slot``, the ``boot`` id, wall time ``at``."""

    slot: str
    boot: str
    at: float


class Admission(NamedTuple):
    """:func:`admit`'s answer: ``why`` not (None: admitted) and the ledger to keep."""

    why: str | None
    ledger: list[Entry]


def admit(ledger: Iterable[Entry], slot: str, boot: str, now: float, per_hour: int) -> Admission:
    """Whether an automatic bundle of ``slot`` may be made at wall time ``now`` in boot
    ``boot``: none made for it this boot, and fewer than ``per_hour`` in the last hour (a
    time ahead of ``now``, the clock set back, counts as in it).  The ledger returned keeps
    this boot's entries and the last hour's, with the new one if admitted."""
    kept = [e for e in ledger if e.boot == boot or now - e.at < HOUR]
    if any(e.slot == slot and e.boot == boot for e in kept):
        return Admission(f"a bundle of {slot} was made this boot already", kept)
    recent = sum(1 for e in kept if now - e.at < HOUR)
    if recent >= per_hour:
        return Admission(f"{recent} bundles in the last hour already (evidence_per_hour)", kept)
    return Admission(None, [*kept, Entry(slot, boot, now)])


def ledger_entries(value: Any) -> list[Entry]:
    """The ledger file's JSON ``value`` (a list of {"slot", "boot", "at"}) as entries.

    Raises ``TypeError`` or ``ValueError`` naming what is wrong."""
    if not isinstance(value, list):
        raise TypeError("expected a list")
    entries = []
    for item in value:
        if not isinstance(item, dict):
            raise TypeError(f"expected an object, got {item!r:.40}")
        slot, boot, at = item.get("slot"), item.get("boot"), item.get("at")
        if not (isinstance(slot, str) and is_slot(slot) and isinstance(boot, str)):
            raise ValueError(f"expected a slot and a boot id, got {item!r:.60}")
        if isinstance(at, bool) or not isinstance(at, int | float):
            raise TypeError(f"expected a number at 'at', got {at!r:.40}")
        entries.append(Entry(slot, boot, float(at)))
    return entries
