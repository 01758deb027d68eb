"""The agent driven tick by tick on fake hosts with a replaying nvidia-smi."""

from __future__ import annotations

import logging
import os

import pytest

from gpuagent.agent import Agent
from gpuagent.edges.runner import Runner
from gpuagent.logs import Event, EventLog
from gpuagent.sources.probe.probe import Prober
from gpuagent.sources.probe.smi import FIELDS
from tests import fakesysfs, replay
from tests.conftest import Host
from tests.fake_units import FakeUnits
from tests.fakehost import H200_LOAD, NOT_LOADED
from tests.test_smi import BLOCKED

INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR


def tick_until_ok(host: Host, limit: int) -> None:
    """Tick until the probe is ok; a regression that never gets there fails, not hangs."""
    for _ in range(limit):
        if host.tick().state["probe"]["state"] == "ok":
            return
    pytest.fail(f"the probe is not ok after {limit} ticks: {host.probe}")


def test_gpu_less_host_never_spawns(tmp_path: str) -> None:
    d = str(tmp_path)
    h = Host(
        d,
        os.path.join(d, "sys"),
        "/nonexistent/nvidia-smi",
        "/nonexistent.toml",
        [],
        os.path.join(d, "calls"),
    )
    fakesysfs.add_device(h.root, "0000:03:00.0", 0x1A03, 0x2000, 0x030000, "ast")
    which_calls: list[str] = []

    def which(name: str) -> str | None:
        which_calls.append(name)
        return None

    logger = logging.getLogger(f"test.which.{id(h)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.handlers[:] = [h.logs]
    h.runner = Runner(timeout=5.0)
    h.agent = Agent(
        h.config(),
        Prober(h.runner),
        EventLog(logger),
        monotonic=h.clock,
        which=which,
        units=FakeUnits,
    )
    snap = h.tick(1000).state
    assert snap["probe"]["spawns_total"] == 0
    assert which_calls == []
    assert snap["probe"]["state"] == "idle"
    assert snap["probe"]["next_probe_in_ticks"] is None
    assert snap["status"] == "no NVIDIA GPU on the PCI bus"
    assert [r for r in h.logs.records if r.levelno >= INFO] == []


def test_gpus_passed_through_to_vms_are_not_probed(host: Host) -> None:
    for slot in host.slots:
        fakesysfs.bind(host.root, slot, "vfio-pci")
    host.make_agent()
    report = host.tick(50)
    assert host.spawns == 0
    assert report.state["probe"]["state"] == "idle"
    assert report.status == "8 GPUs, all bound to vfio-pci; not sampled"


def test_healthy_host_samples_every_tick_and_logs_nothing(host: Host) -> None:
    host.make_agent()
    report = host.tick(5)
    assert host.spawns == 5
    snap = report.state
    assert snap["probe"]["state"] == "ok"
    assert [g["pci_slot"] for g in snap["gpus"]] == host.slots
    g = snap["gpus"][0]
    assert g["fields"]["name"] == "NVIDIA H200"
    assert g["fields"]["memory.total"] == 143771
    assert set(g["fields"]) == set(FIELDS)
    assert not g["stale"]
    assert snap["missing"] == []
    assert report.status == "8 GPUs, sampling"
    assert [r for r in host.logs.records if r.levelno >= INFO] == []


def test_missing_binary_then_installed(host: Host) -> None:
    os.unlink(host.smi)
    host.make_agent()
    host.tick(20)
    assert host.spawns == 0
    assert host.probe["state"] == "gated"
    assert host.probe["gate"] == "nvidia_smi_missing"
    assert len(host.events(Event.NVIDIA_SMI_MISSING)) == 1
    assert host.events(Event.NVIDIA_SMI_MISSING)[0].levelno == WARNING
    os.symlink(os.path.join(os.path.dirname(__file__), "fake_nvidia_smi.py"), host.smi)
    host.tick()
    assert host.spawns == 1
    assert host.probe["state"] == "ok"
    assert len(host.events(Event.NVIDIA_SMI_FOUND)) == 1


def test_missing_binary_found_on_path(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    host.make_agent(nvidia_smi="nvidia-smi")
    monkeypatch.setenv("PATH", "/nonexistent")
    host.tick(3)
    assert host.probe["gate"] == "nvidia_smi_missing"
    monkeypatch.setenv("PATH", os.path.dirname(host.smi))
    host.tick()
    assert host.probe["state"] == "ok"


def test_seed_driver_upgrade(host: Host) -> None:
    """Module gone 8 ticks, then exit 18 for 5 ticks, then healthy (the seed's epyclab)."""
    host.make_agent()
    host.tick(3)
    host.logs.records.clear()
    fakesysfs.set_module(host.root, False)
    for slot in host.slots:
        fakesysfs.bind(host.root, slot, None)
    before = host.spawns
    host.tick(8)
    assert host.spawns == before
    assert host.probe["state"] == "gated"
    assert host.probe["next_probe_in_ticks"] is None
    assert len(host.events(Event.DRIVER_UNLOADED)) == 1
    # The old samples are kept, marked stale, never shown as current.
    assert host.state["gpus"][0]["stale"] is True

    fakesysfs.set_module(host.root, True)
    for slot in host.slots:
        fakesysfs.bind(host.root, slot, "nvidia")
    host.failing()
    host.tick(5)
    assert len(host.events(Event.DRIVER_LOADED)) == 1
    # Exit 18's outage is driver_mismatch's to tell: one error, which says what helps (the
    # fake's library is unknown: no reboot asked for), and no "nvidia-smi failing" beside it.
    (mismatch,) = host.events(Event.PROBLEM_DRIVER_MISMATCH)
    assert mismatch.levelno == ERROR
    assert mismatch.getMessage().startswith(
        "host: critical driver_mismatch: nvidia-smi: Driver/library version mismatch (exit 18)"
    )
    assert host.lines(WARNING) == [host.events(Event.DRIVER_UNLOADED)[0].getMessage()]
    # Module back at tick 0 of this phase: probes at 0, 1, 2 (the outage), then 4.
    assert host.spawns == before + 4
    assert host.report is not None
    assert host.report.status == (
        "check_host; 1 critical; 8 GPUs, nvidia-smi failing (version_mismatch)"
    )
    assert host.report.state["remedy"] == {
        "action": "check_host",
        "says": "check the host",
        "fixes": ["host driver_mismatch"],
        "leaves": [],
    }
    # Within driver_absent_grace the module's absence was a warning, told by the gate's lines.
    assert host.events(Event.PROBLEM_NO_DRIVER_MODULE) == []

    host.healthy()
    tick_until_ok(host, 10)  # the next probe is 4 ticks away
    assert host.events(Event.RECOVERED) == []
    assert [r.PROBLEM for r in host.events(Event.PROBLEM_CLEARED)] == ["driver_mismatch"]  # type: ignore[attr-defined]
    snap = host.state
    assert all(not g["stale"] for g in snap["gpus"])
    assert snap["probe"]["consecutive_failures"] == 0
    infos_and_up = [r for r in host.logs.records if r.levelno >= INFO]
    # One line each: unloaded, loaded, the mismatch, its end (bench/day.py's upgrade).
    assert len(infos_and_up) == 4


def test_failing_probe_backs_off_by_ticks(host: Host) -> None:
    host.failing(NOT_LOADED, 9)
    host.make_agent()
    probed = []
    for tick in range(40):
        before = host.spawns
        host.tick()
        if host.spawns > before:
            probed.append(tick)
    assert probed == [0, 1, 2, 4, 8, 14, 20, 26, 32, 38]
    assert len(host.lines(WARNING)) == 1
    assert host.probe["consecutive_failures"] == 10


def test_one_warning_per_outage_at_the_threshold(host: Host) -> None:
    host.make_agent(backoff_after=2)
    for _ in range(2):
        host.failing(NOT_LOADED, 9)
        host.tick(10)
        host.healthy()
        host.tick(20)
    assert len(host.events(Event.FAILING_DRIVER_NOT_LOADED)) == 2
    assert len(host.events(Event.RECOVERED)) == 2


def test_a_short_blip_is_not_an_outage(host: Host) -> None:
    host.make_agent()
    host.failing()
    host.tick(2)
    host.healthy()
    host.tick()
    assert [r for r in host.logs.records if r.levelno >= INFO] == []


def test_samples_go_stale_after_two_intervals(host: Host) -> None:
    host.make_agent()
    host.tick()
    host.failing()
    host.tick(2)  # two intervals old: not older than two intervals yet
    assert not host.state["gpus"][0]["stale"]
    host.tick()
    assert host.state["gpus"][0]["stale"]
    assert host.state["gpus"][0]["fields"]["name"] == "NVIDIA H200"


def test_hang_times_out_and_the_group_is_killed(host: Host) -> None:
    host.scenario(hang=30)
    host.make_agent(probe_timeout=0.3, hang=True)
    probe = host.tick().state["probe"]
    assert probe["state"] == "failing"
    assert probe["failure_class"] == "timeout"
    assert "no answer within 0.3 s" in (probe["last_error"] or "")
    assert host.runner is not None and not host.runner.busy()


def test_child_ignoring_sigterm(host: Host) -> None:
    host.scenario(hang=30, ignore_term=True)
    host.make_agent(probe_timeout=0.3, hang=True)
    host.tick()
    assert host.probe["failure_class"] == "timeout"
    assert host.runner is not None and not host.runner.busy()
    host.healthy()
    host.patient()
    host.tick()
    assert host.probe["state"] == "ok"


def test_invalid_field_falls_back_at_once(host: Host) -> None:
    host.scenario(
        capture="rtx2080super-linux-driver465.27-query-gpu-115fields.csv", slots=host.slots[:1]
    )
    for slot in host.slots[1:]:
        fakesysfs.remove_device(host.root, slot)
    host.make_agent()
    host.tick()
    # The 465 driver knows neither clocks_event_reasons.* nor temperature.gpu.tlimit, nor
    # the six health fields that came later (infoROM checksum, recovery action, remapped rows,
    # fabric): one spawn each, on the first tick only.
    assert host.spawns == 9
    assert host.probe["state"] == "ok"
    assert "clocks_throttle_reasons.active" in host.probe["fields"]
    assert "clocks_event_reasons.active" not in host.probe["fields"]
    fields = host.state["gpus"][0]["fields"]
    # The capture's value under the old name: the GPU idle (bit 0).
    assert fields["clocks_throttle_reasons.active"] == "0x0000000000000001"
    assert host.lines(WARNING) == []
    host.tick()
    assert host.spawns == 10  # the narrowed list is kept


def test_field_rejected_under_both_names_is_dropped(host: Host) -> None:
    host.healthy(
        reject=["clocks_event_reasons.active", "clocks_throttle_reasons.active", "mig.mode.current"]
    )
    host.make_agent()
    host.tick()
    assert host.spawns == 4
    assert host.probe["state"] == "ok"
    assert len(host.probe["fields"]) == len(FIELDS) - 2


def test_gpu_vanishing_from_nvidia_smi(host: Host) -> None:
    host.make_agent()
    host.tick()
    host.healthy(slots=host.slots[:7])
    report = host.tick(5)
    assert report.state["missing"] == [host.slots[7]]
    assert len(host.events(Event.GPU_MISSING)) == 1
    assert host.slots[7] == host.events(Event.GPU_MISSING)[0].PCI_SLOT  # type: ignore[attr-defined]
    assert report.status == f"drain and reboot: fixes {host.slots[7]}; 1 critical; 8 GPUs, sampling"
    # Still known, with its last sample marked stale; missing is a critical problem, logged
    # as one (an error, the shape of every problem's line).
    gone = report.state["gpus"][7]
    assert (gone["pci_slot"], gone["stale"], gone["health"]) == (host.slots[7], True, "critical")
    (line,) = host.events(Event.GPU_MISSING)
    assert line.levelno == logging.ERROR
    host.healthy()
    host.tick()
    assert host.state["missing"] == []
    assert len(host.events(Event.PROBLEM_CLEARED)) == 1


def test_gpu_appearing_later_is_picked_up(host: Host) -> None:
    for slot in host.slots:
        fakesysfs.remove_device(host.root, slot)
    host.make_agent()
    host.tick(10)
    assert host.spawns == 0
    fakesysfs.gpu_host(host.root, 8)
    host.tick()
    assert host.spawns == 1
    assert host.probe["state"] == "ok"


def test_load_driver_true_probes_without_the_module(host: Host) -> None:
    fakesysfs.set_module(host.root, False)
    host.make_agent(load_driver=True)
    host.tick()
    assert host.spawns == 1
    assert host.probe["state"] == "ok"


def test_unparseable_output(host: Host) -> None:
    host.scenario(stdout_hex="ff fe 00 41 0a".replace(" ", ""), exit=0)
    host.make_agent()
    host.tick()
    assert host.probe["failure_class"] == "unparseable"
    debug = [r.getMessage() for r in host.logs.records if r.levelno == logging.DEBUG]
    assert any("not understood" in line for line in debug)


@pytest.mark.parametrize("code", [0, 15])
def test_rows_of_the_wrong_width_are_unparseable_whatever_a_cell_says(
    host: Host, code: int
) -> None:
    # Issue 17: twenty columns where the query asked for more, a cell reading like a lost GPU
    # ("[GPU requires reset]", as nvidia-smi prints every field of such a GPU): the failure
    # is the CSV's shape, said as such, not gpu_lost with the raw rows as its reason.
    rows = replay.answer(replay.load(H200_LOAD), list(FIELDS), "csv,noheader,nounits", host.slots)
    short = [
        "[GPU requires reset], " + ", ".join(r.split(", ")[1:20]) for r in rows[0].splitlines()
    ]
    host.scenario(stdout="\n".join(short) + "\n", exit=code)
    host.make_agent()
    host.tick()
    assert host.probe["failure_class"] == "unparseable"
    assert host.probe["last_error"] == f"exit {code}: 20 columns where {len(FIELDS)} were asked for"


def test_sysfs_problem_logged_once(host: Host) -> None:
    dev = fakesysfs.add_device(host.root, "0000:f0:00.0", 0x10DE, 0x2335, 0x030200, "nvidia")
    with open(os.path.join(dev, "class"), "w") as f:
        f.write("zz\n")
    host.make_agent()
    host.tick(5)
    assert len(host.events(Event.SYSFS_PROBLEM)) == 1
    assert "sysfs" in host.state["problems"]


def test_a_cleared_gate_probes_on_that_tick_whatever_the_backoff(host: Host) -> None:
    host.failing()
    host.make_agent()
    host.tick(9)  # deep in the backoff: next probe several ticks away
    next_in = host.probe["next_probe_in_ticks"]
    assert next_in is not None and next_in > 1
    for slot in host.slots:
        fakesysfs.bind(host.root, slot, "vfio-pci")
    host.tick(2)
    assert host.probe["state"] == "idle"
    for slot in host.slots:
        fakesysfs.bind(host.root, slot, "nvidia")
    host.healthy()
    spawns = host.spawns
    host.tick()
    assert host.spawns == spawns + 1
    assert host.probe["state"] == "ok"


def test_reload_keeps_the_outage_and_looks_now_under_the_new_cap(host: Host) -> None:
    host.failing(NOT_LOADED, 9)
    agent = host.make_agent()
    host.tick(9)  # failures 0..: probes at ticks 0, 1, 2, 4, 8; the gap is now 6 ticks
    assert (host.probe["consecutive_failures"], host.probe["next_probe_in_ticks"]) == (5, 6)
    probe = agent.configure(host.config(retry_max=20.0)).state["probe"]  # cap 2 ticks
    # A reload looks now, whatever the gap had counted; the outage's count survives it.
    assert (probe["consecutive_failures"], probe["next_probe_in_ticks"]) == (5, 1)
    host.tick()
    # The next gap is the new cap's (2 ticks), not the old one's (6).
    assert (host.probe["consecutive_failures"], host.probe["next_probe_in_ticks"]) == (6, 2)
    assert len(host.events(Event.FAILING_DRIVER_NOT_LOADED)) == 1


def test_a_lower_threshold_on_reload_still_warns_once(host: Host) -> None:
    host.failing(NOT_LOADED, 9)
    agent = host.make_agent(backoff_after=10)
    host.tick(5)
    agent.configure(host.config(backoff_after=3))
    host.tick(40)
    assert len(host.events(Event.FAILING_DRIVER_NOT_LOADED)) == 1
    host.healthy()
    tick_until_ok(host, 10)  # the gap is at most the cap, 6 ticks
    assert len(host.events(Event.RECOVERED)) == 1


def test_a_higher_threshold_on_reload_does_not_warn_again(host: Host) -> None:
    host.failing(NOT_LOADED, 9)
    agent = host.make_agent(backoff_after=3)
    host.tick(5)
    agent.configure(host.config(backoff_after=6))
    host.tick(40)
    assert len(host.events(Event.FAILING_DRIVER_NOT_LOADED)) == 1


def test_access_blocked_by_a_sandbox_is_one_warning_naming_it(host: Host) -> None:
    host.scenario(stdout=BLOCKED, exit=17)
    host.make_agent()
    report = host.tick(5)
    (warning,) = host.events(Event.FAILING_BLOCKED_BY_OS)
    assert warning.FAILURE_CLASS == "blocked_by_os"  # type: ignore[attr-defined]
    assert warning.EXIT_CODE == "17"  # type: ignore[attr-defined]
    assert "GPU access blocked by the operating system" in warning.getMessage()
    assert "ProcSubset=" in warning.getMessage()
    assert report.status == "check_host; 1 warning; 8 GPUs, nvidia-smi failing (blocked_by_os)"
    (failing,) = report.state["host_problems"]
    assert failing["message"].startswith("nvidia-smi failing (blocked_by_os): exit 17: ")
    assert "ProcSubset=" in failing["message"]
