"""Run one child in its own process group with a timeout, without ever wedging the caller.

On timeout the group gets SIGTERM, then SIGKILL at most ``kill_grace`` seconds later; however
a run ends, the group gets a last SIGKILL, so no grandchild left in it outlives the run.  A
child that still does not exit (uninterruptible sleep in the driver) is abandoned: it is kept
as :attr:`Runner.stuck`, no second child is started while it lives, and it is reaped on a
later call once it has exited.  Output beyond ``max_output`` bytes ends the run.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuagent.compat import StrEnum

__all__ = ["Outcome", "RunResult", "Runner", "spawn"]

_READ_CHUNK = 65536
# Polling step when the kernel offers no pidfd (only then).
_POLL_STEP = 0.05


class Outcome(StrEnum):
    """How a run ended."""

    EXITED = "exited"
    TIMEOUT = "timeout"
    STUCK = "stuck"
    OVERFLOW = "overflow"
    INTERRUPTED = "interrupted"
    SPAWN_FAILED = "spawn_failed"


@dataclass(frozen=True)
class RunResult:
    """The end of a run: ``exit_code`` only for ``EXITED``; ``error`` for a failed spawn."""

    outcome: Outcome
    exit_code: int | None = None
    stdout: str = ""
    error: OSError | None = None
    duration: float = 0.0


class Runner:
    """Runs children one at a time.

    ``heartbeat`` is called at least every ``heartbeat_every`` seconds while waiting (the
    watchdog keeps being fed during a hang).  When ``wake_fd`` becomes readable it is drained
    and ``interrupted()`` asked whether to give up now (SIGTERM during a probe).
    """

    def __init__(
        self,
        *,
        timeout: float,
        kill_grace: float = 1.0,
        max_output: int = 1 << 20,
        clock: Callable[[], float] = time.monotonic,
        heartbeat: Callable[[], None] = lambda: None,
        heartbeat_every: float = 1.0,
        wake_fd: int | None = None,
        interrupted: Callable[[], bool] = lambda: False,
    ) -> None:
        self.timeout = timeout
        self.kill_grace = kill_grace
        self.max_output = max_output
        self.clock = clock
        self.stuck: subprocess.Popen[bytes] | None = None
        self.heartbeat = heartbeat
        self.heartbeat_every = heartbeat_every
        self.wake_fd = wake_fd
        self.interrupted = interrupted

    def busy(self) -> bool:
        """Whether an abandoned child is still alive; reaps it once it has exited."""
        if self.stuck is None:
            return False
        if self.stuck.poll() is None:
            return True
        self.stuck = None
        return False

    def kill_stuck(self) -> None:
        """SIGKILL the abandoned child's group again (at shutdown); never waits."""
        if self.stuck is not None:
            _killpg(self.stuck.pid, signal.SIGKILL)

    def run(self, argv: list[str], env: dict[str, str] | None) -> RunResult:
        """Run ``argv`` in the environment ``env`` (None: this process's) to completion,
        timeout, overflow or interruption.

        Raises ``RuntimeError`` if called while :meth:`busy`.
        """
        if self.busy():
            raise RuntimeError("a previous child is still running")
        started = self.clock()
        try:
            proc = spawn(argv, env)
        except OSError as e:
            return RunResult(Outcome.SPAWN_FAILED, error=e)
        with _Watch(proc, self.wake_fd) as watch:
            outcome = self._collect(proc, watch, started)
            stdout = bytes(watch.buf).decode("utf-8", errors="replace")
            if outcome is not Outcome.EXITED:
                outcome = self._terminate(proc, watch, outcome)
            # Grandchildren left in the group must not outlive the probe, also one that
            # ignored the SIGTERM its parent died of.
            _killpg(proc.pid, signal.SIGKILL)
        code = proc.returncode if outcome is Outcome.EXITED else None
        return RunResult(outcome, code, stdout, duration=self.clock() - started)

    def _collect(self, proc: subprocess.Popen[bytes], watch: _Watch, started: float) -> Outcome:
        deadline = started + self.timeout
        exited_at: float | None = None
        while True:
            now = self.clock()
            if exited_at is not None and (watch.eof or now >= exited_at + self.kill_grace):
                # A grandchild may hold the pipe after the child exited: take what came.
                return Outcome.EXITED
            if now >= deadline:
                return Outcome.TIMEOUT
            until = deadline if exited_at is None else min(deadline, exited_at + self.kill_grace)
            watch.wait(min(until - now, self.heartbeat_every))
            self.heartbeat()
            if watch.overflowed(self.max_output):
                return Outcome.OVERFLOW
            if watch.woken and self.interrupted():
                return Outcome.INTERRUPTED
            if exited_at is None and proc.poll() is not None:
                exited_at = self.clock()

    def _terminate(self, proc: subprocess.Popen[bytes], watch: _Watch, why: Outcome) -> Outcome:
        # At shutdown there is no time for a polite SIGTERM first.
        sigs = [signal.SIGKILL] if why is Outcome.INTERRUPTED else [signal.SIGTERM, signal.SIGKILL]
        for sig in sigs:
            _killpg(proc.pid, sig)
            if watch.wait_exit(self.kill_grace, self.clock):
                proc.wait()
                return why
        self.stuck = proc
        return Outcome.STUCK if why is Outcome.TIMEOUT else why


