"""Tick-counted backoff for a failing read (through :mod:`gpuagent.edges.cadence`).

Gaps are counted in calls to ``due()``, never read from a clock, so an NTP step, a resume from
suspend or a slow probe cannot move the next attempt.  The probe calls it once per executed
tick, a read on a longer period once per period; a grid point the scheduler skips is not a
tick and lengthens that gap.
"""

from __future__ import annotations

import math

__all__ = ["Backoff", "cap_ticks"]

# Beyond 2**30 the gap is always the cap; stop the exponent before it grows without bound.
_MAX_EXPONENT = 30


def cap_ticks(interval: float, retry_max: float) -> int:
    """Longest gap between probes in ticks: ``max(2, ceil(retry_max / interval))``.

    ``interval`` and ``retry_max`` are in seconds and must be positive.
    """
    return max(2, math.ceil(retry_max / interval))


class Backoff:
    """Decides on which ticks a failing probe is retried.

    The first ``after`` consecutive failures are retried on the next tick; after that the gap
    doubles from 2 ticks up to ``cap`` ticks.  With ``after=3`` and ``cap=6``, 40 failing
    ticks probe exactly at ticks 0, 1, 2, 4, 8, 14, 20, 26, 32 and 38.
    """

    def __init__(self, after: int, cap: int) -> None:
        self.failures = 0
        self._skip = 0
        self.configure(after, cap)

    def configure(self, after: int, cap: int) -> None:
        """Take a new threshold and cap (a reload); a gap under way is cut to the new cap,
        and the failure count survives."""
        if after < 1 or cap < 2:
            raise ValueError(f"backoff needs after >= 1 and cap >= 2, got {after}, {cap}")
        self.after = after
        self.cap = cap
        self._skip = min(self._skip, cap - 1)

    def due(self) -> bool:
        """Return whether this tick probes; counts one tick of the current gap."""
        if self._skip > 0:
            self._skip -= 1
            return False
        return True

    def failure(self) -> None:
        """Record a failed probe on this tick and set the gap before the next one."""
        self.failures += 1
        if self.failures < self.after:
            self._skip = 0
            return
        exponent = min(self.failures - self.after + 1, _MAX_EXPONENT)
        self._skip = min(self.cap, 2**exponent) - 1

    def success(self) -> None:
        """Record a successful probe: the next tick probes and the count starts over."""
        self.failures = 0
        self._skip = 0

    def expedite(self) -> None:
        """Make the next ``due()`` true whatever the gap had counted (e.g. the driver returned)."""
        self._skip = 0

    @property
    def next_in_ticks(self) -> int:
        """Ticks from the last executed tick to the next probe (1 = the next tick)."""
        return self._skip + 1
