"""One tick: PCI scan -> kernel log -> gates and probe -> samples -> verdict -> report.

The agent orchestrates; each source of facts owns its memory and its "log once" (the bus,
the kernel's records, the probe, the samples), the verdict settles their findings, and the
tick returns one immutable :class:`~gpuagent.report.Report` from which every output is drawn.
Clock, sysfs root, the nvidia-smi lookup, the journal and the prober are injected, so tests
drive ticks by hand.  ``docs/architecture.md`` has the picture.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace

from . import __version__, report
from .bus import Bus
from .condition import Bug
from .config import Config
from .earlier import EarlierBoots
from .kernel import KernelSource
from .kernlog import KernelLog
from .known import KnownGpus
from .logs import EventLog
from .probe import Prober, lookup
from .probing import Probing
from .samples import Samples
from .state import SCHEMA
from .verdict import Verdict
from .views import BusView

__all__ = ["Agent"]


class Agent:
    """The sources, the verdict and the tick count; :meth:`tick` advances them by one tick."""

    def __init__(
        self,
        config: Config,
        prober: Prober,
        log: EventLog,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        which: Callable[[str], str | None] = lookup,
        kernel_log: Callable[[str], KernelLog] = KernelLog,
        state_directory: str | None = None,
    ) -> None:
        self.config = config
        self.wall = wall
        self.origin = report.Origin(SCHEMA, __version__, os.getpid(), wall(), config.interval)
        self.ticks = 0
        self.bus = Bus(config.sysfs_root, log)
        self.kernel = KernelSource(config.journal_directory, log, open_log=kernel_log)
        self.probing = Probing(config, prober, log, which=which, wall=wall)
        self.samples = Samples(log, monotonic=monotonic, wall=wall)
        self.verdict = Verdict(log)
        self.known = KnownGpus(state_directory, log)
        self.earlier = EarlierBoots(
            config.journal_directory, config.history_days, config.recurrence_boots
        )
        self.bus.remember(self.known.gpus)
        self._bug = Bug(log, "in a tick")

    def configure(self, config: Config | None = None) -> report.Report:
        """Apply a reloaded config (``None``: keep the current one) and look now: the next
        tick probes whatever the backoff had counted.  Counters, samples and the outage's
        failure count survive it.  Returns the report as it stands."""
        if config is not None:
            self.bus.configure(config.sysfs_root)
            self.probing.configure(config)
            self.kernel.configure(config.journal_directory)
            self.origin = replace(self.origin, interval=config.interval)
            self.config = config
        self.probing.expedite()
        return self._report()

    def tick(self, scanned: Callable[[str], None] | None = None) -> report.Report:
        """Run one tick and return its report.  ``scanned`` is called with the status line
        once the bus is scanned (before a probe that may hang: the first tick's READY=1).

        Never raises: bad sysfs, journal and nvidia-smi input is handled where it arises, and
        an unexpected error is logged once and held as the ``internal`` trouble."""
        self.ticks += 1
        try:
            bus = self.bus.scan()
            # Whatever the gates say: a GPU the driver cannot reach still has its Xids.
            found, uuids = self.kernel.poll(bus.slots), self.kernel.xids.uuids(bus.slots)
            self.verdict.report("xid", self.earlier.escalate(found, uuids, self.kernel.cleared))
            bus = self._remember(bus)
            if scanned is not None:
                scanned(self._report().status)
                scanned = None
            answer = self.probing.step(bus)
            if self.probing.gated:
                # What nvidia-smi said no longer holds once it cannot be asked.
                self.verdict.report("smi", {})
                self.samples.forget()
            elif answer is not None:
                found = self.samples.take(answer, bus.gpus)
                self.verdict.report("smi", self.earlier.recur(found, uuids))
            self.samples.mark_stale(bus.gpus, self.config.interval)
            self.verdict.judge(self.wall(), bus, self.config.expected_gpus, self.kernel.cleared)
        except Exception as e:  # noqa: BLE001 - see Bug
            self._bug.caught(e)
            if scanned is not None:
                # READY=1 comes after the first scan; without one, systemd must hear it anyway.
                scanned(self._report().status)
        else:
            self._bug.passed()
        return self._report()

    def _remember(self, bus: BusView) -> BusView:
        """Forget the GPUs root said left for good; remember those on the bus now."""
        gone = self.kernel.take_forgotten()
        if gone:
            self.known.forget(gone)
            bus = self.bus.forget(gone)
        uuids = self.kernel.xids.uuids(bus.slots)
        rows = self.samples.view.samples
        present: dict[str, dict[str, str | None]] = {}
        for slot in bus.slots:
            row = rows[slot].fields if slot in rows else {}
            uuid, name = row.get("uuid") or uuids.get(slot), row.get("name")
            present[slot] = {
                "uuid": uuid if isinstance(uuid, str) else None,
                "name": name if isinstance(name, str) else None,
            }
        self.known.update(present)
        return bus

    def _report(self) -> report.Report:
        trouble = {
            "sysfs": self.bus.trouble,
            "journal": self.kernel.error,
            "internal": self._bug.reason,
            "known_gpus": self.known.error,
        }
        view = self.bus.view
        return report.build(
            self.origin,
            now=self.wall(),
            ticks=self.ticks,
            bus=view,
            probe=self.probing.view,
            samples=self.samples.view,
            kernel=self.kernel.view(view.slots),
            problems=self.verdict.problems(),
            trouble={k: v for k, v in trouble.items() if v is not None},
            history=self.earlier.summary,
        )
