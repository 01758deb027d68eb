"""The tick loop: a fixed grid on the monotonic clock, signals, sd_notify, the state file and
the Prometheus textfile.

SIGTERM and SIGINT stop the loop (within 2 s even mid-probe); SIGHUP reloads the config
(a bad file is logged and the old config kept) and probes at once, whatever the backoff had
counted.  The watchdog is fed from this loop itself, also while a probe hangs and when the
interval is longer than the watchdog period.  One agent runs per state file (:mod:`.lock`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from types import FrameType

from . import __version__, config, state
from .agent import Agent
from .lock import EX_RUNNING, AlreadyRunning, StateLock
from .logs import Event, EventLog, setup
from .metrics import Textfile
from .notify import Notifier, watchdog_period
from .probe import Prober
from .runner import Runner
from .schedule import deadline, next_index

__all__ = ["Daemon"]

# Fraction of the watchdog period between pings; systemd asks for at most half.
_PING_FRACTION = 0.4


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
    ) -> None:
        # ``load`` reads the config on reload (run's RunConfig; config.load by default).
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
        period = watchdog_period()
        self.ping_every = period * _PING_FRACTION if period else None
        self.next_ping = 0.0
        self.stop_requested = False
        self.reload_requested = False
        # Monotonic time of the last tick a reload ran out of turn (None: none yet).
        self._looked_at: float | None = None
        self.lock = StateLock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        runner = Runner(timeout=cfg.probe_timeout, clock=monotonic)
        runner.wake_fd = self._wake_r
        runner.interrupted = lambda: self.stop_requested
        runner.heartbeat = self.ping_if_due
        # A quarter of the ping period between looks keeps the gap under half the watchdog.
        runner.heartbeat_every = self.ping_every / 4 if self.ping_every else 1.0
        self.agent = Agent(cfg, Prober(runner), self.log, monotonic=monotonic)
        self._state_error: str | None = None
        self.textfile = Textfile(cfg.textfile, self.log)

    # Signals -------------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self.reload_requested = True
        else:
            self.stop_requested = True

    def _install_signals(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    # Watchdog ------------------------------------------------------------------------------

    def ping_if_due(self) -> None:
        """Send ``WATCHDOG=1`` if the ping period has passed since the last one."""
        if self.ping_every is None:
            return
        now = self.monotonic()
        if now >= self.next_ping:
            self.notifier.watchdog()
            self.next_ping = now + self.ping_every

    # Loop ----------------------------------------------------------------------------------

    def run(self, ticks: int | None = None) -> int:
        """Run until SIGTERM/SIGINT or ``ticks`` ticks; returns the exit status: 0, or
        :data:`~gpuagent.lock.EX_RUNNING` when another agent has the state file (then nothing
        was touched)."""
        try:
            problem = self.lock.acquire(self.config.state_file)
        except AlreadyRunning as e:
            self.log(logging.ERROR, None, f"not starting: {e}")
            return EX_RUNNING
        if problem is not None:
            self.log(logging.WARNING, None, f"running without the state file's lock: {problem}")
        self._install_signals()
        self.log(
            logging.INFO,
            Event.STARTED,
            f"gpuagent {__version__} started: tick every {self.config.interval:g} s",
        )
        self._warn(self.config)
        self.agent.on_scanned = lambda: self.notifier.ready(self.agent.status_line())
        start, index = self.monotonic(), 0
        while True:
            self._tick()
            self._publish()
            if self.agent.ticks == 1:
                self.log(logging.INFO, None, f"first tick: {self.agent.status_line()}")
            if self.stop_requested or (ticks is not None and self.agent.ticks >= ticks):
                break
            index = next_index(start, self.config.interval, index, self.monotonic())
            # A reload ticks at once and starts the grid over from there; a second reload
            # within an interval keeps the grid (a SIGHUP storm must not turn into a tick
            # storm) unless it changes the interval: then the next tick is one new interval
            # from now.
            while not self._wait_until(deadline(start, self.config.interval, index)):
                if not self.reload_requested:
                    break
                interval = self.config.interval
                if self._reload():
                    start, index = self.monotonic(), 0
                    break
                if self.config.interval != interval:
                    start, index = self.monotonic(), 1
            if self.stop_requested:
                break
        return self._finish("ticks" if not self.stop_requested else "signal")

    def _tick(self) -> None:
        try:
            self.agent.tick()
        except Exception as e:  # noqa: BLE001 - see below
            # A bug must not become a restart loop under Restart=on-failure.
            # Every known bad input is handled in the agent; this is for the unknown one.
            self._internal("internal", "in a tick", e)
            if self.agent.on_scanned is not None:
                # READY=1 comes after the first scan; without one, systemd must hear it anyway.
                self.agent.on_scanned()
                self.agent.on_scanned = None
        else:
            self.agent.problems.pop("internal", None)

    def _wait_until(self, when: float) -> bool:
        """Sleep until ``when`` (monotonic s), pinging the watchdog; True if asked to stop."""
        while not self.stop_requested and not self.reload_requested:
            self.ping_if_due()
            now = self.monotonic()
            if now >= when:
                return False
            until = min(when, self.next_ping) if self.ping_every else when
            ready, _, _ = select.select([self._wake_r], [], [], max(until - now, 0.0))
            if ready:
                _drain(self._wake_r)
        return self.stop_requested

    def _internal(self, key: str, where: str, e: Exception) -> None:
        """Log an unexpected error once per distinct one (traceback at debug) and hold it as
        problem ``key``; the next tick tries again."""
        reason = f"{type(e).__name__}: {e}"[:300]
        if self.agent.problems.get(key) != reason:
            self.log(logging.ERROR, None, f"internal error {where}, carrying on: {reason}")
            self.log.logger.debug("the internal error's traceback", exc_info=True)
        self.agent.problems[key] = reason

    def _publish(self) -> None:
        try:
            snapshot = self.agent.snapshot()
            self._write_state(snapshot)
            self._write_metrics(snapshot)
            self.notifier.status(snapshot["status"])
        except Exception as e:  # noqa: BLE001 - see below
            # As in a tick: I/O errors are handled where they happen; this is for a bug in
            # turning the state into the outputs, which must not stop the watchdog either.
            self._internal("internal_publish", "writing the state and metrics", e)
        else:
            if self.agent.problems.pop("internal_publish", None) is not None:
                # The state file just written still reports the error: write it without.
                self._write_state(self.agent.snapshot())
        self.ping_if_due()

    def _write_state(self, snapshot: dict[str, object]) -> None:
        path = self.agent.config.state_file
        try:
            state.write(path, snapshot)
            if self._state_error is not None:
                # The file just written still reports the write failure: write it without.
                self.agent.problems.pop("state_file", None)
                state.write(path, self.agent.snapshot())
        except OSError as e:
            reason = f"{path}: {e.strerror or e}"
            if reason != self._state_error:
                self.log(
                    logging.ERROR,
                    Event.STATE_WRITE_FAILED,
                    f"cannot write the state file {reason}; sampling goes on",
                )
            self._state_error = reason
            self.agent.problems["state_file"] = reason
            return
        if self._state_error is not None:
            self.log(logging.INFO, Event.STATE_WRITE_RECOVERED, f"state file {path} written again")
            self._state_error = None

    def _write_metrics(self, snapshot: dict[str, object]) -> None:
        self.textfile.write(snapshot)
        if self.textfile.problem is None:
            self.agent.problems.pop("textfile", None)
        else:
            self.agent.problems["textfile"] = self.textfile.problem

    def _reload(self) -> bool:
        """Reload the config; returns whether to tick now ("look now": the operator may have
        fixed what the probe was failing on), which is at most once per interval."""
        self.reload_requested = False
        self.notifier.reloading()
        now = self.monotonic()
        look = self._looked_at is None or now - self._looked_at >= self.config.interval
        then = "probing now" if look else "probing on the next tick (a reload just probed)"
        path, required = self.config_file
        try:
            cfg = self._load_for_reload(path, required)
        except (config.ConfigError, AlreadyRunning) as e:
            self.log(
                logging.ERROR,
                Event.CONFIG_ERROR,
                f"reload failed, keeping the old config: {e}; {then}",
            )
        else:
            if cfg.state_file != self.config.state_file:
                # Nothing updates the old file any more: it would read as a hung agent.
                with contextlib.suppress(OSError):
                    os.unlink(self.config.state_file)
            self.config = cfg
            self.agent.configure(cfg)
            self.textfile.configure(cfg.textfile)
            setup(cfg.log_level)
            self.log(logging.INFO, Event.RELOADED, f"configuration reloaded from {path}; {then}")
            self._warn(cfg)
        self.agent.backoff.expedite()
        if look:
            self._looked_at = now
        self.notifier.ready(self.agent.status_line())
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

    def _finish(self, reason: str) -> int:
        if reason == "signal":
            self.notifier.stopping()
            self.log(logging.INFO, Event.STOPPING, "stopping on signal")
        self.agent.prober.runner.kill_stuck()
        self.textfile.remove()
        snapshot = self.agent.snapshot()
        snapshot["exit"] = {"reason": reason, "at": snapshot["updated_at"]}
        with contextlib.suppress(OSError):
            state.write(self.agent.config.state_file, snapshot)
        self.lock.release()
        return 0


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
