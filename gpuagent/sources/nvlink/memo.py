"""What a function gave for each of the last few objects it was called with, by identity.

For what the tick draws from a view that lasts several ticks (NVLink is read one tick in
several): the work is done once per object, not once per tick.  Each object is kept beside
its result, so that its id is not reused while it is remembered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["ByIdentity"]

_K = TypeVar("_K")
_V = TypeVar("_V")


class ByIdentity(Generic[_K, _V]):
    """``make`` of each object, made once while it is among the last ``kept`` (then all are
    forgotten at once: a read's GPUs come and go together).  For objects that do not change
    (frozen views, the report's read-only state): a changed one would get its old result."""

    def __init__(self, make: Callable[[_K], _V], kept: int = 64) -> None:
        self.make = make
        self.kept = kept
        self._made: dict[int, tuple[_K, _V]] = {}

    def __call__(self, key: _K) -> _V:
        made = self._made.get(id(key))
        if made is not None and made[0] is key:
            return made[1]
        if len(self._made) >= self.kept:
            self._made.clear()
        value = self.make(key)
        self._made[id(key)] = (key, value)
        return value
