"""One agent per state file: a ``flock`` on ``STATE_FILE.lock``, beside the state file.

The kernel releases the lock when its holder exits or dies (the descriptor is close-on-exec,
so not even a stuck nvidia-smi keeps it), so a crashed agent never blocks
the next one and nothing has to decide whether a recorded pid is stale.  The holder writes
its pid into the file only so that a second agent can say whom it met.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

from gpuagent.edges import safefile

__all__ = ["EX_RUNNING", "AlreadyRunning", "NotALock", "StateLock", "lock_path"]

# EX_TEMPFAIL: the other agent will exit some day; systemd's Restart= may try again.
EX_RUNNING = 75


class AlreadyRunning(Exception):
    """Another agent holds the lock; ``pid`` is its pid, or None if it has not written it or
    the lock is another user's (``foreign``: the service's user, say)."""

    def __init__(self, path: str, pid: int | None, *, foreign: bool = False) -> None:
        if foreign:
            text = f"already running as another user: {path} is not ours to lock"
        else:
            who = f"pid {pid}" if pid is not None else "pid unknown"
            text = f"already running ({who}): {path} is locked"
        super().__init__(text)
        self.pid = pid


class NotALock(AlreadyRunning):
    """The lock's path holds a symlink, a FIFO or anything else that is not a regular file:
    locking through it would lock (and overwrite) some other file, and let a second agent run
    on the same state file."""

    def __init__(self, path: str, why: str) -> None:
        Exception.__init__(self, f"{path} is {why}: not locking through it")
        self.pid = None


def lock_path(state_file: str) -> str:
    """The lock file of ``state_file``."""
    return f"{state_file}.lock"


class StateLock:
    """Holds the lock of one state file (or none, where its directory cannot be written)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.path: str | None = None

    def acquire(self, state_file: str) -> str | None:
        """Lock ``state_file``'s lock file, then release the one held before; returns None, or
        why no lock could be taken (the directory is missing or not ours to write; the state
        file cannot be written there either, so there is nothing to protect).

        Raises :class:`AlreadyRunning` when another process holds it, or when it is another
        user's lock file, and :class:`NotALock` when it is not a regular file (a symlink is
        never followed); the old lock is kept.
        """
        path = lock_path(state_file)
        if path == self.path:
            return None
        try:
            # 0600: a lock any user could open is a lock any user could hold against the agent.
            fd = safefile.opened(path, os.O_RDWR | os.O_CREAT, 0o600)
        except PermissionError as e:
            if os.path.lexists(path):
                # Another user's lock: that user's agent owns the state file beside it.
                raise AlreadyRunning(path, None, foreign=True) from None
            return f"cannot open {path}: {e.strerror or e}"
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EINVAL, errno.EISDIR, errno.ENXIO):
                raise NotALock(path, e.strerror or "not a regular file") from None
            return f"cannot open {path}: {e.strerror or e}"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = _read_pid(fd)
            os.close(fd)
            raise AlreadyRunning(path, pid) from None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.release()
        self.fd, self.path = fd, path
        return None

    def release(self) -> None:
        """Give the lock up (closing the descriptor drops it); the file stays, empty of
        meaning: removing it could let two agents lock two different files of one name."""
        if self.fd is not None:
            os.close(self.fd)
        self.fd = self.path = None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
