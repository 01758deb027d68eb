"""Between ticks: the descriptors the loop waits on besides the signal pipe, and when the news
they bring runs an event step.

A source with a descriptor (:meth:`~gpuagent.sources.Source.waits_on`: the journal's
inotify, the system bus connection) wakes the loop; the source then takes in what came
(:meth:`~gpuagent.sources.Source.news`) and says whether it has news: a kernel record, a
watched unit's change.  News runs an event step at once (:meth:`gpuagent.agent.Agent.event`,
then the publisher), at most one every :data:`GAP` s: while one is due the loop waits on the
signal pipe alone, so a storm of records wakes it once a step, and the step reads all that
came meanwhile.  The grid of ticks is not moved.  A wake-up without news (another program's
journal entries, anyone's signal sent to the agent's bus connection) is coalesced too: the
descriptors are waited on again :data:`GAP` s after the wake-up, so a storm of them costs
one take-in each :data:`GAP` s, whatever it brings (news that comes meanwhile waits up to a
gap for it).
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
    :data:`GAP` s; then when that much has passed since it ended.  And when the sources'
    descriptors are waited on: not while a step is due, nor within :data:`GAP` s of the
    last wake-up they made."""

    def __init__(self, gap: float = GAP) -> None:
        self.gap = gap
        self.pending = False
        self._last = -math.inf
        self._woke = -math.inf

    def woke(self, now: float) -> None:
        """A source's descriptor woke the loop at ``now`` (monotonic s), news or not."""
        self._woke = now

    def listen(self, now: float) -> float | None:
        """When the descriptors are next waited on (monotonic s): None at ``now`` itself."""
        at = self._woke + self.gap
        if self.pending:
            at = max(at, self._last + self.gap)
        return at if at > now else None

    def news(self) -> None:
        """A source has news."""
        self.pending = True

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
