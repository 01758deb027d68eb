"""One agent per state file: the lock beside it, released by the kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuagent.edges.lock import AlreadyRunning, StateLock, lock_path


def test_a_second_holder_is_told_the_first_one_s_pid(tmp_path: str) -> None:
    state = os.path.join(tmp_path, "state.json")
    first, second = StateLock(), StateLock()
    assert first.acquire(state) is None
    with pytest.raises(AlreadyRunning, match=rf"already running \(pid {os.getpid()}\)") as e:
        second.acquire(state)
    assert e.value.pid == os.getpid()
    assert os.stat(lock_path(state)).st_mode & 0o777 == 0o600
    first.release()
    assert second.acquire(state) is None
    second.release()


def test_the_kernel_releases_a_dead_holder_s_lock(tmp_path: str) -> None:
    state = os.path.join(tmp_path, "state.json")
    code = (
        "import os, sys; from gpuagent.edges.lock import StateLock\n"
        f"StateLock().acquire({state!r}); os._exit(0)\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=30, env={**os.environ, "PYTHONPATH": repo}
    )
    # The dead holder's pid is still in the file; nothing reads it as a claim.
    lock = StateLock()
    assert lock.acquire(state) is None
    lock.release()


def test_moving_the_state_file_moves_the_lock(tmp_path: str) -> None:
    a, b = os.path.join(tmp_path, "a.json"), os.path.join(tmp_path, "b.json")
    lock = StateLock()
    lock.acquire(a)
    assert lock.acquire(b) is None
    other = StateLock()
    assert other.acquire(a) is None  # a was given up
    with pytest.raises(AlreadyRunning):
        other.acquire(b)  # ...and the failed try kept a
    with pytest.raises(AlreadyRunning):
        StateLock().acquire(a)
    lock.release()
    other.release()


def test_no_directory_to_lock_in_is_said_not_raised(tmp_path: str) -> None:
    state = os.path.join(tmp_path, "absent", "state.json")
    assert StateLock().acquire(state) == f"cannot open {state}.lock: No such file or directory"


def test_another_user_s_lock_is_an_agent_already_running(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service's lock is its dynamic user's, mode 0600: a second agent run by an ordinary
    user cannot even open it, and must stop there rather than run without it."""
    state = os.path.join(tmp_path, "state.json")
    StateLock().acquire(state)  # the service's, left in place
    real_open = os.open

    def denied(path: str, flags: int, mode: int = 0o777) -> int:
        if path == lock_path(state):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(AlreadyRunning, match="already running as another user"):
        StateLock().acquire(state)
    os.unlink(lock_path(state))
    assert StateLock().acquire(state) is not None  # no lock file and no right to make one
