"""The process-group runner with real child processes (short timeouts, bounded in time)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from gpuagent.edges import runner as runner_mod
from gpuagent.edges import smirun
from gpuagent.edges.runner import Outcome, Runner

ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:  # reaped in between: ENOENT at open, ESRCH at read
        return False


def dies(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` is gone within ``timeout`` s (a SIGKILL takes effect when it is run)."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_exit_and_output() -> None:
    res = Runner(timeout=5).run(["/bin/sh", "-c", "echo 'a, b'; exit 3"], ENV)
    assert res.outcome is Outcome.EXITED
    assert res.exit_code == 3
    assert res.stdout == "a, b\n"


def test_stderr_is_read_with_stdout() -> None:
    res = Runner(timeout=5).run(["/bin/sh", "-c", "echo oops >&2"], ENV)
    assert res.stdout == "oops\n"


def test_environment_is_passed() -> None:
    res = Runner(timeout=5).run(["/bin/sh", "-c", "echo $LC_ALL"], ENV)
    assert res.stdout == "C\n"


@pytest.mark.parametrize("locale", [None, "de_DE.UTF-8", "C"])
def test_an_nvidia_tool_runs_in_the_c_locale_whatever_the_agents(
    monkeypatch: pytest.MonkeyPatch, locale: str | None
) -> None:
    if locale is None:
        monkeypatch.delenv("LC_ALL", raising=False)
    else:
        monkeypatch.setenv("LC_ALL", locale)
    monkeypatch.setenv("GPUAGENT_TEST_MARK", "kept")
    env = smirun.environment()
    # The unit's LC_ALL=C: inherited as it is, no copy made.
    assert (env is None) == (locale == "C")
    text = smirun.run(Runner(timeout=5), "/bin/sh", ("-c", "echo $LC_ALL $GPUAGENT_TEST_MARK"))
    assert text == "C kept\n"


def ready_clock(flag: str) -> Callable[[], float]:
    """A clock that stands at 0 until the child has written ``flag``, then runs in real time.

    The run's timeout counts from the moment the child is set up (its grandchild started,
    its SIGTERM handler in place), however long a busy machine takes to get there.
    """
    started: list[float] = []

    def clock() -> float:
        if not started:
            if not _written(flag):
                return 0.0
            started.append(time.monotonic())
        return time.monotonic() - started[0]

    return clock


def _written(path: str) -> bool:
    try:
        with open(path) as f:
            return f.read().endswith("\n")
    except FileNotFoundError:
        return False


def time_out_with_a_grandchild(tmp_path: str, grandchild: str, kill_grace: float) -> int:
    """Run a shell that starts ``grandchild`` in the background, writes its pid and hangs,
    until the runner times it out; returns the grandchild's pid."""
    flag = os.path.join(tmp_path, "grandchild")
    r = Runner(timeout=0.3, kill_grace=kill_grace, clock=ready_clock(flag))
    start = time.monotonic()
    res = r.run(["/bin/sh", "-c", f"{grandchild} & echo $! > {flag}; sleep 30"], ENV)
    assert res.outcome is Outcome.TIMEOUT
    assert time.monotonic() - start < 30  # not the child's 30 s
    assert not r.busy()
    with open(flag) as f:
        return int(f.read())


def test_hang_is_killed_with_its_group(tmp_path: str) -> None:
    assert dies(time_out_with_a_grandchild(tmp_path, "sleep 30", kill_grace=0.5))


def test_grandchild_ignoring_sigterm_gets_the_last_sigkill(tmp_path: str) -> None:
    # The child dies of the SIGTERM at once; its background grandchild ignores it.
    grandchild = "(trap '' TERM; exec sleep 30)"
    assert dies(time_out_with_a_grandchild(tmp_path, grandchild, kill_grace=5))


