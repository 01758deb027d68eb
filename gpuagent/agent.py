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
from typing import Protocol

from gpuagent import __version__, report
from gpuagent.condition import Bug
from gpuagent.config import Config
from gpuagent.edges import bootid
from gpuagent.logs import EventLog
from gpuagent.sources.bus.bus import Bus
from gpuagent.sources.bus.known import KnownGpus
from gpuagent.sources.driver.driverstate import DriverState
from gpuagent.sources.kernel.earlier import EarlierBoots
from gpuagent.sources.kernel.kernel import KernelSource
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.sources.nvlink.nvlinksource import NvlinkSource
from gpuagent.sources.probe.history import ThrottleWindow
from gpuagent.sources.probe.probe import Prober, lookup
from gpuagent.sources.probe.probing import Probing
from gpuagent.sources.probe.samples import Samples
from gpuagent.sources.processes.owners import PidLookup
from gpuagent.sources.processes.processes import ProcessesSource
from gpuagent.sources.services.services import Reader as UnitsReader
from gpuagent.sources.services.services import ServicesSource
from gpuagent.state import SCHEMA
from gpuagent.verdict import Verdict
from gpuagent.views import BusView, ProbeState

__all__ = ["Agent", "Systemd"]


class Systemd(UnitsReader, PidLookup, Protocol):
    """What answers for systemd (:class:`gpuagent.edges.systemd.units.Units`): NVIDIA's units'
    states and
    the unit of each process on a GPU."""