def spawn(argv: list[str], env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the environment ``env`` (None: this process's) in a session of its
    own (its group is killed as one), stdout and stderr on one pipe; raises ``OSError``."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        close_fds=True,
    )


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


class _Watch:
    """The selector over the child's stdout, its pidfd and the wake fd."""

    def __init__(self, proc: subprocess.Popen[bytes], wake_fd: int | None) -> None:
        if proc.stdout is None:
            raise ValueError("the child's stdout must be a pipe")
        self.proc = proc
        self.out = proc.stdout
        self.buf = bytearray()
        self.eof = False
        self.woken = False
        self.sel = selectors.DefaultSelector()
        os.set_blocking(self.out.fileno(), False)
        self.sel.register(self.out.fileno(), selectors.EVENT_READ, "out")
        self.pidfd: int | None
        try:
            self.pidfd = os.pidfd_open(proc.pid)
            self.sel.register(self.pidfd, selectors.EVENT_READ, "exit")
        except OSError:
            self.pidfd = None
        self.wake_fd = wake_fd
        if wake_fd is not None:
            self.sel.register(wake_fd, selectors.EVENT_READ, "wake")

    def __enter__(self) -> _Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sel.close()
        self.out.close()
        if self.pidfd is not None:
            os.close(self.pidfd)

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for output, exit or a wake-up; read what is there."""
        if self.pidfd is None and not self.eof:
            timeout = min(timeout, _POLL_STEP)
        self.woken = False
        for key, _ in self.sel.select(max(timeout, 0.0)):
            if key.data == "out":
                self._read()
            elif key.data == "wake":
                self.woken = True
                _drain(key.fd)
            elif key.data == "exit":
                # Level-triggered once the child is gone: stop listening, poll() knows.
                self.sel.unregister(key.fd)

    def _read(self) -> None:
        try:
            chunk = self.out.read(_READ_CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            self.eof = True
            self.sel.unregister(self.out.fileno())
            return
        self.buf += chunk

    def overflowed(self, limit: int) -> bool:
        return len(self.buf) > limit

    def wait_exit(self, timeout: float, clock: Callable[[], float]) -> bool:
        """Wait up to ``timeout`` s for the child to exit, ignoring its output."""
        end = clock() + timeout
        while self.proc.poll() is None:
            left = end - clock()
            if left <= 0:
                return False
            if self.pidfd is not None:
                with selectors.DefaultSelector() as sel:
                    sel.register(self.pidfd, selectors.EVENT_READ)
                    sel.select(left)
            else:
                time.sleep(min(left, _POLL_STEP))
        return True


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass
