"""One tick: every source in the order :mod:`gpuagent.sources.sequence` declares, then the
verdict, then the report.

Each source of facts owns its memory and its "log once" and hands its view to the tick
(:class:`~gpuagent.views.Tick`); the verdict settles their findings, and the tick returns one
immutable :class:`~gpuagent.report.Report` from which every output is drawn.  Clock, sysfs
root, the nvidia-smi lookup, the journal and the prober are injected, so tests drive ticks by
hand.  ``docs/architecture.md`` has the picture.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TypeVar

from gpuagent import report
from gpuagent.condition import Bug
from gpuagent.config import Config
from gpuagent.edges import bootid
from gpuagent.evidence import found
from gpuagent.held import HeldProblems
from gpuagent.logs import EventLog
from gpuagent.sources import Source
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.sources.probe.probe import Prober, lookup
from gpuagent.sources.sequence import EVENT_STEP, READY_AFTER, Systemd, sources, system_units
from gpuagent.verdict import Verdict
from gpuagent.views import Tick

__all__ = ["Agent"]

S = TypeVar("S", bound=Source)


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
        self.wall, self.monotonic = wall, monotonic
        self.config = config
        self.origin = report.Origin.this_agent(wall(), config.interval)
        self.ticks = 0
        # The runner's heartbeat feeds the watchdog: the bus calls of a tick feed it too.
        systemd = units() if units is not None else system_units(prober.runner.heartbeat)
        this_boot = boot()
        # What the agent before this one left open this boot: restated, never paged again.
        self.held = HeldProblems(state_directory, log, boot=this_boot)
        self.sources: tuple[Source, ...] = sources(
            config,
            prober,
            log,
            systemd=systemd,
            monotonic=monotonic,
            wall=wall,
            which=which,
            kernel_log=kernel_log,
            state_directory=state_directory,
            boot=this_boot,
            absent_for=self.held.held_for("", "no_driver_module", wall()),
            told=self.held.told,
        )
        self.verdict = Verdict(log, self.origin.started_at, self.held.held)
        # The bundles root's unit gathered, which a critical problem names (the service only).
        self.evidence = (
            found.Found(os.path.join(state_directory, found.SUBDIRECTORY), log)
            if state_directory
            else None
        )
        self.last = self._standing(Tick(wall(), monotonic(), config))
        self.log = log
        self._bugs: dict[str, Bug] = {}
        self._bug = Bug(log, "in a tick")
        self._trouble: dict[str, str | None] = {}

    def source(self, kind: type[S]) -> S:
        """The agent's source of class ``kind``; raises KeyError where it has none."""
        for s in self.sources:
            if isinstance(s, kind):
                return s
        raise KeyError(kind.__name__)

    @property
    def backlog(self) -> bool:
        """Whether a source has something left to read between ticks."""
        return any(s.backlog for s in self.sources)

    def read_backlog(self) -> None:
        """Read one slice of each source's backlog."""
        for s in self.sources:
            if s.backlog:
                s.read_backlog()

    def flag(self, kind: str, reason: str | None) -> None:
        """Hold the agent's own trouble ``kind`` that no source has (the daemon's ``config``)
        with ``reason``, or end it (None), from the next report on."""
        self._trouble[kind] = reason

    def configure(self, config: Config | None = None) -> report.Report:
        """Apply a reloaded config (``None``: keep the current one) and look now: the next
        tick reads whatever the cadences and the backoff had counted.  Counters, samples and
        the outage's failure count survive it.  Returns the report as it stands."""
        if config is not None:
            old, self.config = self.config, config
            for s in self.sources:
                s.reset(old, config)
            self.origin = replace(self.origin, interval=config.interval)
        for s in self.sources:
            s.expedite()
        self.last = self._standing(self.last)
        return self._report(self.last)

    def _standing(self, tick: Tick) -> Tick:
        """``tick`` with the views of the sources whose view is not the tick's now."""
        for s in self.sources:
            if (view := s.standing()) is not None:
                tick = tick.with_view(s.name, view)
        return tick

    def close(self) -> None:
        """The end of the run: close what the sources hold open (the system bus)."""
        for s in self.sources:
            s.close()

    def tick(
        self,
        scanned: Callable[[str], None] | None = None,
        *,
        published: Mapping[str, str] | None = None,
    ) -> report.Report:
        """Run one tick and return its report.  ``scanned`` is called with the status line
        once the bus is known (before a probe that may hang: the first tick's READY=1);
        ``published`` is the publisher's trouble as the tick before left it, for the report.

        Never raises: bad sysfs, journal and nvidia-smi input is handled where it arises, and
        an unexpected error is logged once by the source it came from and held as the
        ``internal`` trouble, while the other sources go on."""
        self.ticks += 1
        return self._run(self.sources, scanned, published)

    def event(self, *, published: Mapping[str, str] | None = None) -> report.Report:
        """Run an event step (news between ticks, :mod:`gpuagent.events`): the sources of
        :data:`~gpuagent.sources.sequence.EVENT_STEP` and the verdict, the other sources'
        views the last tick's; not a tick (``ticks`` stays).  Never raises, as :meth:`tick`."""
        return self._run([s for s in self.sources if s.name in EVENT_STEP], None, published)

    def news(self, source: Source) -> bool:
        """Whether ``source``, its descriptor readable, has news for an event step; a bug
        in it is the ``internal`` trouble, and news (the step publishes it)."""
        where = f"in the {source.name} source's news"
        bug = self._bugs.setdefault(where, Bug(self.log, where))
        try:
            got = source.news()
        except Exception as e:  # noqa: BLE001 - see Bug
            bug.caught(e)
            return True
        bug.passed()
        return got

    def _run(
        self,
        steps: Iterable[Source],
        scanned: Callable[[str], None] | None,
        published: Mapping[str, str] | None,
    ) -> report.Report:
        tick = self.last.next(self.wall(), self.monotonic(), self.config)
        for source in steps:
            tick = self._step(source, tick)
            if scanned is not None and source.name == READY_AFTER:
                scanned(self._report(tick).status)
        self._judge(tick)
        self.last = tick
        return self._report(tick, published)

    def _judge(self, tick: Tick) -> None:
        try:
            self.verdict.judge(
                self.wall(),
                tick.bus,
                tick.config.expected_gpus,
                tick.kernel.cleared,
                uuid=tick.uuid,
                serial=tick.serial,
                causes=tick.kernel.causes,
            )
        except Exception as e:  # noqa: BLE001 - see Bug
            self._bug.caught(e)
        else:
            self._bug.passed()
            self.held.update(self.verdict.held(), tick.kernel.told)
            self._trouble["open_problems"] = self.held.error

    def _step(self, source: Source, tick: Tick) -> Tick:
        bug = self._bugs.get(source.name) or Bug(self.log, f"in a tick's {source.name} step")
        self._bugs[source.name] = bug
        try:
            outcome = source.step(tick)
            stepped = tick if outcome.view is None else tick.with_view(source.name, outcome.view)
        except Exception as e:  # noqa: BLE001 - see Bug
            bug.caught(e)
            return tick
        bug.passed()
        # A source that could not look whole (a boot's records read in part, a journal or
        # bus it cannot read) does not end what it found before the restart.
        complete = not source.backlog and not any(outcome.trouble.values())
        for kind in dict.fromkeys([*outcome.findings, *outcome.unread]):
            found, dark = outcome.findings.get(kind, {}), outcome.unread.get(kind)
            self.verdict.report(kind, found, complete=complete, unread=dark)
        self._trouble.update(outcome.trouble)
        return stepped

    def _report(self, tick: Tick, published: Mapping[str, str] | None = None) -> report.Report:
        bugs = [b.reason for b in (*self._bugs.values(), self._bug) if b.reason is not None]
        trouble = {**self._trouble, "internal": bugs[0] if bugs else None}
        problems = self.verdict.problems()
        return report.build(
            self.origin,
            now=self.wall(),
            ticks=self.ticks,
            bus=tick.bus,
            probe=tick.probe,
            samples=tick.probe.samples,
            kernel=tick.kernel,
            nvlink=tick.nvlink,
            services=tick.services,
            processes=tick.processes,
            vgpu=tick.vgpu,
            problems=problems,
            trouble={k: v for k, v in trouble.items() if v is not None},
            history=tick.kernel.history,
            published=published,
            evidence=self.evidence.named(problems) if self.evidence else found.NO_BUNDLES,
            drain=self.config.drain,
        )
