"""The kernel's records as a source: the tick's ``kernel``.

Two stages, in this order each tick: this boot's records (:class:`KernelRecords`: Xids, SXids,
the driver's records, root's clears), whatever the probe's gates say, then the earlier boots
(:class:`EarlierBoots`, read a slice a tick at start), which escalate the Xids that recur.
The view carries what later sources take from the records: the GPUs root said left for good,
what the records said about the driver, and the earlier boots' record of critical problems
(once read) for nvidia-smi's findings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from gpuagent.config import Config
from gpuagent.logs import EventLog
from gpuagent.sources import Outcome, Source
from gpuagent.sources.bus import pci
from gpuagent.sources.kernel.earlier import BOUND, EarlierBoots
from gpuagent.sources.kernel.earlierfile import KeptFile
from gpuagent.sources.kernel.kernel import KernelRecords
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.sources.kernel.recurrence import swaps
from gpuagent.sources.retention.store import lasts
from gpuagent.sources.victims.rule import WINDOW
from gpuagent.views import Tick, uuid_of

__all__ = ["Kernel"]


class Kernel(Source):
    """The journal in ``config.journal_directory``; ``open_log`` makes its reader; ``told``
    the counted Xids' lines logged before a restart (:class:`KernelRecords`); what was read of
    the earlier boots is kept in ``state_directory`` (None: nothing is kept)."""

    name = "kernel"

    def __init__(
        self,
        config: Config,
        log: EventLog,
        *,
        open_log: Callable[[str], KernelLog] = KernelLog,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        told: Iterable[tuple[str, str, int]] = (),
        state_directory: str | None = None,
    ) -> None:
        self.log = log
        self.records = KernelRecords(
            config.journal_directory,
            log,
            open_log=open_log,
            overrides=config.xid,
            hold=config.xid_warning_hold,
            wall=wall,
            monotonic=monotonic,
            told=told,
        )
        self.earlier = EarlierBoots(
            config.journal_directory,
            config.history_days,
            config.recurrence_boots,
            kept=KeptFile(state_directory, log),
            lasts=lambda: lasts("/", config.journal_directory),
        )
        # Whether the read's estimate past its bound was said (once a run).
        self._said_long = False
        # The records heard from then on are the victims' (a fault's teardown follows it
        # within WINDOW s: those of a fault just before the start count too).
        self._since = wall() - WINDOW

    def reset(self, old: Config, new: Config) -> None:
        self.records.configure(new.journal_directory, new.xid, new.xid_warning_hold)

    @property
    def backlog(self) -> bool:
        """Whether this boot's records are still being read (a flood at start)."""
        return self.records.reading

    def read_backlog(self) -> None:
        self.records.read()

    def waits_on(self) -> int | None:
        return self.records.waits_on()

    def news(self) -> bool:
        return self.records.news()

    def step(self, tick: Tick) -> Outcome:
        last = tick.last
        found = self.records.poll(
            tick.scan,
            last.probe.samples.samples,
            lambda slot: pci.describe(tick.config.sysfs_root, slot),
            last.processes.last_seen.get,
            lambda slot: pci.path_of(tick.config.sysfs_root, slot),
            rose=last.pcie.rose,
        )
        view = self.records.view(tick.scan.slots)
        samples = last.probe.samples
        uuids = {s: u for s in found if (u := uuid_of(s, view, samples)) is not None}
        swapped = swaps(last.bus, uuids, tick.now)
        # No tick judges a board before its identity is read: where the slot remembers a
        # board and the one there now has not said its UUID (no sample yet, no UUID line),
        # the earlier boots are not laid on it until it has.
        unknown = {s for s in found if s not in uuids and s not in swapped and s in last.bus.boards}
        known = {s: fs for s, fs in found.items() if s not in unknown}
        escalated = self.earlier.escalate(known, uuids, self.records.clears.cleared, swapped)
        found = {**escalated, **{s: found[s] for s in unknown}}
        self._say_how_long(tick.config.interval)
        view = replace(
            view,
            forgotten=tuple(self.records.take_forgotten()),
            driver=self.records.driver_records(),
            recurrence=self.earlier.recurrence if self.earlier.done else None,
            wear=self.earlier.wear,
            history=self.earlier.summary,
            # The victims' (gpuagent.sources.victims): a record from before this agent ran
            # was told by the agent of its time, or by none.
            heard=tuple(
                h for h in self.records.xids.take_heard(tick.scan.slots) if h.at >= self._since
            ),
        )
        return Outcome(view, {"xid": found}, {"journal": self.records.error})

    def _say_how_long(self, interval: float) -> None:
        """Once, where the earlier boots' read is estimated to take more than
        :data:`~gpuagent.sources.kernel.earlier.BOUND` slices (one a tick): how long."""
        left = self.earlier.left
        if self._said_long or left is None or left <= BOUND:
            return
        self._said_long = True
        self.log(
            logging.INFO,
            None,
            f"reading the earlier boots' records will take about {left * interval / 60:.0f} "
            "more minutes (a flood of the kernel's records at the driver's priority): "
            "recurrence and the wear trend wait for it; what is read is kept across restarts",
        )
