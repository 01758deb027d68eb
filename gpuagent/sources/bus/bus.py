"""The PCI bus as the agent remembers it: the GPUs on it now, every slot ever seen on it, and
why sysfs could not be read.

Owns the scan's "log once": a sysfs problem is one error line when it first appears, GPUs that
appear after the first scan one info line.  The scan itself is
:class:`gpuagent.sources.bus.pci.Scanner`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpuagent.condition import ConditionSet
from gpuagent.logs import Event, EventLog
from gpuagent.sources.bus import pci
from gpuagent.views import BusView, plural

__all__ = ["Bus"]


class Bus:
    """Scans ``<sysfs_root>/bus/pci/devices`` once a tick and logs what changed."""

    def __init__(self, sysfs_root: str, log: EventLog) -> None:
        self.log = log
        self.scanner = pci.Scanner(sysfs_root)
        self.view = BusView()
        self._scans = 0
        self._trouble = ConditionSet()

    def configure(self, sysfs_root: str) -> None:
        """Scan ``sysfs_root`` from now on: another bus, whose GPUs are new (the old ones did
        not leave it)."""
        if sysfs_root != self.scanner.root:
            self.scanner = pci.Scanner(sysfs_root)
            self.view = replace(self.view, seen=frozenset(), not_back=frozenset(), gone_since={})

    def scan(self) -> BusView:
        """Scan the bus; returns (and keeps as :attr:`view`) what it found."""
        self._scans += 1
        gpus, problems = self.scanner.scan()
        started, _ = self._trouble.update(problems)
        for problem in started:
            self.log(logging.ERROR, Event.SYSFS_PROBLEM, problem)
        new = sorted(g.slot for g in gpus if g.slot not in self.view.seen)
        if new and self._scans > 1:
            self.log(
                logging.INFO,
                None,
                f"{plural(len(new), 'NVIDIA GPU')} appeared on the PCI bus ({', '.join(new)}); "
                f"{len(gpus)} on it now",
            )
        present = {g.slot for g in gpus}
        self.view = BusView(
            tuple(gpus),
            self.view.seen | frozenset(new),
            tuple(problems),
            pci.module_loaded(self.scanner.root),
            self.view.not_back - present,
            {s: t for s, t in self.view.gone_since.items() if s not in present},
        )
        return self.view

    def describe(self, slot: str) -> str:
        """What sits at PCI ``slot`` per sysfs (:func:`gpuagent.sources.bus.pci.describe`)."""
        return pci.describe(self.scanner.root, slot)

    def remember(
        self,
        slots: Iterable[str],
        not_back: Iterable[str] = (),
        gone_since: Mapping[str, float] | None = None,
    ) -> None:
        """Count ``slots`` as seen on the bus (the GPUs this host had before a restart), of
        them ``not_back`` last on it in an earlier boot (until they are on it again), and
        ``gone_since`` when those missing were first found missing (wall s)."""
        self.view = replace(
            self.view,
            seen=self.view.seen | frozenset(slots),
            not_back=self.view.not_back | frozenset(not_back),
            gone_since={**self.view.gone_since, **(gone_since or {})},
        )

    def forget(self, slots: Iterable[str]) -> BusView:
        """Forget that ``slots`` were ever seen (they left for good); returns the view."""
        gone = frozenset(slots)
        self.view = replace(
            self.view,
            seen=self.view.seen - gone,
            not_back=self.view.not_back - gone,
            gone_since={s: t for s, t in self.view.gone_since.items() if s not in gone},
        )
        return self.view

    @property
    def trouble(self) -> str | None:
        """Why sysfs could not be read (the state's ``problems["sysfs"]``), while it cannot."""
        return "; ".join(self.view.problems) or None
