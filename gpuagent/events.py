"""Between ticks: the descriptors the loop waits on besides the signal pipe, and when the news
they bring runs an event step.

A source with a descriptor (:meth:`~gpuagent.sources.Source.waits_on`: the journal's
inotify, the system bus connection) wakes the loop; the source then takes in what came
(:meth:`~gpuagent.sources.Source.news`) and says whether it has news: a kernel record, a
watched unit's change.  News runs an event step at once (:meth:`gpuagent.agent.Agent.event`,
then the publisher), at most one every :data:`GAP` s: while one is due the loop waits on the
signal pipe alone, so a storm of records wakes it once per step, and the step reads all that
came meanwhile.  The grid of ticks is not moved.  A journal that changes without news (another
program's entries) costs one read of nothing new.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from gpuagent.sources import Source

__all__ = ["GAP", "Pace", "Waits"]

# The least time between two event steps (s): a storm of records makes at most five a second.
GAP = 0.2


class Pace:
    """When the news heard runs an event step (pure): at once, unless one ran within
    :data:`GAP` s; then when that much has passed since it ended."""

    def __init__(self, gap: float = GAP) -> None:
        self.gap = gap
        self.pending = False
        self._last = -math.inf

    def news(self) -> None:
        """A source has news."""
        self.pending = True

    @property
    def due(self) -> float | None:
        """When the step for the news heard may run (monotonic s; ``None``: no news)."""
        return self._last + self.gap if self.pending else None

    def ready(self, now: float) -> bool:
        """Whether an event step is to run at ``now`` (monotonic s)."""
        return self.pending and now >= self._last + self.gap

    def ran(self, now: float) -> None:
        """An event step ended at ``now`` (monotonic s)."""
        self.pending = False
        self._last = now

    def ticked(self) -> None:
        """A tick ran: it read whatever news there was."""
        self.pending = False


class Waits:
    """The descriptors of ``sources`` to wait on now, and, once some are readable, whether
    their sources have news (``news``: the agent's guard around a source's own)."""

    def __init__(self, sources: Iterable[Source], news: Callable[[Source], bool]) -> None:
        self.sources = tuple(sources)
        self._news = news

    def fds(self) -> dict[int, Source]:
        """Each descriptor to wait on, and its source."""
        out: dict[int, Source] = {}
        for source in self.sources:
            fd = source.waits_on()
            if fd is not None:
                out[fd] = source
        return out

    def news(self, ready: Iterable[int], waited: Mapping[int, Source]) -> bool:
        """Whether the sources of the ``ready`` descriptors (among ``waited``) have news;
        each is asked, so that each takes in what came."""
        news = False
        for fd in ready:
            if fd in waited:
                news = self._news(waited[fd]) or news
        return news
