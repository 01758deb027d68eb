"""When a cadenced read runs (the probe, NVLink, the processes), and its one outage (pure).

A read is due every ``every`` ticks (its period in seconds, rounded up to whole ticks of the
interval).  While it fails, the :class:`~gpuagent.edges.backoff.Backoff` holds it back,
counted in those reads: every read for ``backoff_after`` failures, then every 2, 4, 8 …
reads, at most ``max(2, ceil(retry_max / period))`` reads apart.  Nothing here reads a
clock: the caller says when a tick passes, when a read ran and how it went.

The outage is one condition: it starts on the failure that brings the count to
``backoff_after`` or beyond (">=", not "==": a reload may lower the threshold mid-outage, and
the next failure must still start it), and ends on the next success.  The caller logs its
one warning and its one line on those edges.
"""

from __future__ import annotations

import math

from gpuagent.condition import Condition, Edge
from gpuagent.edges.backoff import Backoff, cap_ticks

__all__ = ["Cadence", "every_ticks"]


def every_ticks(seconds: float, interval: float) -> int:
    """``seconds`` in whole ticks of ``interval``, rounded up, at least 1."""
    # Rounded first: 0.3 / 0.1 is 2.9999999999999996, and 0.7 / 0.1 must not become 8.
    return max(1, math.ceil(round(seconds / interval, 9)))


class Cadence:
    """One read's cadence, backoff and outage; ``period`` and ``interval`` (the tick) in
    seconds, ``after`` the failures before the backoff (``backoff_after``), ``retry_max``
    the longest gap in seconds.

    Each tick: :meth:`due` once; when it is true and the read's own gates are open,
    :meth:`start`; when that is true, run the read and say :meth:`failed` or
    :meth:`succeeded` (or neither: interrupted, nothing is counted).
    """

    def __init__(self, period: float, interval: float, after: int, retry_max: float) -> None:
        self.every = every_ticks(period, interval)
        self.backoff = Backoff(after, cap_ticks(period, retry_max))
        self._countdown = 0
        self._outage: Condition[bool] = Condition()

    def configure(self, period: float, interval: float, after: int, retry_max: float) -> None:
        """A reload: the new period, threshold and cap; a gap under way is cut to the new
        ones, and the failure count and the outage survive."""
        self.every = every_ticks(period, interval)
        self.backoff.configure(after, cap_ticks(period, retry_max))
        self._countdown = min(self._countdown, self.every - 1)

    def expedite(self) -> None:
        """Make the next tick's read due and let it run, whatever the period and the backoff
        had counted ("look now")."""
        self._countdown = 0
        self.backoff.expedite()

    def due(self) -> bool:
        """Count one tick of the period; whether the read is due on it.  A due read stays due,
        tick after tick, until :meth:`start`."""
        if self._countdown > 0:
            self._countdown -= 1
            return False
        return True

    def start(self) -> bool:
        """The due read's gates are open: its period starts over; returns whether the backoff
        lets it run now (a read held back counts one read of the backoff's gap)."""
        self._countdown = self.every - 1
        return self.backoff.due()

    def failed(self) -> bool:
        """Count a failed read; returns whether it starts the outage."""
        self.backoff.failure()
        holds = self.backoff.failures >= self.backoff.after
        return holds and self._outage.update(True) is Edge.STARTED

    def succeeded(self) -> bool:
        """Count a read that answered: the failures start over; returns whether it ends the
        outage."""
        self.backoff.success()
        return self._outage.update(None) is Edge.ENDED

    @property
    def outage(self) -> bool:
        """Whether the outage holds (since :meth:`failed` started it, until a success)."""
        return self._outage.holds

    @property
    def failures(self) -> int:
        """The failed reads in a row."""
        return self.backoff.failures

    @property
    def cap(self) -> int:
        """The longest gap between reads while failing, in reads."""
        return self.backoff.cap

    @property
    def next_in_ticks(self) -> int:
        """Ticks from the last counted tick to the next read, if its gates are open then (1:
        the next tick)."""
        return self._countdown + 1 + self.every * (self.backoff.next_in_ticks - 1)
