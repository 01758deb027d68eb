"""Fixed-grid tick arithmetic on a monotonic clock (pure).

Tick ``k`` is due at ``start + k * interval`` seconds.  A tick that overruns does not make
the next ones run back to back: grid points already in the past are skipped, not stacked.
"""

from __future__ import annotations

import math

__all__ = ["deadline", "next_index"]


def deadline(start: float, interval: float, index: int) -> float:
    """Monotonic time (s) at which grid point ``index`` is due."""
    return start + index * interval


def next_index(start: float, interval: float, last: int, now: float) -> int:
    """Index of the next grid point to run after grid point ``last`` finished at ``now``.

    That is ``last + 1`` unless its time has already passed, in which case it is the first
    grid point at or after ``now``.  The difference minus one is the number of skipped points.
    """
    first_not_past = math.ceil((now - start) / interval)
    return max(last + 1, first_not_past)
