"""How fast the earlier boots' read goes, and so how long it will take (pure but for the clock
of this boot's start): :attr:`gpuagent.sources.kernel.earlier.EarlierBoots.left`."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MEASURED", "Pace"]

# The slices the estimate needs of its own first (before it, the read says nothing of how
# long it takes).
MEASURED = 6


class Pace:
    """How fast the read goes: the slices it took, and the time (realtime us) of its first
    entry and of its last (``last_at``, where a kept read stopped to begin with)."""

    def __init__(self, last_at: int, booted: Callable[[], float]) -> None:
        self.slices = 0
        self._first_at = 0
        self.last_at = last_at
        self._booted = booted

    def saw(self, at: int) -> None:
        """The read took an entry of time ``at`` (realtime us)."""
        self.last_at = at
        self._first_at = self._first_at or at

    def left(self) -> int | None:
        """The slices the read will still take, estimated from the journal time its slices
        covered so far against what is left up to this boot's start; None before
        :data:`MEASURED` slices."""
        if self.slices < MEASURED or self.last_at <= self._first_at:
            return None
        per_slice = (self.last_at - self._first_at) / self.slices
        return max(int((self._booted() * 1e6 - self.last_at) / per_slice), 0)
