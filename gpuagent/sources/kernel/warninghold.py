"""How long a warning Xid holds after its last record: ``xid_warning_hold`` on the monotonic
clock, each record dated by the wall clock only as far back as the journal's read allows.

:class:`WarningHold` is told each poll's counts (:meth:`WarningHold.lapsed`) and whether the
boot's backlog was read since the poll before (:meth:`WarningHold.backlog`); it answers which
(device, code) pairs have lapsed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from gpuagent.health import WARNING
from gpuagent.sources.bus.pciaddr import device_of
from gpuagent.views import XidCount

__all__ = ["WarningHold"]


class WarningHold:
    """``hold`` (s) how long a warning Xid holds after its last record (``None``: until the
    next boot), on the ``monotonic`` clock; the ``wall`` clock, the records' own, only dates
    a record that the boot's first read finds (stepping it back or on does not bring back or
    end a warning)."""

    def __init__(
        self,
        hold: float | None,
        wall: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        self.hold = hold
        self.wall = wall
        self.monotonic = monotonic
        # Each (GPU device, Xid code)'s record count and when its last record was read, on
        # the monotonic clock; when the journal was last read.
        self._heard: dict[tuple[str, int], tuple[int, float]] = {}
        self._polled: float | None = None
        # Whether records of the boot's backlog were read since the last poll (their wall
        # stamps date them, as at the first poll).
        self._backlog = False

    def backlog(self, reading: bool) -> None:
        """Records were read while the boot's backlog was (``reading``) or was not."""
        self._backlog = self._backlog or reading

    def forget(self) -> None:
        """Another journal: its records are dated afresh, as at the first poll."""
        self._heard, self._polled, self._backlog = {}, None, False

    def lapsed(self, counts: Mapping[tuple[str, int], XidCount]) -> set[tuple[str, int]]:
        """The (device, code) pairs whose warning Xid has had no record for ``hold`` s on the
        monotonic clock.  A record read after the first poll was logged since the poll
        before (its wall stamp is trusted no further back than that); one the first poll
        reads is as old as its wall stamp says, and so is one read while the boot's records
        were still being read (the read went on in slices)."""
        mono, wall = self.monotonic(), self.wall()
        backlog, self._backlog = self._backlog, False
        since = math.inf if self._polled is None or backlog else max(mono - self._polled, 0.0)
        self._polled = mono
        lapsed: set[tuple[str, int]] = set()
        for (slot, code), count in counts.items():
            key = (device_of(slot), code)
            seen = self._heard.get(key)
            if seen is None or seen[0] != count.count:
                seen = (count.count, mono - min(max(wall - count.last, 0.0), since))
                self._heard[key] = seen
            held = self.hold is None or mono - seen[1] < self.hold
            if count.info.severity == WARNING and not held:
                lapsed.add(key)
        return lapsed
