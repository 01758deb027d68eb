"""The fault matrix: every failure users of GPU collectors report, driven through the agent.

One row per fault, each with its expected outcome: probe state, failure class, STATUS line
and how many lines it logs at info or above (never one per tick).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from gpuagent import state
from gpuagent.commands import drain
from gpuagent.commands.status import ExitCode, judge
from gpuagent.config import Config
from gpuagent.daemon import Daemon
from gpuagent.edges import runner as runner_mod
from gpuagent.logs import Event, EventLog
from gpuagent.schema import State
from gpuagent.sources.bus.bus import BusScan
from gpuagent.sources.probe.smi import FIELDS, parse_output
from gpuagent.views import BusView
from tests import fakesysfs, replay
from tests.conftest import Host, ListHandler
from tests.fakehost import FAKE_SMI, H200_LOAD
from tests.test_smi import ERRORS

# Captures of nvidia-smi naming a GPU it cannot reach, and nothing else.
LOST_ALONE = (
    "device-handle-unknown-error.txt",
    "device-handle-unknown-error-no-space-synology.txt",
    "gpu-is-lost-linux.txt",
    "gpu-is-lost-windows-driver369.30-console-wrapped.txt",
)


@dataclass(frozen=True)
class Fault:
    name: str
    setup: Callable[[Host], None]
    state: str
    failure: str | None
    status: str
    lines: int
    ticks: int = 3
    timeout: float = 5.0


def _lone_lost_gpu(name: str, code: int) -> Fault:
    """A capture that is per-GPU errors alone, on a host whose one GPU bound to nvidia is the
    GPU it names (the eight others are passed through to VMs): that GPU is lost, and the probe
    is not failing."""
    with open(os.path.join(replay.CORPUS, "errors", name)) as f:
        (slot,) = parse_output(f.read(), FIELDS).gpu_errors

    def setup(h: Host) -> None:
        for other in h.slots:
            fakesysfs.bind(h.root, other, "vfio-pci")
        fakesysfs.add_device(h.root, slot, 0x10DE, 0x2335, 0x030200, "nvidia")
        h.scenario(error=name, exit=code)

    return Fault(
        f"capture {name} exit {code}",
        setup,
        "ok",
        None,
        f"drain and reboot: fixes {slot}; 1 critical; 9 GPUs, sampling",
        1,
    )


def error_row(name: str, code: int, failure: str) -> Fault:
    if code in (0, 14) and failure == "other":
        # These exits may carry data: output that is not our CSV is unparseable, not "other".
        failure = "unparseable"
    return Fault(
        f"capture {name} exit {code}",
        lambda h: h.scenario(error=name, exit=code),
        "failing",
        failure,
        failing(failure),
        1,  # the outage's warning (its problem's start), or exit 18's driver_mismatch
    )


# The status line of a failing probe: the remedy of its problem (``smi_failing``, or for a
# version mismatch ``driver_mismatch``, both ``check_host``), then the probe's state; within 80
# columns, by the action's name and without the problem's where the words do not fit.
# Critical only on evidence about the driver or a GPU (a version mismatch, a GPU lost); any
# other failure may be the agent's own (its sandbox), a warning that never drains (issue 39).
_FAILING = {
    "other": "check the host: fixes smi_failing; 1 warning; 8 GPUs, nvidia-smi failing (other)",
    "gpu_lost": "check_host: fixes smi_failing; 1 critical; 8 GPUs, nvidia-smi failing (gpu_lost)",
    "version_mismatch": "check_host; 1 critical; 8 GPUs, nvidia-smi failing (version_mismatch)",
    "no_devices": (
        "check_host; 1 warning; 8 GPUs, nvidia-smi failing (no_devices), next try in 20 s"
    ),
}


def failing(failure: str) -> str:
    """The status line of a probe failing with ``failure``."""
    return _FAILING.get(failure, f"check_host; 1 warning; 8 GPUs, nvidia-smi failing ({failure})")


def _h200_rows(h: Host) -> str:
    return replay.answer(replay.load(H200_LOAD), list(FIELDS), "csv,noheader,nounits", h.slots)[0]


def _not_executable(h: Host) -> None:
    os.unlink(h.smi)
    with open(h.smi, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(h.smi, 0o644)


def _directory(h: Host) -> None:
    os.unlink(h.smi)
    os.mkdir(h.smi)


def _rebind_one(h: Host) -> None:
    fakesysfs.bind(h.root, h.slots[0], "vfio-pci")
    h.healthy(slots=h.slots[1:])


def _rebind_all(h: Host) -> None:
    for slot in h.slots:
        fakesysfs.bind(h.root, slot, "vfio-pci")


def _unreadable_class(h: Host) -> None:
    dev = fakesysfs.add_device(h.root, "0000:f1:00.0", 0x10DE, 0x2335, 0x030200, "nvidia")
    os.remove(os.path.join(dev, "class"))
    os.mkdir(os.path.join(dev, "class"))


# The captured warning names a GPU this fake host does not have: still a GPU to report.
INFOROM_STATUS = "drain and RMA: fixes 0000:00:1e.0; 1 warning; 8 GPUs, sampling"

FAULTS = [
    *(
        error_row(n, code, f.value)
        for n, (code, f) in sorted(ERRORS.items())
        if n not in ("inforom-corrupted-warning-exit14.txt",)
    ),
    # The same captures where the GPU they name is the host's only one bound to nvidia: that
    # GPU is lost. Above, on the eight-GPU host, they name none of its GPUs: nvidia-smi gave
    # up on all of them, and the probe is failing.
    *(_lone_lost_gpu(n, ERRORS[n][0]) for n in LOST_ALONE),
    Fault(
        "one of eight GPUs named lost, no rows",
        lambda h: h.scenario(
            stdout=f"Unable to determine the device handle for GPU {h.slots[2]}: GPU is lost.\n",
            exit=15,
        ),
        "failing",
        "gpu_lost",
        failing("gpu_lost"),
        1,
    ),
    # infoROM: a warning with exit 14 beside valid data is a success and a problem of the GPU it
    # names; alone it is not data.
    Fault(
        "infoROM warning, rows, exit 14",
        lambda h: h.healthy(prepend="inforom-corrupted-warning-exit14.txt", exit=14),
        "ok",
        None,
        INFOROM_STATUS,
        1,
    ),
    Fault(
        "infoROM warning, rows, exit 0",
        lambda h: h.healthy(prepend="inforom-corrupted-warning-exit14.txt"),
        "ok",
        None,
        INFOROM_STATUS,
        1,
    ),
    Fault(
        "infoROM warning alone, exit 14",
        lambda h: h.scenario(error="inforom-corrupted-warning-exit14.txt", exit=14),
        "failing",
        "unparseable",
        failing("unparseable"),
        1,
    ),
    Fault(
        "hang past the timeout",
        lambda h: h.scenario(hang=60),
        "failing",
        "timeout",
        "check_host: fixes smi_timeout; 1 warning; 8 GPUs, nvidia-smi failing (timeout)",
        2,  # the outage's warning, and smi_timeout's
        timeout=0.3,
    ),
    Fault(
        "child ignores SIGTERM",
        lambda h: h.scenario(hang=60, ignore_term=True),
        "failing",
        "timeout",
        "check_host: fixes smi_timeout; 1 warning; 8 GPUs, nvidia-smi failing (timeout)",
        2,  # the outage's warning, and smi_timeout's
        timeout=0.3,
    ),
    Fault(
        "grandchild holds stdout",
        lambda h: h.healthy(grandchild_hang=60),
        "ok",
        None,
        "8 GPUs, sampling",
        0,
    ),
    Fault(
        "garbage on stdout",
        lambda h: h.scenario(stdout="Segmentation fault\n"),
        "failing",
        "unparseable",
        failing("unparseable"),
        1,
    ),
    Fault(
        "truncated row",
        lambda h: h.scenario(stdout=_h200_rows(h)[:-40]),
        "failing",
        "unparseable",
        failing("unparseable"),
        1,
    ),
    Fault(
        "extra columns",
        lambda h: h.scenario(stdout=_h200_rows(h).replace("\n", ", 1\n")),
        "failing",
        "unparseable",
        failing("unparseable"),
        1,
    ),
    Fault(
        "non-UTF-8 bytes",
        lambda h: h.scenario(stdout_hex="30ff2c2034310a"),
        "failing",
        "unparseable",
        failing("unparseable"),
        1,
    ),
    Fault(
        "10 MB of output",
        lambda h: h.scenario(stdout="x" * 1023 + "\n", repeat=10240),
        "failing",
        "unparseable",
        failing("unparseable"),
        1,
    ),
    Fault(
        "error text with exit 0",
        lambda h: h.scenario(error="no-devices-were-found.txt"),
        "failing",
        "no_devices",
        failing("no_devices"),
        1,
    ),
    Fault(
        "binary missing",
        lambda h: os.unlink(h.smi),
        "gated",
        None,
        "check_host: fixes nvidia_smi_missing; 1 warning; 8 GPUs, nvidia-smi not found",
        1,
    ),
    Fault(
        "binary not executable",
        _not_executable,
        "failing",
        "permission_denied",
        failing("permission_denied"),
        1,
    ),
    Fault(
        "binary is a directory",
        _directory,
        "failing",
        "permission_denied",
        failing("permission_denied"),
        1,
    ),
    Fault(
        "module unloaded",
        lambda h: fakesysfs.set_module(h.root, False),
        "gated",
        None,
        "check_host: fixes no_driver_module; 1 warning; 8 GPUs, NVIDIA driver not loaded",
        1,  # the gate's warning: no_driver_module's start within driver_absent_grace
    ),
    Fault("one GPU re-bound to vfio-pci", _rebind_one, "ok", None, "8 GPUs, sampling", 0),
    Fault(
        "every GPU re-bound to vfio-pci",
        _rebind_all,
        "idle",
        None,
        "8 GPUs, all bound to vfio-pci; not sampled",
        0,
    ),
    Fault(
        "unreadable class file",
        _unreadable_class,
        "ok",
        None,
        "8 GPUs, sampling; agent problem: sysfs",
        1,
    ),
    Fault(
        "GPU missing from nvidia-smi",
        lambda h: h.healthy(slots=h.slots[1:]),
        "ok",
        None,
        "drain and reboot: fixes 0000:18:00.0; 1 critical; 8 GPUs, sampling",
        1,
    ),
]


def test_every_error_capture_is_a_row() -> None:
    names = {f.name for f in FAULTS}
    for error in ERRORS:
        assert any(error in n for n in names) or error == "inforom-corrupted-warning-exit14.txt"


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault(host: Host, fault: Fault) -> None:
    fault.setup(host)
    # A hang's 0.3 s count from the fake's start: the child ignoring SIGTERM has set that up.
    host.make_agent(probe_timeout=fault.timeout, hang=True)
    snap = host.tick(fault.ticks).state
    assert snap["probe"]["state"] == fault.state
    assert snap["probe"]["failure_class"] == fault.failure
    assert snap["status"] == fault.status
    loud = [r.getMessage() for r in host.logs.records if r.levelno >= logging.INFO]
    assert len(loud) == fault.lines, loud
    assert all("Traceback" not in line and "\n" not in line for line in loud)
    assert host.runner is not None and not host.runner.busy()
    # More ticks of the same fault add no line: at most one per episode.
    host.tick(20)
    assert len([r for r in host.logs.records if r.levelno >= logging.INFO]) == fault.lines


def test_stuck_child_blocks_new_probes_until_reaped(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without root nothing can be put in D state; a killpg that reaches nobody looks the same.
    monkeypatch.setattr(runner_mod, "_killpg", lambda pgid, sig: None)
    host.scenario(hang=60)
    host.make_agent(probe_timeout=0.2, hang=True)
    host.tick()
    assert host.probe["state"] == "stuck"
    assert len(host.events(Event.PROBE_STUCK)) == 1
    (hung,) = host.events(Event.PROBLEM_DRIVER_HUNG)
    assert hung.levelno == logging.ERROR
    assert hung.getMessage() == (
        "host: critical driver_hung: nvidia-smi did not exit after SIGKILL (stuck in the "
        "driver) with the nvidia module loaded: the driver no longer answers; action: reboot; "
        "ends by itself once nvidia-smi has answered normally 3 probes in a row, or the "
        "nvidia module is unloaded"
    )
    spawns = host.spawns
    report = host.tick(10)
    assert host.spawns == spawns
    assert report.state["probe"]["state"] == "stuck"
    assert report.status == (
        "reboot: fixes driver_hung; 1 critical; 8 GPUs, nvidia-smi stuck in the driver"
    )
    (entry,) = report.state["host_problems"]
    assert (entry["kind"], entry["severity"], entry["action"]) == (
        "driver_hung",
        "critical",
        "reboot",
    )
    assert host.runner is not None
    stuck = host.runner.stuck
    assert stuck is not None
    stuck.kill()
    stuck.wait()
    monkeypatch.undo()
    host.healthy()
    host.patient()
    for _ in range(10):  # the backoff's cap is 6 ticks
        if host.tick().state["probe"]["state"] == "ok":
            break
    else:
        pytest.fail(f"the probe is not ok 10 ticks after the stuck child was reaped: {host.probe}")
    assert host.spawns == spawns + 1
    # One answer is no driver that answers again: three in a row are.
    assert [p["kind"] for p in host.state["host_problems"]] == ["driver_hung"]
    host.tick()
    assert [p["kind"] for p in host.state["host_problems"]] == ["driver_hung"]
    host.tick()
    assert host.state["host_problems"] == []
    (ended,) = [r for r in host.events(Event.PROBLEM_CLEARED) if r.PROBLEM == "driver_hung"]  # type: ignore[attr-defined]
    assert ended.getMessage() == "host: driver_hung cleared"


def test_nvidia_smi_removed_and_reinstalled(host: Host) -> None:
    host.make_agent()
    host.tick(2)
    os.unlink(host.smi)
    host.tick(5)
    assert host.probe["gate"] == "nvidia_smi_missing"
    os.symlink(FAKE_SMI, host.smi)
    host.tick()
    assert host.probe["state"] == "ok"
    assert len(host.events(Event.NVIDIA_SMI_MISSING)) == 1
    assert len(host.events(Event.NVIDIA_SMI_FOUND)) == 1


def test_module_disappearing_and_returning_twice(host: Host) -> None:
    host.make_agent()
    for _ in range(2):
        fakesysfs.set_module(host.root, False)
        host.tick(4)
        assert host.probe["gate"] == "driver_not_loaded"
        fakesysfs.set_module(host.root, True)
        host.tick()
        assert host.probe["state"] == "ok"
    assert len(host.events(Event.DRIVER_UNLOADED)) == 2
    assert len(host.events(Event.DRIVER_LOADED)) == 2


# The state file ---------------------------------------------------------------------------


def daemon_on(host: Host, state_file: str) -> tuple[Daemon, ListHandler]:
    logs = ListHandler()
    logger = logging.getLogger(f"test.daemon.{id(host)}")
    logger.handlers[:] = [logs]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    cfg = Config(
        nvidia_smi=host.smi,
        sysfs_root=host.root,
        state_file=state_file,
        probe_timeout=5.0,
        textfile="",
    )
    return Daemon(cfg, ("/nonexistent.toml", False), log=EventLog(logger)), logs


def handed_to_textfile(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> list[State]:
    """The states the daemon hands to its textfile from now on: the agent's whole trouble,
    also the state file's own write failure, which the state file cannot carry."""
    handed: list[State] = []
    textfile = daemon.publisher.textfile
    real = textfile.write

    def write(st: State) -> None:
        handed.append(st)
        real(st)

    monkeypatch.setattr(textfile, "write", write)
    return handed


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_state_write_fault_episode(host: Host, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    path = os.path.join(host.dir, "run", "state.json")
    os.makedirs(os.path.dirname(path))
    daemon, logs = daemon_on(host, path)
    handed = handed_to_textfile(daemon, monkeypatch)
    real_write = state.write

    def failing_write(p: str, data: State) -> None:
        raise OSError(err, os.strerror(err), p)

    for _ in range(2):
        monkeypatch.setattr(state, "write", failing_write)
        for _ in range(5):
            report = daemon.step()
        assert report.state["probe"]["state"] == "ok"  # sampling goes on
        assert os.strerror(err) in handed[-1]["problems"]["state_file"]
        monkeypatch.setattr(state, "write", real_write)
        daemon.step()
        assert "state_file" not in state.read(path)["problems"]
    failed = [
        r for r in logs.records if getattr(r, "MESSAGE_ID", "") == Event.STATE_WRITE_FAILED.value
    ]
    back = [
        r for r in logs.records if getattr(r, "MESSAGE_ID", "") == Event.STATE_WRITE_RECOVERED.value
    ]
    assert len(failed) == 2
    assert len(back) == 2


def test_state_directory_that_is_a_file(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = os.path.join(host.dir, "blocker")
    with open(blocker, "w") as f:
        f.write("")
    daemon, logs = daemon_on(host, os.path.join(blocker, "state.json"))
    handed = handed_to_textfile(daemon, monkeypatch)
    for _ in range(10):
        report = daemon.step()
    assert report.state["probe"]["state"] == "ok"
    assert len([r for r in logs.records if r.levelno >= logging.ERROR]) == 1
    assert "Not a directory" in handed[-1]["problems"]["state_file"]


def test_state_write_failing_on_and_off_never_kills_the_daemon(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = os.path.join(host.dir, "state.json")
    daemon, _ = daemon_on(host, path)
    real_write = state.write
    calls = {"n": 0}

    def flaky(p: str, data: State) -> None:
        calls["n"] += 1
        if calls["n"] % 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), p)
        real_write(p, data)

    monkeypatch.setattr(state, "write", flaky)
    for _ in range(20):
        report = daemon.step()
    assert report.state["probe"]["state"] == "ok"


def test_an_unexpected_error_in_a_tick_is_logged_once_and_survived(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, logs = daemon_on(host, os.path.join(host.dir, "state.json"))

    def broken() -> BusView:
        raise KeyError("surprise")

    monkeypatch.setattr(daemon.agent.source(BusScan).scanner, "scan", broken)
    for _ in range(5):
        daemon.step()
    errors = [r.getMessage() for r in logs.records if r.levelno >= logging.ERROR]
    assert errors == ["internal error in a tick's scan step, carrying on: KeyError: 'surprise'"]
    assert "internal" in state.read(os.path.join(host.dir, "state.json"))["problems"]
    monkeypatch.undo()
    daemon.step()
    assert "internal" not in state.read(os.path.join(host.dir, "state.json"))["problems"]


def test_an_unexpected_error_writing_the_outputs_is_logged_once_and_survived(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = os.path.join(host.dir, "state.json")
    daemon, logs = daemon_on(host, path)

    def broken(st: State) -> None:
        raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(daemon.publisher.textfile, "write", broken)
    for _ in range(5):
        daemon.step()  # does not raise: the loop goes on, the watchdog is fed
    errors = [r.getMessage() for r in logs.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].startswith("internal error writing the state and metrics, carrying on: ")
    assert "UnicodeEncodeError" in errors[0]
    assert "internal_publish" in state.read(path)["problems"]  # written before the metrics
    monkeypatch.undo()
    daemon.step()
    assert "internal_publish" not in state.read(path)["problems"]
    assert len([r for r in logs.records if r.levelno >= logging.ERROR]) == 1


def test_ready_is_sent_even_when_the_first_scan_fails(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, _ = daemon_on(host, os.path.join(host.dir, "state.json"))
    sent: list[str] = []
    monkeypatch.setattr(daemon.notifier, "ready", lambda status=None: sent.append("READY"))

    def broken() -> BusView:
        raise OSError("sysfs went away")

    monkeypatch.setattr(daemon.agent.source(BusScan).scanner, "scan", broken)
    daemon.step()
    assert sent == ["READY"]


@pytest.mark.parametrize(
    "error",
    [
        # What NVML says where the unit's sandbox keeps it from the devices or from /proc.
        "Failed to initialize NVML: Insufficient Permissions",
        "Unable to determine the device handle for GPU 0000:18:00.0: Insufficient Permissions",
        "Failed to initialize NVML: GPU access blocked by the operating system",
        "nvml-unknown-error-exit255.txt",
    ],
)
def test_a_sandbox_that_stops_nvml_is_the_agents_trouble_not_a_drain(
    host: Host, error: str
) -> None:
    """If the unit's sandbox ever stops NVML, every host of a fleet says so at once: a
    warning with its fix, never a critical that drains them all (issue 39)."""
    if error.endswith(".txt"):
        host.failing(error, code=255)
    else:
        host.scenario(stdout=error + "\n", exit=255)
    host.make_agent()
    st = host.tick(4).state
    (p,) = st["host_problems"]
    assert (p["kind"], p["severity"], p["action"]) == ("smi_failing", "warning", "check_host")
    assert drain.critical(st) is None
    assert judge(st, time.time())[0] == ExitCode.WARNING