def test_child_ignoring_sigterm_gets_sigkill(tmp_path: str) -> None:
    flag = os.path.join(tmp_path, "ignoring")
    r = Runner(timeout=0.3, kill_grace=0.3, clock=ready_clock(flag))
    start = time.monotonic()
    res = r.run(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open(sys.argv[1], 'w').write('ready\\n'); time.sleep(30)",
            flag,
        ],
        ENV,
    )
    assert res.outcome is Outcome.TIMEOUT
    assert time.monotonic() - start < 30
    assert not r.busy()


def test_grandchild_holding_the_pipe_does_not_block() -> None:
    # The grandchild leaves the child's process group, so killpg cannot reach it.
    script = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid(); time.sleep(30); os._exit(0)\n"
        "print('0, 41', flush=True)\n"
    )
    r = Runner(timeout=5, kill_grace=0.3)
    start = time.monotonic()
    res = r.run([sys.executable, "-c", script], ENV)
    assert res.outcome is Outcome.EXITED
    assert res.exit_code == 0
    assert res.stdout == "0, 41\n"
    assert time.monotonic() - start < 10  # not the grandchild's 30 s
    assert not r.busy()


def test_flood_is_cut_off() -> None:
    r = Runner(timeout=5, max_output=1 << 16)
    res = r.run(["/usr/bin/yes"], ENV)
    assert res.outcome is Outcome.OVERFLOW
    assert len(res.stdout) <= (1 << 16) + 65536


@pytest.mark.parametrize(
    ("make", "error"),
    [("missing", FileNotFoundError), ("noexec", PermissionError), ("dir", PermissionError)],
)
def test_spawn_failures(tmp_path: str, make: str, error: type[OSError]) -> None:
    path = os.path.join(tmp_path, "nvidia-smi")
    if make == "noexec":
        with open(path, "w") as f:
            f.write("#!/bin/sh\n")
    elif make == "dir":
        os.mkdir(path)
    res = Runner(timeout=1).run([path], ENV)
    assert res.outcome is Outcome.SPAWN_FAILED
    assert isinstance(res.error, error)


def test_unkillable_child_is_abandoned_then_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without root no process can be put in D state; a killpg that reaches nobody looks the
    # same from here: the child outlives SIGTERM and SIGKILL.
    monkeypatch.setattr(runner_mod, "_killpg", lambda pgid, sig: None)
    r = Runner(timeout=0.2, kill_grace=0.1)
    res = r.run(["/bin/sleep", "30"], ENV)
    assert res.outcome is Outcome.STUCK
    assert r.busy()
    with pytest.raises(RuntimeError):
        r.run(["/bin/true"], ENV)
    stuck = r.stuck
    assert stuck is not None
    os.kill(stuck.pid, signal.SIGKILL)
    stuck.wait()
    assert not r.busy()
    assert r.stuck is None
    assert r.run(["/bin/true"], ENV).outcome is Outcome.EXITED


def test_interrupt_ends_the_run_at_once() -> None:
    rfd, wfd = os.pipe2(os.O_NONBLOCK)
    asked: list[int] = []

    def interrupted() -> bool:
        asked.append(1)
        return True

    r = Runner(timeout=30, kill_grace=0.5, wake_fd=rfd, interrupted=interrupted)
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 0.2; echo x"], stdout=wfd)
    start = time.monotonic()
    res = r.run(["/bin/sleep", "30"], ENV)
    proc.wait()
    assert res.outcome is Outcome.INTERRUPTED
    assert asked
    assert time.monotonic() - start < 10  # not the child's 30 s
    os.close(rfd)
    os.close(wfd)


def test_heartbeat_keeps_beating_during_a_hang() -> None:
    beats: list[float] = []
    r = Runner(
        timeout=2,
        kill_grace=0.1,
        heartbeat=lambda: beats.append(time.monotonic()),
        heartbeat_every=0.1,
    )
    start = time.monotonic()
    r.run(["/bin/sleep", "30"], ENV)
    # Beats all through the hang, never a gap anywhere near the 2 s the hang lasts.
    assert beats[0] - start < 1.0
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert len(beats) >= 5
    assert max(gaps) < 1.0
