"""Values from the state made safe and short for a terminal: times, counts, units (pure)."""

from __future__ import annotations

import math
import time
from typing import TypeGuard

__all__ = ["ago", "clean", "clock", "finite", "next_try", "num", "pair", "plural", "since"]


def finite(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is a finite number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def since(at: object, now: float) -> str:
    """``at`` (wall s) as local time and how long ago; "an unknown time" if it is not one."""
    if not finite(at):
        return "an unknown time"
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))
    except (OverflowError, OSError, ValueError):
        return "an unknown time"
    return f"{stamp} ({ago(now - at)} ago)"


def plural(n: object, word: str) -> str:
    """``1 failure``, ``2 failures``: a count from the state, made safe to print."""
    return f"{clean(n)} {word}" if n == 1 else f"{clean(n)} {word}s"


def ago(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def num(value: object, unit: str, digits: int = 0) -> str:
    if finite(value):
        return f"{value:.{digits}f}{unit}"
    return "-"


def clean(value: object) -> str:
    """Text from the state (nvidia-smi's words) made safe to print on a terminal."""
    return "".join(c if c.isprintable() else "?" for c in str(value))


def next_try(ticks: object, interval: float) -> str:
    """The next probe in seconds, as the status line says it (``next try in 20 s``)."""
    if not finite(ticks):
        return "-"
    return f"{ticks * interval:g} s"


def pair(used: object, total: object, unit: str) -> str:
    if used is None and total is None:
        return "-"
    return f"{num(used, '')}/{num(total, '')} {unit}"


def clock(at: float) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(at))
    except (OverflowError, OSError, ValueError):
        return "?"
