"""gpuagent.edges.systemd.units against a real dbus-daemon: a private bus with systemd's Manager
mocked by python-dbusmock (tests/mock_systemd.py), sockets that fail, and no socket at all.

tests/system/test_units_deb.py reads real units through the real systemd in a booted
Debian 12 and 13, as the packaged service's user.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from gpuagent.edges.systemd import units, unitsignals, wire
from gpuagent.edges.systemd.sysbus import LIMITS_EXCEEDED, DBusError
from gpuagent.edges.systemd.units import Unit, Units, Watch
from gpuagent.sources.services.nvservices import DCGM, FABRICMANAGER, IMEX, PERSISTENCED, UNITS
from gpuagent.sources.services.services import ServicesSource
from tests.tools import need, tool

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "mock_systemd.py")
# The mock runs under Debian's Python, which has python3-dbusmock, also where the tests run
# under another (scripts/lane): the agent's side of the bus is what a lane tests.
MOCK_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
# The mock's names as the agent spells them (tests/mock_systemd.py imports dbus, which only
# MOCK_PYTHON has).
BUS_NAME, MAIN_OBJ, MAIN_IFACE = unitsignals.SYSTEMD, unitsignals.MANAGER_PATH, unitsignals.MANAGER
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
  {include}
</busconfig>
"""
# The bus policy the package ships for the agent's user.
POLICY = os.path.join(os.path.dirname(HERE), "packaging", "dbus", "gpuagent.conf")
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
    "cmdlines": {"5002": '"/opt/my run\\n" --x'},
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


@contextlib.contextmanager
def private_bus(directory: str, include: str = "") -> Iterator[MockBus]:
    """A dbus-daemon of its own, its socket in ``directory``; ``include``: a configuration
    file it includes."""
    need(os.access("/usr/bin/dbus-daemon", os.X_OK), "dbus-daemon is not installed")
    tmp_path = directory
    path = os.path.join(tmp_path, "system_bus_socket")
    conf = os.path.join(tmp_path, "bus.conf")
    included = f"<include>{include}</include>" if include else ""
    with open(conf, "w", encoding="utf-8") as f:
        f.write(BUS_CONFIG.format(socket=path, include=included))
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
def dbus_daemon(tmp_path: str) -> Iterator[MockBus]:
    with private_bus(str(tmp_path)) as bus:
        yield bus


@contextlib.contextmanager
def mock_systemd(bus: MockBus, parameters: dict[str, Any]) -> Iterator[MockBus]:
    """python-dbusmock's systemd (tests/mock_systemd.py) on ``bus``, with ``parameters``."""
    has = subprocess.run([MOCK_PYTHON, "-c", "import dbusmock"], check=False).returncode == 0
    need(has, f"python3-dbusmock is not installed for {MOCK_PYTHON}")
    env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": bus.address}
    argv = [MOCK_PYTHON, "-m", "dbusmock", "--system", "-t", TEMPLATE]
    proc = subprocess.Popen([*argv, "-p", json.dumps(parameters)], env=env)
    try:
        _wait_for_systemd(bus, proc)
        yield bus
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def systemd(dbus_daemon: MockBus) -> Iterator[MockBus]:
    with mock_systemd(dbus_daemon, PARAMETERS) as bus:
        yield bus


@pytest.fixture
def refusing_systemd(dbus_daemon: MockBus) -> Iterator[MockBus]:
    """A systemd that refuses ``Subscribe()`` (as a policy might)."""
    with mock_systemd(dbus_daemon, {**PARAMETERS, "refuse_subscribe": True}) as bus:
        yield bus


def _mock_call(bus: MockBus, method: str, sig: str, body: tuple[Any, ...]) -> None:
    from jeepney import DBusAddress, new_method_call  # noqa: PLC0415

    addr = DBusAddress(
        "/org/freedesktop/systemd1", "org.freedesktop.systemd1", "org.freedesktop.DBus.Mock"
    )
    conn = units.system_bus(2.0, bus.address)
    try:
        reply = conn.send_and_get_reply(new_method_call(addr, method, sig, body))
        assert reply.header.message_type.name == "method_return", reply.body
    finally:
        conn.close()


def set_unit(bus: MockBus, name: str, loaded: bool = True, **props: str | int) -> None:
    """Change a unit of the running mock (its SetUnit method)."""
    body = {k: (_int_type(k) if isinstance(v, int) else "s", v) for k, v in props.items()}
    _mock_call(bus, "SetUnit", "sa{sv}b", (name, body, loaded))


