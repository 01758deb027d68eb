"""The PCI scan as a source: the GPUs on the bus now and why sysfs could not be read.

Owns the scan's "log once": a sysfs problem is one error line when it first appears, GPUs that
appear after the first scan one info line.  The scan itself is
:class:`gpuagent.sources.bus.pci.Scanner`; what the bus had before (``seen``, ``not_back``,
``gone_since``) is the previous tick's ``bus`` view, kept by :mod:`gpuagent.sources.bus.had`.
"""

from __future__ import annotations

import logging

from gpuagent.condition import ConditionSet
from gpuagent.config import Config
from gpuagent.logs import Event, EventLog
from gpuagent.sources import Outcome, Source
from gpuagent.sources.bus import pci
from gpuagent.views import BusView, Tick, plural

__all__ = ["BusScan"]


class BusScan(Source):
    """Scans ``<sysfs_root>/bus/pci/devices`` once a tick and logs what changed: the tick's
    ``scan``."""

    name = "scan"

    def __init__(self, sysfs_root: str, log: EventLog) -> None:
        self.log = log
        self.scanner = pci.Scanner(sysfs_root)
        self._scans = 0
        self._trouble = ConditionSet()
        self._afresh = False

    def reset(self, old: Config, new: Config) -> None:
        """Scan another bus from now on, whose GPUs are new (the old ones did not leave it)."""
        if new.sysfs_root != self.scanner.root:
            self.scanner = pci.Scanner(new.sysfs_root)
            self._afresh = True

    def step(self, tick: Tick) -> Outcome:
        self._scans += 1
        had = BusView() if self._afresh else tick.last.bus
        self._afresh = False
        gpus, problems = self.scanner.scan()
        started, _ = self._trouble.update(problems)
        for problem in started:
            self.log(logging.ERROR, Event.SYSFS_PROBLEM, problem)
        new = sorted(g.slot for g in gpus if g.slot not in had.seen)
        if new and self._scans > 1:
            self.log(
                logging.INFO,
                None,
                f"{plural(len(new), 'NVIDIA GPU')} appeared on the PCI bus ({', '.join(new)}); "
                f"{len(gpus)} on it now",
            )
        present = {g.slot for g in gpus}
        view = BusView(
            tuple(gpus),
            had.seen | frozenset(new),
            tuple(problems),
            pci.module_loaded(self.scanner.root),
            had.not_back - present,
            {s: t for s, t in had.gone_since.items() if s not in present},
        )
        # Why sysfs could not be read (the state's ``problems["sysfs"]``), while it cannot.
        return Outcome(view, trouble={"sysfs": "; ".join(problems) or None})
