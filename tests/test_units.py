"""gpuagent.units against a real dbus-daemon: a private bus with systemd's Manager mocked by
python-dbusmock (tests/mock_systemd.py), sockets that fail, and no socket at all.

tests/system/test_units_deb.py reads real units through the real systemd in a booted
Debian 12 and 13, as the packaged service's user.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuagent import units
from gpuagent.nvservices import DCGM, FABRICMANAGER, PERSISTENCED, UNITS
from gpuagent.units import Unit, Units, Watch
from tests.tools import need, tool

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "mock_systemd.py")
BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""
# The three units as on a host whose fabric manager runs, whose persistence daemon was
# stopped, and without DCGM; a crash-looping one is added by the tests that need it.
PARAMETERS: dict[str, Any] = {
    "units": {
        FABRICMANAGER: {
            "LoadState": "loaded",
            "ActiveState": "active",
            "SubState": "running",
            "NRestarts": 2,
        },
        # Stopped and unloaded since: GetUnit says NoSuchUnit, LoadUnit loads it.
        PERSISTENCED: {"LoadState": "loaded", "loaded": False},
        "slurmstepd.scope": {"LoadState": "loaded", "ActiveState": "active"},
    },
    "pids": {"4242": FABRICMANAGER, "5001": "slurmstepd.scope", "5002": "slurmstepd.scope"},
    "cgroups": {
        "5001": "/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0",
        "5002": "/system.slice/slurmstepd.scope/job_1235/step_batch/user/task_0",
    },
}


@dataclass
class MockBus:
    address: str
    socket: str

    def units(self, **kw: Any) -> Units:
        return Units(lambda: units.system_bus(1.0, self.address), **kw)


def _wait_for_systemd(bus: MockBus, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the mock systemd died"
        if bus.units().read([FABRICMANAGER]).watch is Watch.OK:
            return
        time.sleep(0.1)
    pytest.fail("the mock systemd did not come up")


@pytest.fixture
def dbus_daemon(tmp_path: str) -> Iterator[MockBus]:
    need(os.access("/usr/bin/dbus-daemon", os.X_OK), "dbus-daemon is not installed")
    path = os.path.join(tmp_path, "system_bus_socket")
    conf = os.path.join(tmp_path, "bus.conf")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(BUS_CONFIG.format(socket=path))
    daemon = subprocess.Popen(
        [tool("dbus-daemon"), f"--config-file={conf}", "--nofork", "--print-address"],
        stdout=subprocess.PIPE,
    )
    try:
        assert daemon.stdout is not None
        address = daemon.stdout.readline().decode().strip()
        assert address.startswith("unix:path="), address
        yield MockBus(address, path)
    finally:
        daemon.terminate()
        daemon.wait(10)


@pytest.fixture
def systemd(dbus_daemon: MockBus) -> Iterator[MockBus]:
    pytest.importorskip("dbusmock")
    env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": dbus_daemon.address}
    argv = [sys.executable, "-m", "dbusmock", "--system", "-t", TEMPLATE]
    proc = subprocess.Popen([*argv, "-p", json.dumps(PARAMETERS)], env=env)
    try:
        _wait_for_systemd(dbus_daemon, proc)
        yield dbus_daemon
    finally:
        proc.terminate()
        proc.wait(10)


def set_unit(bus: MockBus, name: str, loaded: bool = True, **props: str | int) -> None:
    """Change a unit of the running mock (its SetUnit method)."""
    from jeepney import DBusAddress, new_method_call  # noqa: PLC0415

    addr = DBusAddress(
        "/org/freedesktop/systemd1", "org.freedesktop.systemd1", "org.freedesktop.DBus.Mock"
    )
    body = {k: ("u" if isinstance(v, int) else "s", v) for k, v in props.items()}
    conn = units.system_bus(2.0, bus.address)
    try:
        reply = conn.send_and_get_reply(
            new_method_call(addr, "SetUnit", "sa{sv}b", (name, body, loaded))
        )
        assert reply.header.message_type.name == "method_return", reply.body
    finally:
        conn.close()


def test_the_three_units(systemd: MockBus) -> None:
    result = systemd.units().read()
    assert result.watch is Watch.OK, result.error
    assert result.units == {
        FABRICMANAGER: Unit(FABRICMANAGER, "loaded", "active", "running", "success", 2),
        # Not loaded when asked for: LoadUnit reads it, no error.
        PERSISTENCED: Unit(PERSISTENCED, "loaded", "inactive", "dead", "success", 0),
        # Not installed: a fact, with nothing of a service's.
        DCGM: Unit(DCGM, "not-found", "inactive", "dead", "", None),
    }
    assert list(result.units) == list(UNITS)
    assert not result.units[DCGM].installed
    assert result.units[FABRICMANAGER].running
    assert 0 < result.duration < 5


def test_a_crash_loop_and_a_failure_are_read_as_they_change(systemd: MockBus) -> None:
    reader = systemd.units()
    assert reader.read().watch is Watch.OK
    set_unit(
        systemd,
        FABRICMANAGER,
        LoadState="loaded",
        ActiveState="activating",
        SubState="auto-restart",
        Result="exit-code",
        NRestarts=7,
    )
    set_unit(systemd, PERSISTENCED, LoadState="loaded", ActiveState="failed", SubState="failed")
    # The same connection, kept from the last read.
    got = reader.read([FABRICMANAGER, PERSISTENCED]).units
    assert got[FABRICMANAGER] == Unit(
        FABRICMANAGER, "loaded", "activating", "auto-restart", "exit-code", 7
    )
    assert got[PERSISTENCED].active_state == "failed"
    assert not got[FABRICMANAGER].running


def test_unit_for_pid(systemd: MockBus) -> None:
    reader = systemd.units()
    assert reader.unit_for_pid(4242) == units.PidResult(Watch.OK, FABRICMANAGER)
    assert reader.unit_for_pid(4243) == units.PidResult(Watch.OK, None)


def test_a_slurm_steps_control_group(systemd: MockBus) -> None:
    reader = systemd.units()
    assert reader.unit_for_pid(5002) == units.PidResult(Watch.OK, "slurmstepd.scope")
    assert reader.cgroup_of("slurmstepd.scope", 5002) == (
        "/system.slice/slurmstepd.scope/job_1235/step_batch/user/task_0"
    )
    assert reader.cgroup_of("slurmstepd.scope", 4242) is None  # not in it
    assert reader.cgroup_of("nothing.scope", 5001) is None  # no such unit: no answer


def test_no_socket_at_all_is_not_watched(tmp_path: str) -> None:
    missing = f"unix:path={tmp_path}/no_such_socket"
    reader = Units(lambda: units.system_bus(1.0, missing))
    result = reader.read()
    assert (result.watch, result.units, result.error) == (Watch.NOT_WATCHED, {}, "")
    assert reader.unit_for_pid(1).watch is Watch.NOT_WATCHED


def test_the_default_address_follows_the_environment(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/none")
    assert Units().read().watch is Watch.NOT_WATCHED


def test_a_socket_nobody_listens_on_is_an_error(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "stale")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)  # bound, never listening, then closed: connect() is refused
    result = Units(lambda: units.system_bus(1.0, f"unix:path={path}")).read()
    assert result.watch is Watch.ERROR
    assert result.error.startswith("system bus (")
    assert "refused" in result.error.lower()
    assert "\n" not in result.error


def _server(path: str, handle: Any) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def serve() -> None:
        with srv:
            conn, _ = srv.accept()
            with conn:
                handle(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_a_bus_that_hangs_up_is_an_error(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "rude")
    _server(path, lambda conn: None)  # accepts, closes at once
    result = Units(lambda: units.system_bus(1.0, f"unix:path={path}")).read()
    assert result.watch is Watch.ERROR
    assert result.error.startswith("system bus ("), result.error


def test_a_bus_that_never_answers_times_out(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "mute")
    gate = threading.Event()
    _server(path, lambda conn: gate.wait(10))
    started = time.monotonic()
    result = Units(lambda: units.system_bus(0.3, f"unix:path={path}"), timeout=0.3).read()
    gate.set()
    assert result.watch is Watch.ERROR
    assert "no answer within" in result.error or "authenticate" in result.error, result.error
    assert time.monotonic() - started < 3


def test_a_bus_without_systemd_is_an_error_naming_it(dbus_daemon: MockBus) -> None:
    result = dbus_daemon.units().read()
    assert result.watch is Watch.ERROR
    assert result.error.startswith("system bus: org.freedesktop.DBus.Error.ServiceUnknown")
    assert "org.freedesktop.systemd1" in result.error


def test_a_bus_that_goes_away_is_an_error_then_reconnects(systemd: MockBus) -> None:
    reader = systemd.units()
    assert reader.read().watch is Watch.OK
    assert reader._bus is not None
    reader._bus.close()  # the bus restarted under the agent
    failed = reader.read()
    assert failed.watch is Watch.ERROR
    assert failed.error.startswith("system bus: "), failed.error
    assert reader.read().watch is Watch.OK  # a new connection


def run_cli(bus_address: str, *args: str) -> Any:
    from click.testing import CliRunner  # noqa: PLC0415

    from gpuagent.cli import main  # noqa: PLC0415

    env = {"DBUS_SYSTEM_BUS_ADDRESS": bus_address}
    return CliRunner(mix_stderr=False).invoke(main, ["units", *args], env=env)


def test_the_units_command(systemd: MockBus) -> None:
    res = run_cli(systemd.address)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"{FABRICMANAGER}  loaded active running  result success  restarts 2",
        f"{PERSISTENCED}  loaded inactive dead  result success  restarts 0",
        f"{DCGM}  not-found inactive dead  result -  restarts -",
    ]
    res = run_cli(systemd.address, "--json", "--pid", "4242")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["watch"], out["error"], out["pid"]["unit"]) == ("ok", "", FABRICMANAGER)
    assert out["units"][FABRICMANAGER]["n_restarts"] == 2


def test_the_units_command_without_a_bus(tmp_path: str) -> None:
    res = run_cli(f"unix:path={tmp_path}/none")
    assert res.exit_code == 1
    assert res.stderr == "gpuagent: no system bus socket: NVIDIA's units are not watched\n"
    res = run_cli(f"unix:path={tmp_path}/none", "--json")
    assert json.loads(res.stdout) == {"watch": "not_watched", "error": "", "units": {}}