def _int_type(prop: str) -> str:
    """The D-Bus type of an integer property: systemd's timestamps are µs in a uint64."""
    return "t" if "Timestamp" in prop else "u"


def set_unit_silently(bus: MockBus, name: str, **props: str | int) -> None:
    """Change a unit of the running mock and lose the signal (its SetUnitSilently)."""
    body = {k: ("u" if isinstance(v, int) else "s", v) for k, v in props.items()}
    _mock_call(bus, "SetUnitSilently", "sa{sv}", (name, body))


def reloading(bus: MockBus) -> None:
    """The mock systemd says it finished a ``daemon-reload`` (its ``Reloading(false)``)."""
    manager = "org.freedesktop.systemd1.Manager"
    _mock_call(bus, "EmitSignal", "sssav", (manager, "Reloading", "b", [("b", False)]))


class Highest:
    """A filter's queue that notes the most it ever held (``high``)."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.high = 0

    def append(self, msg: Any) -> None:
        self.queue.append(msg)
        self.high = max(self.high, len(self.queue))

    def __len__(self) -> int:
        return len(self.queue)


class Counting:
    """A connection to the bus that notes each method call sent on it: (member, body)."""

    def __init__(self, bus: units.Bus) -> None:
        self.bus = bus
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        # A signal that comes in again as soon as it is taken (None: the bus's own).
        self.storm: Any = None
        self.queue: Highest | None = None

    def send_and_get_reply(self, message: Any, *, timeout: float | None = None) -> Any:
        from jeepney import HeaderFields  # noqa: PLC0415

        self.calls.append((message.header.fields[HeaderFields.member], message.body))
        return self.bus.send_and_get_reply(message, timeout=timeout)

    def filter(self, rule: Any, *, queue: Any = None) -> Any:
        self.queue = Highest(queue)
        return self.bus.filter(rule, queue=self.queue)

    def recv_messages(self, *, timeout: float | None = None) -> None:
        if self.storm is not None:
            assert self.queue is not None
            self.queue.append(self.storm)
            return
        self.bus.recv_messages(timeout=timeout)

    def fileno(self) -> int:
        return self.bus.fileno()

    def heed(self, sender: Callable[[str], bool]) -> None:
        self.bus.heed(sender)

    def close(self) -> None:
        self.bus.close()

    def asked(self, member: str = "GetUnit") -> list[str]:
        """The units named by the ``member`` calls, in order."""
        return [str(body[0]) if body else "" for m, body in self.calls if m == member]


def counted(bus: MockBus, **kw: Any) -> tuple[Units, list[Counting]]:
    """A reader whose connections (the latest last) count their calls."""
    made: list[Counting] = []

    def connect() -> units.Bus:
        made.append(Counting(units.system_bus(1.0, bus.address)))
        return made[-1]

    return Units(connect, **kw), made


def settled(bus: MockBus, **kw: Any) -> tuple[Units, Counting]:
    """A reader following the signals (its full read never due again) and its connection,
    after the first read and the one that takes in the UnitNew signals of the units the
    first one loaded; no call counted yet."""
    reader, made = counted(bus, clock=lambda: 0.0, **kw)
    reader.read()
    reader.read()
    made[-1].calls.clear()
    return reader, made[-1]


def read_until(reader: Units, done: Callable[[dict[str, Unit]], bool]) -> dict[str, Unit]:
    """Read until ``done`` says the units are as awaited, waiting on the bus between reads
    (for a signal), within a deadline."""
    deadline = time.monotonic() + 10
    while True:
        result = reader.read()
        assert result.watch is Watch.OK, result.error
        if done(result.units):
            return result.units
        left = deadline - time.monotonic()
        assert left > 0, f"never came: {result.units}"
        assert isinstance(reader.connection.bus, Counting)
        sock = reader.connection.bus.bus.sock  # type: ignore[attr-defined]
        select.select([sock], [], [], min(left, 0.5))


def test_the_three_units(systemd: MockBus) -> None:
    result = systemd.units().read()
    assert result.watch is Watch.OK, result.error
    assert result.units == {
        FABRICMANAGER: Unit(FABRICMANAGER, "loaded", "active", "running", "success", 2),
        # Not loaded when asked for: LoadUnit reads it, no error.
        PERSISTENCED: Unit(PERSISTENCED, "loaded", "inactive", "dead", "success", 0),
        # Not installed: a fact, with nothing of a service's.
        DCGM: Unit(DCGM, "not-found", "inactive", "dead", "", None),
        IMEX: Unit(IMEX, "not-found", "inactive", "dead", "", None),
    }
    assert list(result.units) == list(UNITS)
    # Whether the host means to run a unit: its UnitFileState (none for one not installed).
    assert result.units[PERSISTENCED].file_state == "disabled"
    assert result.units[IMEX].file_state == ""
    assert not result.units[DCGM].installed
    assert result.units[FABRICMANAGER].running
    assert 0 < result.duration < 5


def test_an_enabled_imex_daemon_that_failed_is_read_as_enabled(systemd: MockBus) -> None:
    """The IMEX unit installed and disabled (a single tray, NVIDIA/aicr#2641): read, not
    enabled; enabled and failed (a GB200 tray whose daemon stopped): read as enabled."""
    set_unit(systemd, IMEX, loaded=False, LoadState="loaded")
    got = systemd.units().read().units[IMEX]
    assert (got.load_state, got.file_state, got.enabled) == ("loaded", "disabled", False)
    set_unit(
        systemd,
        IMEX,
        LoadState="loaded",
        ActiveState="failed",
        SubState="failed",
        Result="exit-code",
        UnitFileState="enabled",
    )
    got = systemd.units().read().units[IMEX]
    assert (got.active_state, got.file_state, got.enabled) == ("failed", "enabled", True)


def test_a_crash_loop_and_a_failure_are_read_as_they_change(systemd: MockBus) -> None:
    reader, _ = counted(systemd)
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
    # The same connection, kept from the last read: systemd's signals say what changed.
    got = read_until(reader, lambda u: u[PERSISTENCED].active_state == "failed")
    assert got[FABRICMANAGER] == Unit(
        FABRICMANAGER, "loaded", "activating", "auto-restart", "exit-code", 7
    )
    assert got[PERSISTENCED].active_state == "failed"
    assert not got[FABRICMANAGER].running


def test_the_fabric_managers_start_after_a_stop_this_boot_is_read(systemd: MockBus) -> None:
    # Its first start this boot: it never left the active state.
    reader, _ = counted(systemd)
    assert reader.read().units[FABRICMANAGER].rerun is None
    # Stopped and started again: systemd's ActiveExitTimestampMonotonic is set, and
    # ActiveEnterTimestamp is the new start (wall µs).
    set_unit(
        systemd,
        FABRICMANAGER,
        LoadState="loaded",
        ActiveState="active",
        SubState="running",
        ActiveEnterTimestamp=1_765_000_000_250_000,
        ActiveExitTimestampMonotonic=93_000_000,
    )
    got = read_until(reader, lambda u: u[FABRICMANAGER].rerun is not None)
    assert got[FABRICMANAGER].rerun == 1_765_000_000.25
    # Only the fabric manager's restart is asked about.
    assert got[IMEX].rerun is None


def test_unit_for_pid(systemd: MockBus) -> None:
    reader = systemd.units()
    assert reader.unit_for_pid(4242) == units.PidResult(Watch.OK, FABRICMANAGER)
    assert reader.unit_for_pid(4243) == units.PidResult(Watch.OK, None)


def test_a_slurm_steps_control_group_and_command_line(systemd: MockBus) -> None:
    reader = systemd.units()
    assert reader.unit_for_pid(5002) == units.PidResult(Watch.OK, "slurmstepd.scope")
    listed = reader.process_in("slurmstepd.scope", 5002)
    assert listed is not None
    assert listed.cgroup == "/system.slice/slurmstepd.scope/job_1235/step_batch/user/task_0"
    assert listed.cmdline == '"/opt/my run\\n" --x'
    assert reader.process_in("slurmstepd.scope", 4242) is None  # not in it
    assert reader.process_in("nothing.scope", 5001) is None  # no such unit: no answer


def test_no_socket_at_all_is_not_watched(tmp_path: str) -> None:
    missing = f"unix:path={tmp_path}/no_such_socket"
    reader = Units(lambda: units.system_bus(1.0, missing))
    result = reader.read()
    assert (result.watch, result.units, result.error) == (Watch.NOT_WATCHED, {}, "")
    assert reader.unit_for_pid(1).watch is Watch.NOT_WATCHED


def test_a_missing_socket_is_stat_ed_not_connected_to_until_it_appears(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jeepney.io import blocking  # noqa: PLC0415

    made: list[str] = []
    prep = blocking.prep_socket

    def counted(where: str, *args: Any, **kwargs: Any) -> Any:
        made.append(where)
        return prep(where, *args, **kwargs)

    monkeypatch.setattr(blocking, "prep_socket", counted)
    path = os.path.join(tmp_path, "system_bus_socket")
    reader = Units(lambda: units.system_bus(1.0, f"unix:path={path}"))
    assert [reader.read().watch for _ in range(3)] == [Watch.NOT_WATCHED] * 3
    assert made == []  # no socket made, no connect tried
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)  # the bus's socket appears (dbus-daemon not listening yet)
    result = reader.read()
    assert result.watch is Watch.ERROR
    assert "refused" in result.error.lower()
    assert made == [path]


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
    assert reader.connection.bus is not None
    reader.connection.bus.close()  # the bus restarted under the agent
    failed = reader.read()
    assert failed.watch is Watch.ERROR
    assert failed.error.startswith("system bus: "), failed.error
    assert reader.read().watch is Watch.OK  # a new connection


def run_cli(bus_address: str, *args: str) -> Any:
    from click.testing import CliRunner  # noqa: PLC0415

    from gpuagent.commands.cli import main  # noqa: PLC0415

    env = {"DBUS_SYSTEM_BUS_ADDRESS": bus_address}
    return CliRunner(mix_stderr=False).invoke(main, ["units", *args], env=env)


def test_the_units_command(systemd: MockBus) -> None:
    res = run_cli(systemd.address)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"{FABRICMANAGER}  loaded active running  result success  restarts 2",
        f"{PERSISTENCED}  loaded inactive dead  result success  restarts 0",
        f"{DCGM}  not-found inactive dead  result -  restarts -",
        f"{IMEX}  not-found inactive dead  result -  restarts -",
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


# Following systemd's signals: a read asks again only about what a signal named.


def test_a_read_when_nothing_changed_makes_no_call(systemd: MockBus) -> None:
    reader, made = counted(systemd, clock=lambda: 0.0)  # the full read never due again
    first = reader.read()
    bus = made[-1]
    # systemd's owner followed before it is asked, both before any unit is read.
    assert [m for m, _ in bus.calls][:4] == ["Subscribe", "AddMatch", "GetNameOwner", "AddMatch"]
    # Each unit's rules are added before its properties are read.
    assert bus.asked("AddMatch")[2:4] == [
        "type='signal',sender='org.freedesktop.systemd1',"
        "interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',"
        "path='/org/freedesktop/systemd1/unit/nvidia_2dfabricmanager_2eservice'",
        "type='signal',sender='org.freedesktop.systemd1',"
        "interface='org.freedesktop.systemd1.Manager',member='UnitNew',"
        f"path='/org/freedesktop/systemd1',arg0='{FABRICMANAGER}'",
    ]
    # Loading persistenced and DCGM made the mock say UnitNew: this read asks about them.
    second = reader.read()
    assert second.units == first.units
    bus.calls.clear()
    for _ in range(50):
        assert reader.read() == replace(second, duration=0.0)
    assert bus.calls == []


def test_a_change_is_seen_through_its_signal_and_only_that_unit_is_read(systemd: MockBus) -> None:
    reader, bus = settled(systemd)
    set_unit(
        systemd,
        FABRICMANAGER,
        LoadState="loaded",
        ActiveState="failed",
        SubState="failed",
        Result="exit-code",
        NRestarts=3,
    )
    got = read_until(reader, lambda u: u[FABRICMANAGER].active_state == "failed")
    assert got[FABRICMANAGER] == Unit(FABRICMANAGER, "loaded", "failed", "failed", "exit-code", 3)
    assert set(bus.asked()) == {FABRICMANAGER}
    assert bus.asked("LoadUnit") == []
    assert got[PERSISTENCED].active_state == "inactive"


def test_a_unit_loaded_and_started_says_only_unit_new(systemd: MockBus) -> None:
    reader, made = counted(systemd, clock=lambda: 0.0)
    reader.read()
    set_unit(systemd, PERSISTENCED, loaded=False, LoadState="loaded")  # unloaded when idle
    read_until(reader, lambda u: True)
    set_unit(systemd, PERSISTENCED, LoadState="loaded", ActiveState="active", SubState="running")
    got = read_until(reader, lambda u: u[PERSISTENCED].active_state == "active")
    assert got[PERSISTENCED] == Unit(PERSISTENCED, "loaded", "active", "running", "success", 0)
    assert made[-1].asked("LoadUnit").count(PERSISTENCED) == 1  # the first read's


def test_a_unit_unloaded_since_is_stopped_and_not_loaded_again(systemd: MockBus) -> None:
    reader, bus = settled(systemd)
    set_unit(systemd, FABRICMANAGER, loaded=False, LoadState="loaded", NRestarts=2)
    got = read_until(reader, lambda u: u[FABRICMANAGER].active_state == "inactive")
    # NoSuchUnit to GetUnit: stopped, what else it said last time kept.
    assert got[FABRICMANAGER] == Unit(FABRICMANAGER, "loaded", "inactive", "dead", "success", 2)
    assert bus.asked("LoadUnit") == []


def test_every_full_every_one_call_checks_what_the_signals_left(systemd: MockBus) -> None:
    now = [0.0]
    reader, made = counted(systemd, clock=lambda: now[0], full_every=60.0)
    reader.read()
    reader.read()
    bus = made[-1]
    bus.calls.clear()
    now[0] = 59.9
    reader.read()
    assert bus.calls == []
    now[0] = 60.0
    reader.read()
    # Nothing differs: that one call, and no unit read.
    assert [m for m, _ in bus.calls] == ["ListUnitsByPatterns"]
    assert bus.calls[0][1] == ([], list(UNITS))
    bus.calls.clear()
    now[0] = 119.0
    reader.read()
    assert bus.calls == []


def test_a_change_whose_signal_was_lost_is_read_at_the_next_check(systemd: MockBus) -> None:
    now = [0.0]
    reader, made = counted(systemd, clock=lambda: now[0], full_every=60.0)
    first = reader.read()
    reader.read()
    bus = made[-1]
    set_unit_silently(systemd, FABRICMANAGER, ActiveState="failed", SubState="failed", NRestarts=5)
    now[0] = 30.0
    assert reader.read().units == first.units  # not seen yet: no signal came
    bus.calls.clear()
    now[0] = 60.0
    got = reader.read().units
    assert [m for m, _ in bus.calls][:2] == ["ListUnitsByPatterns", "GetUnit"]
    assert bus.asked() == [FABRICMANAGER]  # only the unit that differs
    assert got[FABRICMANAGER] == Unit(FABRICMANAGER, "loaded", "failed", "failed", "success", 5)


def test_a_daemon_reload_reads_every_unit_again(systemd: MockBus) -> None:
    reader, bus = settled(systemd)
    reloading(systemd)
    read_until(reader, lambda u: bus.asked() != [])
    assert bus.asked() == list(UNITS)


def test_a_new_connection_subscribes_again_and_reads_every_unit(systemd: MockBus) -> None:
    reader, made = counted(systemd, clock=lambda: 0.0)
    reader.read()
    reader.read()
    assert reader.connection.bus is not None
    reader.connection.bus.close()  # the bus restarted under the agent
    failed = reader.read()
    assert failed.watch is Watch.ERROR
    assert failed.error.startswith("system bus: "), failed.error
    assert "\n" not in failed.error
    assert reader.read().watch is Watch.OK
    assert len(made) == 2
    assert [m for m, _ in made[-1].calls][:1] == ["Subscribe"]
    assert made[-1].asked() == list(UNITS)


def test_a_refused_subscription_reads_every_unit_every_time(refusing_systemd: MockBus) -> None:
    reader, made = counted(refusing_systemd, clock=lambda: 0.0)
    assert reader.read().watch is Watch.OK
    bus = made[-1]
    assert [m for m, _ in bus.calls][:2] == ["Subscribe", "GetUnit"]
    bus.calls.clear()
    set_unit(
        refusing_systemd, FABRICMANAGER, LoadState="loaded", ActiveState="failed", SubState="failed"
    )
    assert reader.read().units[FABRICMANAGER].active_state == "failed"  # no signal awaited
    assert bus.asked() == list(UNITS)
    assert "Subscribe" not in [m for m, _ in bus.calls]
    assert bus.queue is not None and not bus.queue  # nothing kept that no read takes in


def test_without_following_every_read_reads_every_unit(systemd: MockBus) -> None:
    reader, made = counted(systemd, full_every=None)
    reader.read()
    reader.read()
    assert [m for m, _ in made[-1].calls].count("GetUnit") == 2 * len(UNITS)
    assert "Subscribe" not in [m for m, _ in made[-1].calls]


def _bus_names(bus: MockBus) -> list[str]:
    from jeepney.bus_messages import message_bus  # noqa: PLC0415

    conn = units.system_bus(2.0, bus.address)
    try:
        return list(conn.send_and_get_reply(message_bus.ListNames()).body[0])
    finally:
        conn.close()


def test_the_daemon_lets_go_of_the_bus_at_exit(
    systemd: MockBus, tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuagent.config import Config  # noqa: PLC0415
    from gpuagent.daemon import Daemon  # noqa: PLC0415
    from tests import fakehost  # noqa: PLC0415

    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", systemd.address)
    os.mkdir(os.path.join(tmp_path, "sys"))
    cfg = Config(
        sysfs_root=os.path.join(tmp_path, "sys"),
        state_file=os.path.join(tmp_path, "state.json"),
        textfile="",
        journal_directory=fakehost.quiet_journal(),
    )
    daemon = Daemon(cfg, ("/nonexistent.toml", False))
    assert daemon.start(install_signals=False) is None
    report = daemon.step()
    assert report.state["services"][FABRICMANAGER]["active_state"] == "active"
    reader = daemon.agent.source(ServicesSource).reader
    assert isinstance(reader, Units) and reader.connection.bus is not None
    assert reader.ping == daemon.watchdog.ping_if_due  # its bus calls feed the watchdog
    name = reader.connection.bus.unique_name  # type: ignore[attr-defined]
    assert name in _bus_names(systemd)
    assert daemon.finish("ticks") == 0
    assert reader.connection.bus is None
    deadline = time.monotonic() + 10
    while name in _bus_names(systemd):
        assert time.monotonic() < deadline, f"{name} still on the bus"
        time.sleep(0.05)


FM_PATH = "/org/freedesktop/systemd1/unit/nvidia_2dfabricmanager_2eservice"


def _properties_changed(sender: str | None, path: str = FM_PATH) -> Any:
    from jeepney import DBusAddress, HeaderFields, new_signal  # noqa: PLC0415

    where = DBusAddress(path, interface="org.freedesktop.DBus.Properties")
    body: tuple[str, dict[str, Any], list[str]] = ("org.freedesktop.systemd1.Unit", {}, [])
    msg = new_signal(where, "PropertiesChanged", "sa{sv}as", body)
    if sender is not None:
        msg.header.fields[HeaderFields.sender] = sender
    return msg


def systemd_name(bus: MockBus) -> str:
    """The unique name of the mock systemd on ``bus``."""
    from jeepney.bus_messages import message_bus  # noqa: PLC0415

    conn = units.system_bus(2.0, bus.address)
    try:
        return str(conn.send_and_get_reply(message_bus.GetNameOwner(BUS_NAME)).body[0])
    finally:
        conn.close()


def test_a_storm_of_signals_is_taken_in_bounded_and_reads_every_unit(systemd: MockBus) -> None:
    reader, bus = settled(systemd)
    bus.storm = _properties_changed(systemd_name(systemd))
    # Signals without end: the read takes in so many, then reads every unit, and returns.
    assert reader.read().watch is Watch.OK
    assert bus.asked() == list(UNITS)
    assert bus.queue is not None and bus.queue.high <= units._SIGNALS_MAX
    bus.storm = None
    bus.calls.clear()
    assert reader.read().watch is Watch.OK
    assert bus.calls == []


def test_a_storm_of_forged_signals_is_taken_in_bounded_and_reads_nothing(
    systemd: MockBus,
) -> None:
    reader, bus = settled(systemd)
    before = reader.read().units
    bus.storm = _properties_changed(":1.666")  # systemd's path and interface, not its name
    result = reader.read()
    assert (result.watch, result.units) == (Watch.OK, before)
    assert bus.calls == []
    assert bus.queue is not None and bus.queue.high == 0


def _forgeries(destination: str | None, count: int) -> bytes:
    """``count`` signals with systemd's paths, interfaces and members (PropertiesChanged,
    UnitRemoved, JobRemoved, Reloading), serialised; ``destination``: sent to it by name."""
    from jeepney import DBusAddress, HeaderFields, new_signal  # noqa: PLC0415

    manager = DBusAddress(MAIN_OBJ, interface=MAIN_IFACE)
    kinds = [
        _properties_changed(None),
        new_signal(manager, "UnitRemoved", "so", (FABRICMANAGER, FM_PATH)),
        new_signal(manager, "JobRemoved", "uoss", (7, f"{MAIN_OBJ}/job/7", PERSISTENCED, "done")),
        new_signal(manager, "Reloading", "b", (False,)),
    ]
    if destination is not None:
        for msg in kinds:
            msg.header.fields[HeaderFields.destination] = destination
    return b"".join(kinds[i % len(kinds)].serialise(serial=i + 1) for i in range(count))


def test_forged_systemd_signals_from_another_client_are_dropped_and_hold_nothing(
    systemd: MockBus,
) -> None:
    from jeepney.bus_messages import message_bus  # noqa: PLC0415

    reader, bus = settled(systemd, timeout=60.0)
    before = reader.read().units
    target = reader.connection.bus.bus.unique_name  # type: ignore[union-attr]
    # Another client on the bus, as any user may be: 100,000 forged signals, half broadcast
    # (systemd's path and interface), half sent to the agent's connection by name.
    forger = units.system_bus(10.0, systemd.address)
    try:
        for destination in (None, target):
            chunk = _forgeries(destination, 1000)
            for _ in range(50):
                forger.sock.sendall(chunk)  # type: ignore[attr-defined]
        # Its reply comes after the bus has routed every one of them.
        forger.send_and_get_reply(message_bus.GetId())
    finally:
        forger.close()
    # A call waits behind them all for its reply; then a read takes in whatever is left.
    assert reader.unit_for_pid(4242) == units.PidResult(Watch.OK, FABRICMANAGER)
    bus.calls.clear()
    assert bus.queue is not None and bus.queue.high == 0  # not one of them held
    result = reader.read()
    assert (result.watch, result.units) == (Watch.OK, before)
    assert bus.calls == []  # not one unit read again


def test_systemd_re_executed_its_new_name_is_followed(dbus_daemon: MockBus) -> None:
    with mock_systemd(dbus_daemon, PARAMETERS):
        reader, bus = settled(dbus_daemon)
    # systemd is back under another unique name, the fabric manager failed meanwhile.
    failed = {"LoadState": "loaded", "ActiveState": "failed", "SubState": "failed"}
    again = {**PARAMETERS, "units": {**PARAMETERS["units"], FABRICMANAGER: failed}}
    with mock_systemd(dbus_daemon, again):
        got = read_until(reader, lambda u: u[FABRICMANAGER].active_state == "failed")
        assert got[FABRICMANAGER].active_state == "failed"
        assert set(bus.asked()) >= set(UNITS)  # the owner changed: every unit read again
        reader.read()  # the UnitNew of the units that read loaded
        bus.calls.clear()
        # The new name's signals are systemd's.
        set_unit(dbus_daemon, PERSISTENCED, LoadState="loaded", ActiveState="active")
        got = read_until(reader, lambda u: u[PERSISTENCED].active_state == "active")
        assert set(bus.asked()) == {PERSISTENCED}


class FakeNotifier:
    def __init__(self, now: list[float]) -> None:
        self.now = now
        self.pings: list[float] = []

    def watchdog(self) -> None:
        self.pings.append(self.now[0])


class Slow(Counting):
    """A connection to a systemd that takes ``delay`` s (of the fake clock) to answer."""

    def __init__(self, bus: units.Bus, now: list[float], delay: float) -> None:
        super().__init__(bus)
        self.now = now
        self.delay = delay

    def send_and_get_reply(self, message: Any, *, timeout: float | None = None) -> Any:
        self.now[0] += self.delay
        return super().send_and_get_reply(message, timeout=timeout)


def test_a_slow_systemd_does_not_starve_the_watchdog(
    systemd: MockBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuagent.daemon import Watchdog  # noqa: PLC0415

    monkeypatch.setenv("WATCHDOG_USEC", "30000000")  # WatchdogSec=30
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    now = [0.0]
    notifier = FakeNotifier(now)
    watchdog = Watchdog(notifier, lambda: now[0])  # type: ignore[arg-type]
    made: list[Slow] = []

    def connect() -> units.Bus:
        made.append(Slow(units.system_bus(1.0, systemd.address), now, 1.5))
        return made[-1]

    reader = Units(connect, clock=lambda: now[0], ping=watchdog.ping_if_due)
    watchdog.ping_if_due()  # as the tick loop did before the tick
    for _ in range(2):  # the first read on a connection, and the next after a reload
        assert reader.read().watch is Watch.OK
        reloading(systemd)
        read_until_signal(made[-1])
    assert reader.read().watch is Watch.OK
    calls = len(made[-1].calls)
    assert calls > 20, calls
    times = [*notifier.pings, now[0]]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert now[0] >= 1.5 * calls
    assert max(gaps) <= 15.0, gaps  # WatchdogSec/2


def read_until_signal(bus: Counting) -> None:
    """Wait, within a deadline, until the bus has a message for ``bus``."""
    sock = bus.bus.sock  # type: ignore[attr-defined]
    assert select.select([sock], [], [], 10)[0], "no signal came"


def _unicast_of_one_byte_variants(destination: str, size: int) -> bytes:
    """A signal sent to ``destination`` by name whose body is ``size`` bytes of one-byte
    variants (``av``: 4 bytes each), serialised by hand: jeepney would take minutes."""
    from jeepney.low_level import Endianness, Header, HeaderFields, MessageType  # noqa: PLC0415

    count = (size - 4) // 4
    body = struct.pack("<I", 4 * count) + b"\x01y\x00\x07" * count
    fields = {
        HeaderFields.path: "/org/freedesktop/systemd1",
        HeaderFields.interface: "org.freedesktop.systemd1.Manager",
        HeaderFields.member: "UnitNew",
        HeaderFields.destination: destination,
        HeaderFields.signature: "av",
    }
    header = Header(Endianness.little, MessageType.signal, 0, 1, len(body), 77, fields).serialise()
    return bytes(header) + bytes(-len(header) % 8) + body


def test_a_32_mib_unicast_from_another_client_is_skipped_in_bounded_memory(
    systemd: MockBus,
) -> None:
    from jeepney.bus_messages import message_bus  # noqa: PLC0415

    reader, bus = settled(systemd, timeout=60.0)
    target = reader.connection.bus.bus.unique_name  # type: ignore[union-attr]
    # Another client, as any user may be: one message of the bus's largest size (32 MiB,
    # dbus-daemon's default max_message_size), 8 M one-byte variants, to the agent by name.
    forger = units.system_bus(60.0, systemd.address)
    try:
        data = _unicast_of_one_byte_variants(target, 32 * 1024 * 1024 - 256)
        forger.sock.sendall(data)  # type: ignore[attr-defined]
        del data
        # Its reply comes after the bus has taken all of it in.
        forger.send_and_get_reply(message_bus.GetId())
    finally:
        forger.close()
    set_unit(systemd, PERSISTENCED, LoadState="loaded", ActiveState="active")
    tracemalloc.start()
    try:
        got = read_until(reader, lambda u: u[PERSISTENCED].active_state == "active")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    framer = reader.connection.bus.bus._framer  # type: ignore[union-attr]
    assert framer.skipped >= 32 * 1024 * 1024 - 256  # it came, and was skipped
    assert got[PERSISTENCED].active_state == "active"  # systemd's signal after it: taken in
    assert bus.asked() == [PERSISTENCED]  # that unit alone read again: nothing else came
    assert peak < 2 * 1024 * 1024, peak  # was ~2 GiB of Python objects


def test_a_reply_over_the_size_cap_is_an_error_and_the_connection_goes_on(
    systemd: MockBus,
) -> None:
    # systemd's own reply, as a unit with many processes of long command lines would make.
    code = f"ret = 'x' * {wire.MESSAGE_MAX + 1}"
    _mock_call(systemd, "AddMethod", "sssss", (MAIN_IFACE, "Big", "", "s", code))
    reader = systemd.units()
    with pytest.raises(DBusError) as caught:
        reader.connection.call(MAIN_OBJ, MAIN_IFACE, "Big", "", ())
    assert caught.value.name == LIMITS_EXCEEDED
    assert f"over the {wire.MESSAGE_MAX}-byte cap" in str(caught.value)
    assert reader.unit_for_pid(4242) == units.PidResult(Watch.OK, FABRICMANAGER)


def test_the_shipped_bus_policy_keeps_others_signals_from_the_agent(tmp_path: str) -> None:
    import pwd  # noqa: PLC0415

    from jeepney import HeaderFields  # noqa: PLC0415
    from jeepney.bus_messages import message_bus  # noqa: PLC0415

    # The package's policy for its user, given to this test's user: the agent's connection.
    with open(POLICY, encoding="utf-8") as f:
        policy = f.read()
    assert 'user="gpuagent"' in policy
    mine = os.path.join(tmp_path, "gpuagent.conf")
    with open(mine, "w", encoding="utf-8") as f:
        f.write(policy.replace('user="gpuagent"', f'user="{pwd.getpwuid(os.getuid()).pw_name}"'))
    with private_bus(str(tmp_path), mine) as bus, mock_systemd(bus, PARAMETERS):
        reader, counting = settled(bus)
        target = reader.connection.bus.bus.unique_name  # type: ignore[union-attr]
        forger = units.system_bus(10.0, bus.address)
        try:
            forger.sock.sendall(_unicast_of_one_byte_variants(target, 1 << 20))  # type: ignore[attr-defined]
            forged = _properties_changed(None)
            forged.header.fields[HeaderFields.destination] = target
            forger.send(forged)  # type: ignore[attr-defined]
            forger.send_and_get_reply(message_bus.GetId())
        finally:
            forger.close()
        # systemd's signals and every reply still come; the forger's never did.
        set_unit(bus, PERSISTENCED, LoadState="loaded", ActiveState="active")
        got = read_until(reader, lambda u: u[PERSISTENCED].active_state == "active")
        assert got[PERSISTENCED].active_state == "active"
        assert counting.asked() == [PERSISTENCED]
        assert reader.connection.bus.bus._framer.skipped == 0  # type: ignore[union-attr]
