"""``gpuagent run`` as a real process: sd_notify over a real socket, signals, watchdog.

Bounded in time: every wait has a deadline; nothing sleeps to let time pass.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gpuagent.daemon import reloaded
from tests import fakehost
from tests.fakehost import FakeHost

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Linux's SO_TIMESTAMPNS (asm-generic value; Python does not export it): the kernel stamps
# each datagram as it arrives, so gaps between pings are the agent's, not the test's own
# scheduling delays on a busy host.
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@ll")


class Notify:
    """A bound AF_UNIX datagram socket standing in for systemd's notify socket."""

    def __init__(self, path: str, abstract: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"gpuagent-test-{os.getpid()}-{id(self)}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            self.sock.bind(path)
            self.address = path
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.messages: list[tuple[float, str]] = []
        self.cursor = 0

    def pump(self, until: float) -> None:
        """Collect messages, each with its arrival in monotonic time, until ``until``."""
        while (left := until - time.monotonic()) > 0:
            ready, _, _ = select.select([self.sock], [], [], left)
            if ready:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(_TIMESPEC.size))
                arrived = time.monotonic()
                for level, kind, stamp in ancillary:
                    if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS):
                        sec, nsec = _TIMESPEC.unpack(stamp[: _TIMESPEC.size])
                        arrived -= time.time() - (sec + nsec / 1e9)
                self.messages.append((arrived, data.decode()))

    def wait_for(self, needle: str, timeout: float) -> None:
        """Wait for a message containing ``needle`` after the one the last wait found."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for i in range(self.cursor, len(self.messages)):
                if needle in self.messages[i][1]:
                    self.cursor = i + 1
                    return
            self.pump(min(end, time.monotonic() + 0.05))
        raise AssertionError(f"no {needle!r} within {timeout} s: {self.texts()}")

    def texts(self) -> list[str]:
        return [m for _, m in self.messages]


@pytest.fixture
def fake_host(tmp_path: str) -> FakeHost:
    return fakehost.create(str(tmp_path), 2, interval=1.0, probe_timeout=fakehost.PATIENT)


def start(host: FakeHost, notify: Notify, *args: str, **env: str) -> subprocess.Popen[str]:
    environ = {
        **os.environ,
        "NOTIFY_SOCKET": notify.address,
        "PYTHONPATH": REPO,
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gpuagent", "--config", host.conf, "run", *args],
        env=environ,
        stderr=subprocess.PIPE,
        text=True,
    )


def fake_smi_processes(host: FakeHost) -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if host.smi.encode() in cmd:
            pids.append(int(pid))
    return pids


@pytest.fixture(params=[False, True], ids=["path", "abstract"])
def notify(request: pytest.FixtureRequest, tmp_path: str) -> Iterator[Notify]:
    n = Notify(os.path.join(tmp_path, "notify.sock"), request.param)
    yield n
    n.sock.close()


def ticks(host: FakeHost) -> int:
    """The ticks the state file counts (0 before the first one's write)."""
    try:
        with open(os.path.join(host.dir, "state.json"), encoding="utf-8") as f:
            return int(json.load(f)["ticks"])
    except FileNotFoundError:
        return 0


def stop(proc: subprocess.Popen[str]) -> tuple[int, float]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=10)
    return code, time.monotonic() - t0


def test_ready_status_watchdog_reload_stopping(fake_host: FakeHost, notify: Notify) -> None:
    proc = start(fake_host, notify, WATCHDOG_USEC="1000000")
    try:
        notify.wait_for("READY=1", 15)
        first = notify.texts()[0]
        assert first.startswith("READY=1\nSTATUS=")
        notify.wait_for("STATUS=2 GPUs, sampling", 10)
        # The interval (1 s) is longer than half the watchdog period (0.5 s).
        notify.pump(time.monotonic() + 2.5)
        pings = [t for t, m in notify.messages if m == "WATCHDOG=1"]
        assert len(pings) >= 4
        # Never as late as the 1 s watchdog period, after which systemd kills the agent.
        assert max(b - a for a, b in itertools.pairwise(pings)) < 1.0
        # A STATUS line is sent when it changes, not every tick.
        assert sum(1 for m in notify.texts() if "STATUS=2 GPUs, sampling" in m) == 1
        proc.send_signal(signal.SIGHUP)
        notify.wait_for("RELOADING=1", 5)
        notify.wait_for("READY=1", 5)
        code, took = stop(proc)
        notify.pump(time.monotonic() + 0.2)
        assert "STOPPING=1" in notify.texts()
        assert code == 0
        assert took < 10  # systemd's stop timeout is 90 s
    finally:
        proc.kill()
        proc.wait()
    order = [m.split("=")[0] for m in notify.texts() if not m.startswith(("WATCHDOG", "STATUS"))]
    assert order == ["READY", "RELOADING", "READY", "STOPPING"]


def test_pings_continue_while_a_probe_hangs_and_sigterm_kills_it(
    fake_host: FakeHost, notify: Notify
) -> None:
    fake_host.scenario(hang=60, ignore_term=True)
    proc = start(fake_host, notify, WATCHDOG_USEC="600000")
    try:
        notify.wait_for("READY=1", 15)
        deadline = time.monotonic() + 10
        while not fake_smi_processes(fake_host) and time.monotonic() < deadline:
            notify.pump(time.monotonic() + 0.05)
        assert fake_smi_processes(fake_host)
        t_hang = time.monotonic()
        notify.pump(t_hang + 1.2)
        pings = [t for t, m in notify.messages if m == "WATCHDOG=1" and t >= t_hang]
        assert len(pings) >= 3
        # Never as late as the 0.6 s watchdog period, after which systemd kills the agent.
        assert max(b - a for a, b in itertools.pairwise(pings)) < 0.6
        code, took = stop(proc)
        assert code == 0
        assert took < 10  # not the probe's 60 s hang
        deadline = time.monotonic() + 10
        while fake_smi_processes(fake_host) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake_smi_processes(fake_host) == []
    finally:
        proc.kill()
        proc.wait()


