"""The sources of facts, one package per area, and the one seam each implements: :class:`Source`.

A tick (:class:`gpuagent.views.Tick`) is filled by the sources in the order that
:mod:`gpuagent.sources.sequence` declares; each :meth:`Source.step` reads the fields of the
sources before it (and the previous tick) and returns its :class:`Outcome`: the view that
becomes its field of the tick, the findings it hands to the verdict, and its trouble.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpuagent.views import Finding

if TYPE_CHECKING:
    # Annotations only: importing any module of sources/ runs this package first.
    from gpuagent.config import Config
    from gpuagent.views import Tick

__all__ = ["EVERY", "Findings", "Outcome", "Source", "Unread"]

# A verdict source's findings by PCI slot (``""``: the host's).
Findings = Mapping[str, list[Finding]]
# The slots a verdict source could not read this time, each with why (``"nvidia-smi is not
# found"``); :data:`EVERY` stands for all of them, and ``""`` for a slot read all the same.
Unread = Mapping[str, str]
EVERY = "*"


@dataclass(frozen=True)
class Outcome:
    """What one source made of a tick: ``view`` its field of the tick (``None``: it has none),
    ``findings`` by verdict source (``smi``, ``xid``, ...; a source left out keeps its last
    findings), ``trouble`` the agent's own by kind (the state's ``problems``; ``None``:
    none of that kind now), and ``unread`` by verdict source the slots it could not read
    (:data:`Unread`): what it last found there holds, as last seen, until a read."""

    view: object = None
    findings: Mapping[str, Findings] = field(default_factory=dict)
    trouble: Mapping[str, str | None] = field(default_factory=dict)
    unread: Mapping[str, Unread] = field(default_factory=dict)


class Source(Protocol):
    """One source of facts: ``name`` is its field of the tick (where it has a view).  A
    source subclasses this and overrides, of the rest, only what it needs."""

    name: str

    def step(self, tick: Tick) -> Outcome:
        """This tick's facts; never raises for bad input (the agent guards a bug)."""
        ...

    def standing(self) -> object:
        """The view as it stands between ticks, where it is not the last tick's: before the
        first tick what the source starts from, after a reload what it changed (``None``: the
        last tick's holds)."""
        return None

    @property
    def backlog(self) -> bool:
        """Whether something is left to read between ticks (a flood of records at start)."""
        return False

    def read_backlog(self) -> None:
        """Read on for one slice of the backlog (between ticks, while there is one)."""
        return

    def waits_on(self) -> int | None:
        """A descriptor readable when the source may have news between ticks (the journal's
        inotify, the system bus connection), or ``None``: nothing to wait on now."""
        return None

    def news(self) -> bool:
        """Its descriptor was readable: take in what came, without waiting, and say whether
        the source has news for an event step (:mod:`gpuagent.events`)."""
        return False

    def reset(self, old: Config, new: Config) -> None:
        """A reload: ``old`` replaced by ``new`` (drop what no longer holds)."""
        return

    def expedite(self) -> None:
        """Read on the next tick, whatever the cadence had counted ("look now")."""
        return

    def close(self) -> None:
        """The end of the run: close what the source holds open."""
        return