def _system_units(ping: Callable[[], None]) -> Systemd:
    from gpuagent.edges.systemd.units import Units  # noqa: PLC0415 - a run by hand without D-Bus never needs it

    return Units(ping=ping)


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
        units: Callable[[], Systemd] | None = None,
        state_directory: str | None = None,
        boot: Callable[[], str] = bootid.current,
    ) -> None:
        self.wall = wall
        self.origin = report.Origin(SCHEMA, __version__, os.getpid(), wall(), config.interval)
        self.ticks = 0
        self.bus = Bus(config.sysfs_root, log)
        self.kernel = KernelSource(
            config.journal_directory,
            log,
            open_log=kernel_log,
            overrides=config.xid,
            hold=config.xid_warning_hold,
            wall=wall,
            monotonic=monotonic,
        )
        self.probing = Probing(config, prober, log, which=which, wall=wall)
        window = ThrottleWindow(config.throttle_window, config.throttle_fraction)
        self.samples = Samples(log, monotonic=monotonic, wall=wall, throttle=window)
        self.driver = DriverState(config, monotonic=monotonic)
        self.verdict = Verdict(log, self.origin.started_at)
        this_boot = boot()
        self.nvlink = NvlinkSource(
            config,
            prober.runner,
            log,
            monotonic=monotonic,
            state_directory=state_directory,
            boot=this_boot,
        )
        # The runner's heartbeat feeds the watchdog: the bus calls of a tick feed it too.
        systemd = units() if units is not None else _system_units(prober.runner.heartbeat)
        self.services = ServicesSource(config.sysfs_root, log, reader=systemd, monotonic=monotonic)
        self.processes = ProcessesSource(config, prober.runner, log, lookup=systemd)
        self.known = KnownGpus(state_directory, log, this_boot)
        self.earlier = EarlierBoots(
            config.journal_directory, config.history_days, config.recurrence_boots
        )
        self.bus.remember(self.known.gpus, self.known.not_back, self.known.gone_since)
        self._bug = Bug(log, "in a tick")

    @property
    def config(self) -> Config:
        """The configuration in use (the probe's: it holds the one copy)."""
        return self.probing.config

    def configure(self, config: Config | None = None) -> report.Report:
        """Apply a reloaded config (``None``: keep the current one) and look now: the next
        tick probes whatever the backoff had counted.  Counters, samples and the outage's
        failure count survive it.  Returns the report as it stands."""
        if config is not None:
            self.bus.configure(config.sysfs_root)
            self.probing.configure(config)
            self.kernel.configure(config.journal_directory, config.xid, config.xid_warning_hold)
            self.driver.configure(config)
            self.samples.configure(config.throttle_window, config.throttle_fraction)
            self.nvlink.configure(config)
            self.services.configure(config.sysfs_root)
            self.processes.configure(config)
            self.origin = replace(self.origin, interval=config.interval)
        self.probing.expedite()
        self.nvlink.expedite()
        self.processes.expedite()
        return self._report()

    def close(self) -> None:
        """The end of the run: close what the sources hold open (the system bus)."""
        self.services.close()

    def tick(self, scanned: Callable[[str], None] | None = None) -> report.Report:
        """Run one tick and return its report.  ``scanned`` is called with the status line
        once the bus is scanned (before a probe that may hang: the first tick's READY=1).

        Never raises: bad sysfs, journal and nvidia-smi input is handled where it arises, and
        an unexpected error is logged once and held as the ``internal`` trouble."""
        self.ticks += 1
        try:
            bus = self.bus.scan()
            # Whatever the gates say: a GPU the driver cannot reach still has its Xids.
            self._xids(bus)
            bus = self._remember(bus)
            if scanned is not None:
                scanned(self._report().status)
                scanned = None
            self._services()
            answer = self.probing.step(bus)
            if self.probing.gated:
                # What nvidia-smi said no longer holds once it cannot be asked.
                self.verdict.report("smi", {})
                self.samples.forget()
            elif answer is not None:
                found = self.samples.take(answer, bus.gpus)
                found = self.earlier.recur(found, self.kernel.xids.uuids(bus.slots))
                self.verdict.report("smi", self.services.fold(found))
            self.samples.mark_stale(bus.gpus, self.config.interval)
            records = self.kernel.driver_records()
            self.verdict.report("driver", self.driver.findings(bus, self.probing.view, records))
            self._after_probe(bus)
            self.verdict.judge(self.wall(), bus, self.config.expected_gpus, self.kernel.cleared)
        except Exception as e:  # noqa: BLE001 - see Bug
            self._bug.caught(e)
            if scanned is not None:
                # READY=1 comes after the first scan; without one, systemd must hear it anyway.
                scanned(self._report().status)
        else:
            self._bug.passed()
        return self._report()

    def _xids(self, bus: BusView) -> None:
        found = self.kernel.poll(bus, self.samples.named, self.bus.describe, self.processes.who)
        uuids = self.kernel.xids.uuids(bus.slots)
        self.verdict.report("xid", self.earlier.escalate(found, uuids, self.kernel.cleared))

    def _services(self) -> None:
        # Before the probe: its fabric findings are folded under the fabric manager's state.
        rows = {slot: s.fields for slot, s in self.samples.view.samples.items()}
        self.verdict.report("persistence", self.services.step(rows))
        self.verdict.report("services", {"": self.services.host})

    def _after_probe(self, bus: BusView) -> None:
        """The reads that follow the probe's answer: NVLink, then who is on the GPUs."""
        if self.probing.gated:
            self.verdict.report("nvlink", {})  # as for nvidia-smi's own findings
            self.processes.forget()
            return
        if self.probing.view.state is not ProbeState.OK:
            self.processes.forget()
        if self.probing.view.state is not ProbeState.OK or self.samples.view.missing:
            # A failing or stuck nvidia-smi gets no more children, nor one that cannot reach
            # a GPU (lost): the read would fail for the reason already said.  The last holds.
            return
        rows = [s.fields for s in self.samples.view.samples.values()]
        slots = [g.slot for g in bus.probeable]
        found = self.nvlink.step(self.probing.binary, slots, rows)
        if found is not None:
            self.verdict.report("nvlink", found)
        self.processes.step(self.probing.binary, rows)

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
        self.known.update(present, self.wall())
        return bus

    def _report(self) -> report.Report:
        trouble = {
            "sysfs": self.bus.trouble,
            "journal": self.kernel.error,
            "system_bus": self.services.error,
            "internal": self._bug.reason,
            "known_gpus": self.known.error,
            "nvlink_links": self.nvlink.links_up.error,
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
            nvlink=self.nvlink.view,
            services=self.services.view,
            processes=self.processes.view,
            problems=self.verdict.problems(),
            trouble={k: v for k, v in trouble.items() if v is not None},
            history=self.earlier.summary,
        )