def test_bad_config_on_reload_keeps_the_old_one(fake_host: FakeHost, notify: Notify) -> None:
    proc = start(fake_host, notify)
    try:
        notify.wait_for("STATUS=2 GPUs, sampling", 15)
        with open(fake_host.conf, "a") as f:
            f.write("interval = -1\n")
        proc.send_signal(signal.SIGHUP)
        notify.wait_for("RELOADING=1", 5)
        notify.wait_for("READY=1", 5)
        for _ in range(100):
            proc.send_signal(signal.SIGHUP)
        notify.pump(time.monotonic() + 1.5)
        assert proc.poll() is None
        code, _ = stop(proc)
        assert code == 0
    finally:
        proc.kill()
        proc.wait()
    assert proc.stderr is not None
    errors = [ln for ln in proc.stderr.read().splitlines() if ln.startswith("error:")]
    assert errors
    assert all("reload failed, keeping the old config" in ln for ln in errors), errors
    assert "Traceback" not in "".join(errors)
    with open(os.path.join(fake_host.dir, "state.json")) as f:
        final = json.load(f)
    assert final["interval"] == 1.0
    assert final["exit"]["reason"] == "signal"


def test_no_notify_socket_is_fine(fake_host: FakeHost) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuagent",
            "--config",
            fake_host.conf,
            "run",
            "--ticks",
            "2",
        ],
        env={**env, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(fake_host.dir, "state.json")) as f:
        final = json.load(f)
    assert final["ticks"] == 2
    assert final["exit"]["reason"] == "ticks"
    assert final["probe"]["state"] == "ok"


def test_a_sighup_storm_keeps_the_grid_and_the_interval_override(
    fake_host: FakeHost, notify: Notify
) -> None:
    # --interval caps the probe timeout at 0.4 s, which a Python fake on a busy machine may
    # not meet: the storm is counted from the first tick's end, answered or not.
    proc = start(fake_host, notify, "--interval", "0.5")
    try:
        notify.wait_for("READY=1", 15)
        deadline = time.monotonic() + 15
        while ticks(fake_host) < 1:
            assert time.monotonic() < deadline, "the first tick wrote no state"
            notify.pump(time.monotonic() + 0.05)
        before = fake_host.spawns
        window = time.monotonic()
        for _ in range(50):
            proc.send_signal(signal.SIGHUP)
        notify.pump(window + 1.5)
        # 1.5 s at 0.5 s is 3 or 4 ticks; a tick per SIGHUP would be 50 more.
        assert fake_host.spawns - before <= 5
        code, _ = stop(proc)
        assert code == 0
    finally:
        proc.kill()
        proc.wait()
    with open(os.path.join(fake_host.dir, "state.json")) as f:
        assert json.load(f)["interval"] == 0.5


def test_a_second_agent_on_the_same_state_file_touches_nothing(
    fake_host: FakeHost, notify: Notify
) -> None:
    proc = start(fake_host, notify)
    try:
        notify.wait_for("STATUS=2 GPUs, sampling", 15)
        second = subprocess.run(
            [sys.executable, "-m", "gpuagent", "--config", fake_host.conf, "run"],
            env={**os.environ, "PYTHONPATH": REPO},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert second.returncode == 75
        conf = fake_host.conf
        assert second.stderr == (
            f"info: configuration read from {conf}; no drop-ins in {conf}.d\n"
            f"error: not starting: already running (pid {proc.pid}): "
            f"{fake_host.dir}/state.json.lock is locked\n"
        )
        with open(os.path.join(fake_host.dir, "state.json")) as f:
            assert json.load(f)["pid"] == proc.pid
        assert os.path.exists(os.path.join(fake_host.dir, "gpuagent.prom"))
        assert stop(proc)[0] == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_reload_probes_at_once_whatever_the_backoff_says(tmp_path: str, notify: Notify) -> None:
    host = fakehost.create(str(tmp_path), 2, interval=30.0, backoff_after=1)
    host.failing()
    proc = start(host, notify)
    try:
        notify.wait_for(
            "STATUS=check_host; 1 critical; 2 GPUs, nvidia-smi failing (version_mismatch)", 15
        )
        host.healthy()  # the operator fixed it; the next grid tick is 30 s away
        proc.send_signal(signal.SIGHUP)
        notify.wait_for("STATUS=2 GPUs, sampling", 5)
        assert stop(proc)[0] == 0
    finally:
        proc.kill()
        proc.wait()
    assert proc.stderr is not None
    lines = proc.stderr.read().splitlines()
    assert f"info: configuration reloaded from {host.conf}; probing now" in lines


def test_a_reload_without_its_file_does_not_say_it_read_it(tmp_path: str) -> None:
    # The walk-through's reload said "reloaded from /etc/gpuagent/gpuagent.toml" with no such
    # file: the defaults applied.
    there = os.path.join(tmp_path, "gpuagent.toml")
    assert reloaded(there) == (
        f"configuration reloaded ({there}: no such file, the defaults and its drop-ins apply)"
    )
    with open(there, "w") as f:
        f.write("")
    assert reloaded(there) == f"configuration reloaded from {there}"
