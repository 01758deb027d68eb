""" "Log once": a condition's start, change and end, for the agent's own trouble (pure).

Every condition the agent reports in the journal (nvidia-smi failing, the driver unloaded, a
state file that cannot be written …) is one line when it starts and one when it ends, never a
line per tick.  :class:`Condition` holds one such condition's current value and says, on each
:meth:`~Condition.update`, which edge the new value is; :class:`ConditionSet` does the same for
a set of keys (one condition per GPU or per sysfs problem).  Callers log on the edges;
:class:`Bug` is the one condition that logs itself: an unexpected error, survived.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from enum import Enum
from typing import Generic, TypeVar

from gpuagent.logs import EventLog

__all__ = ["Bug", "Condition", "ConditionSet", "Edge"]

T = TypeVar("T")


class Edge(Enum):
    """What an update did to a condition."""

    STARTED = "started"
    CHANGED = "changed"
    ENDED = "ended"


class Condition(Generic[T]):
    """One condition: ``value`` is what holds now (``None``: the condition does not hold)."""

    def __init__(self) -> None:
        self.value: T | None = None

    @property
    def holds(self) -> bool:
        """Whether the condition holds now."""
        return self.value is not None

    def update(self, value: T | None) -> Edge | None:
        """Set the condition to ``value``; returns the edge it makes, or None (no change)."""
        old, self.value = self.value, value
        if old is None:
            return None if value is None else Edge.STARTED
        if value is None:
            return Edge.ENDED
        return None if value == old else Edge.CHANGED


class ConditionSet:
    """One condition per key (a GPU's slot, a problem's text): ``keys`` are those that hold."""

    def __init__(self) -> None:
        self.keys: frozenset[str] = frozenset()

    def update(self, keys: Iterable[str]) -> tuple[list[str], list[str]]:
        """Make ``keys`` the ones that hold; returns those that started and those that ended,
        each sorted."""
        new = frozenset(keys)
        started = sorted(new - self.keys)
        ended = sorted(self.keys - new)
        self.keys = new
        return started, ended


class Bug:
    """An unexpected error (a bug, not bad input: that is handled where it arises) caught at
    ``where`` and survived, since a bug must not become a restart loop under
    ``Restart=on-failure``.  Each distinct error is one line (its traceback at debug); it is
    held as the agent's trouble until the next run goes through."""

    def __init__(self, log: EventLog, where: str) -> None:
        self.log = log
        self.where = where
        self._condition: Condition[str] = Condition()

    @property
    def reason(self) -> str | None:
        """The error, while it holds."""
        return self._condition.value

    def caught(self, e: Exception) -> None:
        """Hold ``e``; logs it unless it is the one already held."""
        reason = f"{type(e).__name__}: {e}"[:300]
        if self._condition.update(reason) is not None:
            self.log(logging.ERROR, None, f"internal error {self.where}, carrying on: {reason}")
            self.log.logger.debug("the internal error's traceback", exc_info=True)

    def passed(self) -> bool:
        """The run went through; returns whether that ended a held error."""
        return self._condition.update(None) is Edge.ENDED
