"""The NVLink source: each GPU's links and their error counters, on their own cadence; the
tick's ``nvlink``, read after the probe and only while it answers (for some GPU).

Owns the reader (:mod:`gpuagent.sources.nvlink.nvlinkread`, through the probe's runner), the
judgement (:class:`gpuagent.sources.nvlink.nvlink.Watch`) and the links up this boot kept on
disk across restarts (:class:`gpuagent.sources.nvlink.linksup.LinksUp`); logs an outage once,
its end once, and each unreadable line once.  A GPU missing from the probe's answer stops
only its own read: the others' go on, and its last links are kept, stale
(:mod:`gpuagent.sources.partial`).  Its findings (``nvlink_down``,
``nvlink_errors``) go to the verdict as source ``nvlink`` after each successful read only:
between reads the last ones hold.

A failing or stuck nvidia-smi gets no more children: the read would fail for the reason
already said, and the last read holds.  Where ``nvidia-smi nvlink`` fails as a whole for the
one GPU it cannot reach, that is the read's failure, said once as any other.  Once a gate keeps
the probe off, what the links said no longer holds (as for nvidia-smi's own findings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from logging import INFO, WARNING

from gpuagent.config import Config
from gpuagent.edges.cadence import Cadence
from gpuagent.edges.runner import Runner
from gpuagent.health import CRITICAL
from gpuagent.logs import Event, EventLog
from gpuagent.schema import ProbeState
from gpuagent.sources import Findings, Outcome, Source, partial
from gpuagent.sources.nvlink import nvlink
from gpuagent.sources.nvlink.linksup import LinksUp
from gpuagent.sources.nvlink.nvlink import GpuState, Parsed
from gpuagent.sources.nvlink.nvlinkread import Reader
from gpuagent.views import Finding, NvlinkGpu, NvlinkView, Row, Tick

__all__ = ["LOOP_PERIOD", "SPAWN_PERIOD", "NvlinkSource", "period"]

# The reads' period (s) with nvlink_interval unset: once a minute under spawns; every 5
# minutes under nvidia-smi's loop, where a link's fault is told first by the kernel's Xid 74
# (and a critical Xid reads at once) and the probe's fabric fields every tick
# (docs/sampler.md).
SPAWN_PERIOD = 60.0
LOOP_PERIOD = 300.0


class NvlinkSource(Source):
    """Reads through ``runner`` (the probe's); the links up this boot (``boot`` its id) kept
    in ``state_directory``."""

    name = "nvlink"

    def __init__(
        self,
        config: Config,
        runner: Runner,
        log: EventLog,
        *,
        monotonic: Callable[[], float],
        state_directory: str | None = None,
        boot: str = "",
    ) -> None:
        self.runner = runner
        self.log = log
        self.monotonic = monotonic
        cadence = Cadence(*_cadence(config))
        self.reader = Reader(runner, cadence=cadence, sysfs_root=config.sysfs_root)
        self.on_fault = config.sampler == "loop"
        # When a critical Xid last made the reads due: a storm of them reads at most once a
        # SPAWN_PERIOD, what spawns cost anyway.
        self.fault_read_at = -SPAWN_PERIOD
        self.watch = nvlink.Watch(
            config.nvlink_window, config.nvlink_recovery_budget, config.nvlink_replay_budget
        )
        # $STATE_DIRECTORY: what was up before a restart in this boot (``boot``, its id) is
        # still "up earlier".
        self.links_up = LinksUp(state_directory, log, boot=boot)
        self.watch.remember(self.links_up.links)
        self._view = NvlinkView({})
        self._carried: frozenset[str] = frozenset()

    def reset(self, old: Config, new: Config) -> None:
        """A reload: the new cadence and budgets; what the links did this boot stays."""
        config = new
        self.reader.cadence.configure(*_cadence(config))
        self.reader.sysfs_root = config.sysfs_root
        self.on_fault = config.sampler == "loop"
        self.watch.window = config.nvlink_window
        self.watch.recovery_budget = config.nvlink_recovery_budget
        self.watch.replay_budget = config.nvlink_replay_budget

    def expedite(self) -> None:
        self.reader.expedite()

    @property
    def view(self) -> NvlinkView:
        return self._view

    def step(self, tick: Tick) -> Outcome:
        probe = tick.probe
        found: Findings | None = None
        if probe.gate is not None:
            found = {}
        elif probe.state is ProbeState.OK:
            if self.on_fault and any(h.severity == CRITICAL for h in tick.kernel.heard):
                # Under the loop the reads are minutes apart: the links of a fault now.
                now = self.monotonic()
                if now - self.fault_read_at >= SPAWN_PERIOD:
                    self.fault_read_at = now
                    self.reader.expedite()
            # A GPU missing from the answer stops only its own read: the others go on.
            missing = probe.samples.missing
            rows = [s.fields for s in probe.samples.samples.values()]
            slots = partial.answering(tick.bus, missing)
            found = self.read(probe.binary, slots, rows, missing)
            stale = partial.stale(self._view.gpus, self._carried, missing)
            if stale != self._view.stale:
                self._view = replace(self._view, stale=stale)
        return Outcome(
            self._view,
            {} if found is None else {"nvlink": found},
            {"nvlink_links": self.links_up.error},
        )

    def read(
        self,
        binary: str | None,
        slots: Iterable[str],
        rows: Iterable[Row],
        missing: Iterable[str] = (),
    ) -> dict[str, list[Finding]] | None:
        """This tick's read for the GPUs at ``slots`` with nvidia-smi at ``binary``; ``rows``
        the GPUs' last samples (to name them by slot), ``missing`` the GPUs the probe's
        answer left out (their last links are kept, stale).  Returns the findings by slot
        after a read that answered, else None (the last findings hold)."""
        read = self.reader.tick(binary, slots)
        spawns = self._view.spawns_total + read.spawns
        if read.warn:
            self.log(WARNING, Event.NVLINK_READ_FAILED, f"NVLink not read: {read.failure}")
        if read.recovered:
            self.log(INFO, Event.NVLINK_READ_RECOVERED, "NVLink read again")
        for line in read.warnings:
            self.log(WARNING, Event.NVLINK_UNREADABLE, line)
        if read.status is None:
            self._view = replace(self._view, no_nvlink=read.no_nvlink, spawns_total=spawns)
            return None
        self.watch.status(read.status)
        self.links_up.update(self.watch.links_up)
        if read.counters is not None:
            self.watch.counters(self.monotonic(), read.counters)
        by_key = nvlink.slots_by_key(rows)
        gpus, self._carried = partial.carry(
            self._view.gpus, _gpus(read.status, read.counters, by_key), missing
        )
        self._view = NvlinkView(gpus, read.no_nvlink, spawns, self._carried)
        return nvlink.findings_by_slot(self.watch.findings(), by_key)


def period(config: Config) -> float:
    """The reads' period (s): ``nvlink_interval``; unset: :data:`SPAWN_PERIOD`,
    :data:`LOOP_PERIOD` under ``sampler = "loop"``."""
    unset = LOOP_PERIOD if config.sampler == "loop" else SPAWN_PERIOD
    return config.nvlink_interval or unset


def _cadence(config: Config) -> tuple[float, float, int, float]:
    """The read's period, the tick, the failures before the backoff and the longest gap."""
    return period(config), config.interval, config.backoff_after, config.retry_max


def _gpus(status: Parsed, counters: Parsed | None, slots: dict[str, str]) -> dict[str, NvlinkGpu]:
    counted = {g.key: g.counters for g in counters.gpus} if counters is not None else {}
    out: dict[str, NvlinkGpu] = {}
    for gpu in status.gpus:
        if gpu.state is GpuState.LINKS and gpu.links:
            inactive = tuple(link.number for link in gpu.links if not link.up)
            links = len(gpu.links)
        elif gpu.state is GpuState.ALL_INACTIVE:
            inactive, links = (), 0
        else:
            continue  # MIG: unknown; no NVLink: nothing to show
        out[slots.get(gpu.key, gpu.key)] = NvlinkGpu(links, inactive, counted.get(gpu.key, {}))
    return out
