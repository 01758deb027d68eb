"""One long-lived child in its own process group, read without waiting (nvidia-smi's loop
mode, ``-lms``).

Each :meth:`LoopChild.lines` takes what the child has written since the last call, as whole
lines (a line still being written waits for its end); it never blocks.  :meth:`stop` sends
the group SIGTERM, then SIGKILL at most ``grace`` seconds later, and returns a child that
outlived both (uninterruptible sleep in the driver) for the caller to keep as stuck, as
:class:`~gpuagent.edges.runner.Runner` keeps a probe's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable

from gpuagent.edges.runner import spawn

__all__ = ["LoopChild"]

_READ_CHUNK = 65536
# Polling step while waiting for a killed child to exit.
_POLL_STEP = 0.02


class LoopChild:
    """At most one child at a time; ``max_line`` bytes without a newline end its output as
    garbage (:attr:`overflowed`), ``keep`` the most whole lines one call returns (the newest:
    after a long stop of the agent only the last samples matter)."""

    def __init__(
        self,
        *,
        max_line: int = 1 << 16,
        keep: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_line = max_line
        self.keep = keep
        self.clock = clock
        self.proc: subprocess.Popen[bytes] | None = None
        self.overflowed = False
        self._partial = b""

    @property
    def running(self) -> bool:
        """Whether a child was started and not stopped (it may have exited by itself)."""
        return self.proc is not None

    def start(self, argv: list[str], env: dict[str, str] | None) -> OSError | None:
        """Start ``argv`` in the environment ``env`` (None: this process's) in a session of
        its own, stdout and stderr on one pipe; the error where it cannot be started."""
        self.overflowed, self._partial = False, b""
        try:
            self.proc = spawn(argv, env)
        except OSError as e:
            return e
        if self.proc.stdout is not None:  # always, with stdout=PIPE
            os.set_blocking(self.proc.stdout.fileno(), False)
        return None

    def lines(self) -> list[str]:
        """The whole lines written since the last call (at most :attr:`keep`, the newest),
        without waiting; at the end of its output the last line even without a newline."""
        if self.proc is None or self.proc.stdout is None:
            return []
        data = bytearray(self._partial)
        eof = False
        while True:
            try:
                chunk = self.proc.stdout.read(_READ_CHUNK)
            except BlockingIOError:
                break
            if chunk is None:
                break
            if not chunk:
                eof = True
                break
            data += chunk
        *whole, rest = bytes(data).split(b"\n")
        if eof and rest:
            whole, rest = [*whole, rest], b""
        if len(rest) > self.max_line:
            self.overflowed, rest = True, b""
        self._partial = rest
        return [w.decode("utf-8", errors="replace") for w in whole[-self.keep :]]

    def exit_code(self) -> int | None:
        """The child's exit status once it has exited (``None``: running, or none)."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, grace: float) -> subprocess.Popen[bytes] | None:
        """End the child's group (SIGTERM, then SIGKILL after ``grace`` s) and forget it;
        returns the child where it outlived the SIGKILL (stuck in the driver), else None."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.stdout is not None:
            proc.stdout.close()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                if _exited(proc, grace, self.clock):
                    break
        # Whatever it left in its group must not outlive it either.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return None if proc.poll() is not None else proc


def _exited(proc: subprocess.Popen[bytes], grace: float, clock: Callable[[], float]) -> bool:
    end = clock() + grace
    while proc.poll() is None:
        if clock() >= end:
            return False
        time.sleep(_POLL_STEP)
    return True
