"""The tick loop: a fixed grid on the monotonic clock, signals, sd_notify, the state file and
the Prometheus textfile.

SIGTERM and SIGINT stop the loop (within 2 s even mid-probe); SIGHUP reloads the config
(a bad file is logged and the old config kept; a good one ends the agent problem ``config``
of a start on a bad file's valid settings) and probes at once, whatever the backoff had
counted.  The watchdog is fed from this loop itself, also while a probe hangs and when the
interval is longer than the watchdog period.  What of this boot's kernel records the first
tick left unread (a flood) is read on before the next, in slices, with the watchdog fed and
SIGTERM heeded between them.  Between ticks the loop also waits on the journal and the system
bus: their news runs an event step (:mod:`.events`), off the grid.  One agent runs per state
file (:mod:`.lock`).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from collections.abc import Callable
from types import FrameType

from gpuagent import __version__, config
from gpuagent.agent import Agent
from gpuagent.edges.lock import EX_RUNNING, AlreadyRunning, StateLock
from gpuagent.edges.runner import Runner
from gpuagent.events import Pace, Waits
from gpuagent.evidence import ask
from gpuagent.logs import Event, EventLog, setup
from gpuagent.notify import Notifier, watchdog_period
from gpuagent.publish import Publisher
from gpuagent.report import Report
from gpuagent.schedule import deadline, next_index
from gpuagent.sources.probe.probe import Prober

__all__ = ["CONFIG", "Daemon", "reloaded"]

# The agent problem of a run on a bad file's valid settings, until a reload reads good ones.
CONFIG = "config"

# Fraction of the watchdog period between pings; systemd asks for at most half.
_PING_FRACTION = 0.4


class Signals:
    """SIGTERM and SIGINT ask to stop, SIGHUP to reload; each also wakes the loop and a probe
    in progress through :attr:`wake_fd`."""

    def __init__(self) -> None:
        self.stop = False
        self.reload = False
        self.wake_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def install(self) -> None:
        """Handle the three signals from now on (main thread only)."""
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self.reload = True
        else:
            self.stop = True

    def drain(self) -> None:
        """Empty the wake-up pipe."""
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except BlockingIOError:
            pass


class Watchdog:
    """Sends ``WATCHDOG=1`` every :data:`_PING_FRACTION` of systemd's watchdog period."""

    def __init__(self, notifier: Notifier, monotonic: Callable[[], float]) -> None:
        period = watchdog_period()
        self.notifier = notifier
        self.monotonic = monotonic
        self.every = period * _PING_FRACTION if period else None
        self.next_ping = 0.0

    @property
    def heartbeat_every(self) -> float:
        """How often a hung probe must call :meth:`ping_if_due` (s): a quarter of the ping
        period keeps the gap under half the watchdog."""
        return self.every / 4 if self.every else 1.0

    def ping_if_due(self) -> None:
        """Send ``WATCHDOG=1`` if the ping period has passed since the last one."""
        if self.every is None:
            return
        now = self.monotonic()
        if now >= self.next_ping:
            self.notifier.watchdog()
            self.next_ping = now + self.every


def reloaded(path: str) -> str:
    """The reload's line for config file ``path``: a missing optional file is the defaults
    (and its drop-ins), not a file read."""
    if os.path.lexists(path):
        return f"configuration reloaded from {path}"
    return f"configuration reloaded ({path}: no such file, the defaults and its drop-ins apply)"


class Daemon:
    """Runs an :class:`Agent` on the tick grid until stopped or ``ticks`` have run."""

    def __init__(
        self,
        cfg: config.Config,
        config_file: tuple[str, bool],
        *,
        notifier: Notifier | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        log: EventLog | None = None,
        interval: float | None = None,
        load: Callable[[str, bool], config.Config] | None = None,
        problem: str | None = None,
    ) -> None:
        # ``load`` reads the config on reload (run's RunConfig; config.load by default).
        # ``problem``: why ``cfg`` is a bad file's valid settings (the agent problem config).
        self.load_config = load or (lambda path, required: config.load(path, required=required))
        # ``interval`` (run --interval) overrides the file's, on reloads too.
        self.interval_override = interval
        if interval is not None:
            cfg = config.with_interval(cfg, interval)
        self.config = cfg
        self.config_file = config_file
        self.notifier = notifier or Notifier()
        self.monotonic = monotonic
        self.log = log or EventLog()
        self.watchdog = Watchdog(self.notifier, monotonic)
        self.signals = Signals()
        # Monotonic time of the last tick a reload ran out of turn (None: none yet).
        self._looked_at: float | None = None
        self.lock = StateLock()
        self.runner = Runner(
            timeout=cfg.probe_timeout,
            clock=monotonic,
            heartbeat=self.watchdog.ping_if_due,
            heartbeat_every=self.watchdog.heartbeat_every,
            wake_fd=self.signals.wake_fd,
            interrupted=lambda: self.signals.stop,
        )
        # StateDirectory=gpuagent: where the GPUs this host had are remembered.
        remembered = os.environ.get("STATE_DIRECTORY", "").split(":")[0] or None
        self.agent = Agent(
            cfg, Prober(self.runner), self.log, monotonic=monotonic, state_directory=remembered
        )
        self.agent.flag(CONFIG, problem)
        # The agent's requests for root's evidence bundles (the service only).
        asks = ask.for_runtime(os.environ, self.log)
        self.publisher = Publisher(cfg.state_file, cfg.textfile, self.log, self.notifier, asks)
        self.waits = Waits(self.agent.sources, self.agent.news)
        self.pace = Pace()
        # The last tick's report (None before the first tick).
        self.report: Report | None = None

    # Loop ----------------------------------------------------------------------------------

    def run(self, ticks: int | None = None) -> int:
        """Run until SIGTERM/SIGINT or ``ticks`` ticks; returns the exit status: 0, or
        :data:`~gpuagent.edges.lock.EX_RUNNING` when another agent has the state file (then nothing
        was touched)."""
        refused = self.start()
        if refused is not None:
            return refused
        start, index = self.monotonic(), 0
        while True:
            report = self.step()
            if self.signals.stop or (ticks is not None and report.ticks >= ticks):
                break
            if self._read_boot():
                continue  # what the rest of the boot's records make is said at once
            if self.signals.stop:
                break
            index = next_index(start, self.config.interval, index, self.monotonic())
            # A reload ticks at once and starts the grid over from there; a second reload
            # within an interval keeps the grid (a SIGHUP storm must not turn into a tick
            # storm) unless it changes the interval: then the next tick is one new interval
            # from now.
            while not self._wait_until(deadline(start, self.config.interval, index)):
                if not self.signals.reload:
                    break
                interval = self.config.interval
                if self.reload():
                    start, index = self.monotonic(), 0
                    break
                if self.config.interval != interval:
                    start, index = self.monotonic(), 1
            if self.signals.stop:
                break
        return self.finish("ticks" if not self.signals.stop else "signal")

    def start(self, *, install_signals: bool = True) -> int | None:
        """Take the state file's lock, handle signals (``install_signals``) and say so in the
        journal; returns :data:`~gpuagent.edges.lock.EX_RUNNING` when another agent has the state
        file."""
        try:
            problem = self.lock.acquire(self.config.state_file)
        except AlreadyRunning as e:
            self.log(logging.ERROR, None, f"not starting: {e}")
            return EX_RUNNING
        if problem is not None:
            self.log(logging.WARNING, None, f"running without the state file's lock: {problem}")
        if install_signals:
            self.signals.install()
        self.log(
            logging.INFO,
            Event.STARTED,
            f"gpuagent {__version__} started: tick every {self.config.interval:g} s",
        )
        self._warn(self.config)
        return None

    def step(self) -> Report:
        """One tick and its outputs; the first one sends READY=1 once the bus is scanned."""
        first = self.report is None
        self.report = self.agent.tick(
            scanned=self.notifier.ready if first else None, published=self.publisher.trouble
        )
        self.publisher.publish(self.report)
        self.watchdog.ping_if_due()
        self.pace.ticked()
        if first:
            self.log(logging.INFO, None, f"first tick: {self.report.status}")
        return self.report

    def event_step(self) -> Report:
        """An event step (news between ticks) and its one publication."""
        self.report = self.agent.event(published=self.publisher.trouble)
        self.publisher.publish(self.report)
        self.watchdog.ping_if_due()
        self.pace.ran(self.monotonic())
        return self.report

    def _read_boot(self) -> bool:
        """Read on this boot's kernel records that the tick left (a flood of them) in slices
        of :data:`~gpuagent.sources.kernel.kernel.SLICE` s, pinging the watchdog and heeding SIGTERM
        between them; True when it read to the end (a tick is due now), False when there was
        nothing left to read or it was asked to stop."""
        if not self.agent.backlog:
            return False
        while self.agent.backlog and not self.signals.stop:
            self.agent.read_backlog()
            self.watchdog.ping_if_due()
        self.signals.drain()
        return not self.signals.stop

    def _wait_until(self, when: float) -> bool:
        """Sleep until ``when`` (monotonic s), pinging the watchdog and running an event step
        for the news the sources' descriptors bring; True if asked to stop."""
        while not self.signals.stop and not self.signals.reload:
            self.watchdog.ping_if_due()
            now = self.monotonic()
            if now >= when:
                return False
            if self.pace.ready(now):
                self.event_step()
                continue
            until = min(when, self.watchdog.next_ping) if self.watchdog.every else when
            # While a step is due, or within a gap of the last wake-up, what comes waits: a
            # storm, news or not, wakes the loop once a gap.
            rest = self.pace.listen(now)
            waited = self.waits.fds() if rest is None else {}
            if rest is not None:
                until = min(until, rest)
            fds = [self.signals.wake_fd, *waited]
            ready, _, _ = select.select(fds, [], [], max(until - now, 0.0))
            if self.signals.wake_fd in ready:
                self.signals.drain()
            if any(fd in waited for fd in ready):
                self.pace.woke(self.monotonic())
            if self.waits.news(ready, waited):
                self.pace.news()
        return self.signals.stop

    def reload(self) -> bool:
        """Reload the config (SIGHUP); returns whether to tick now ("look now": the operator
        may have fixed what the probe was failing on), which is at most once per interval."""
        self.signals.reload = False
        self.notifier.reloading()
        now = self.monotonic()
        look = self._looked_at is None or now - self._looked_at >= self.config.interval
        then = "probing now" if look else "probing on the next tick (a reload just probed)"
        path, required = self.config_file
        cfg: config.Config | None = None
        try:
            cfg = self._load_for_reload(path, required)
        except (config.ConfigError, AlreadyRunning) as e:
            self.log(
                logging.ERROR,
                Event.CONFIG_ERROR,
                f"reload failed, keeping the old config: {e}; {then}",
            )
        else:
            self.config = cfg
            self.agent.flag(CONFIG, None)
            self.publisher.configure(cfg.state_file, cfg.textfile)
            setup(cfg.log_level)
            self.log(logging.INFO, Event.RELOADED, f"{reloaded(path)}; {then}")
            self._warn(cfg)
        report = self.agent.configure(cfg)
        if look:
            self._looked_at = now
        self.notifier.ready(report.status)
        return look

    def _warn(self, cfg: config.Config) -> None:
        for warning in config.warnings(cfg):
            self.log(logging.WARNING, None, warning)

    def _load_for_reload(self, path: str, required: bool) -> config.Config:
        cfg = self.load_config(path, required)
        if self.interval_override is not None:
            cfg = config.with_interval(cfg, self.interval_override)
        if cfg.state_file != self.config.state_file:
            problem = self.lock.acquire(cfg.state_file)
            if problem is not None:
                self.log(logging.WARNING, None, f"running without the state file's lock: {problem}")
        return cfg

    def finish(self, reason: str) -> int:
        """End the run (``reason``: ``ticks`` or ``signal``): the textfile goes, the state
        file says the agent stopped, the system bus is let go, the lock is released.
        Returns 0."""
        if reason == "signal":
            self.notifier.stopping()
            self.log(logging.INFO, Event.STOPPING, "stopping on signal")
        self.runner.kill_stuck()
        self.agent.close()
        if self.report is not None:
            self.publisher.finish(self.report, reason, time.time())
        self.lock.release()
        return 0
