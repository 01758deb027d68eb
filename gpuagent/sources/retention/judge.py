"""Whether the journal can hold ``history_days`` (pure).

Recurrence (:mod:`gpuagent.sources.kernel.recurrence`) reads the earlier boots from the
journal; where the journal cannot keep them it is blind, and says nothing.  Two cases, each
one message that says how to fix it:

- volatile: the journal lives in ``/run`` and is lost at each boot (journald's ``Storage=``
  is ``volatile`` or ``none``, or, with ``auto`` or ``persistent``, there is no
  ``/var/log/journal/<machine-id>``: nothing was flushed to disk);
- at its cap: its oldest entry is newer than ``history_days`` while its files take journald's
  cap, less one journal file (journald's ``SystemMaxFileSize`` default, an eighth of the cap:
  it deletes whole files).  The cap is ``SystemMaxUse``, or journald's default, 10 % of the
  filesystem and at most 4 GiB.  A young journal below its cap is no warning: it grows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["MAX_DEFAULT", "Store", "cap", "judge", "settings", "size"]

# journald's default cap: 10 % of the filesystem, at most this.
MAX_DEFAULT = 4 * 1024**3
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5, "E": 1024**6}
# ASCII digits, 20 at most before the point and after it: a longer number is none journald
# reads (its parse_size refuses what overflows 64 bits), and float() of 400 digits is inf.
_SIZE = re.compile(r"([0-9]{1,20}(?:\.[0-9]{1,20})?)\s*([KMGTPE]?)B?", re.IGNORECASE)
_SIZE_MAX = 2**64 - 1


@dataclass(frozen=True)
class Store:
    """What was seen of the journal in ``directory``: ``volatile`` why it is lost at each boot
    and ``fix`` how to keep it (both ``None`` where it lasts); ``usage`` the bytes its files
    take, ``oldest`` its oldest entry (s since the epoch; ``None``: none), ``max_use``
    journald's ``SystemMaxUse`` (``None``: unset), ``filesystem`` the bytes of its
    filesystem."""

    directory: str
    volatile: str | None = None
    fix: str | None = None
    usage: int = 0
    oldest: float | None = None
    max_use: int | None = None
    filesystem: int = 0


def settings(texts: Iterable[str]) -> dict[str, str]:
    """The ``[Journal]`` settings of journald.conf and its drop-ins, in the order journald
    reads them (a later one wins; an empty value restores the default)."""
    out: dict[str, str] = {}
    section = ""
    for text in texts:
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
            elif section == "Journal" and "=" in line:
                key, value = (part.strip() for part in line.split("=", 1))
                if value:
                    out[key] = value
                else:
                    out.pop(key, None)
        section = ""
    return out


def size(text: str | None) -> int | None:
    """A journald size (``4G``, ``500M``, ``1.5G``, bytes), or ``None`` where it is unset or
    not one journald reads alike (over 64 bits too: journald then keeps its default)."""
    found = _SIZE.fullmatch(text.strip()) if text else None
    if found is None:
        return None
    got = int(float(found[1]) * _UNITS[found[2].upper()])
    return got if got <= _SIZE_MAX else None


def cap(max_use: int | None, filesystem: int) -> int:
    """journald's cap: ``SystemMaxUse``, else 10 % of the filesystem, at most 4 GiB."""
    return max_use if max_use is not None else min(filesystem // 10, MAX_DEFAULT)


def _human(n: int) -> str:
    for unit in ("G", "M", "K"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.1f}{unit}"
    return f"{n}B"


def judge(store: Store, days: int, now: float) -> tuple[str, str] | None:
    """``(case, message)`` where the journal cannot hold ``days`` days at ``now``: ``case``
    ``volatile`` or ``at_cap``; ``None`` where it can (or may yet)."""
    if store.volatile is not None:
        return "volatile", (
            f"the journal cannot hold history_days ({days}): {store.volatile}, so it lives "
            f"in /run and is lost at each boot; recurrence across boots is blind; {store.fix}"
        )
    if store.oldest is None or now - store.oldest >= days * 86400:
        return None
    limit = cap(store.max_use, store.filesystem)
    if store.usage < limit - limit // 8:
        return None
    which = "SystemMaxUse" if store.max_use is not None else "10% of its filesystem"
    held = max(now - store.oldest, 0.0) / 86400
    return "at_cap", (
        f"the journal holds {held:.1f} of history_days ({days}) days: {store.directory} is at "
        f"journald's cap ({_human(store.usage)} of {_human(limit)}, {which}); recurrence "
        "beyond that is blind; raise SystemMaxUse in journald.conf, or lower history_days"
    )
