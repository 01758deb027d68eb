"""Issue 16 on the fake host: NVLink links and counters, NVIDIA's services, the folding of the
GPUs' fabric problems under the fabric manager's, and the units source's own trouble."""

from __future__ import annotations

import logging
import os
import stat
import time
from typing import Any

from gpuagent import metrics
from gpuagent.commands.statustext import render
from gpuagent.config import Config
from gpuagent.edges.runner import Runner
from gpuagent.edges.systemd.units import Result, Watch
from gpuagent.logs import Event, EventLog
from gpuagent.sources.nvlink.nvlinksource import NvlinkSource
from tests import fakesysfs, test_kernlog
from tests.conftest import Host
from tests.fake_units import FakeUnits, unit
from tests.test_kernlog import append
from tests.test_victims import kernel_entry

make = test_kernlog.make

STATUS = "nvlink-status-h200-driver590.48.01-18-links.txt"
COUNTERS = "nvlink-errorcounters-h100-80gb-hbm3-driverUNKNOWN-placeholder-uuid-TRIMMED.txt"
FM = "nvidia-fabricmanager.service"
PD = "nvidia-persistenced.service"


def nvlink(host: Host, **nv: object) -> None:
    host.healthy(nvlink={"status": STATUS, "errorcounters": COUNTERS, **nv})


def test_a_link_going_inactive_is_one_start_line_and_cleared_when_it_returns(host: Host) -> None:
    nvlink(host)
    host.make_agent(nvlink_interval=10.0)
    st = host.tick(3).state
    gpu = st["gpus"][0]
    assert gpu["nvlink"]["links"] == 18 and gpu["nvlink"]["inactive"] == []
    assert "NVLink 18/18" in render(st, host.clock.now, 0, "")
    slot = host.slots[2]
    nvlink(host, override={slot: {"14": "<inactive>"}})
    st = host.tick(5).state
    sick = next(g for g in st["gpus"] if g["pci_slot"] == slot)
    assert sick["nvlink"] == {
        "links": 18,
        "active": 17,
        "inactive": [14],
        "counters": sick["nvlink"]["counters"],
    }
    assert [p["kind"] for p in sick["problems"]] == ["nvlink_down"]
    assert sick["problems"][0]["severity"] == "critical"
    starts = host.events(Event.PROBLEM_NVLINK_DOWN)
    assert len(starts) == 1 and starts[0].levelno == logging.ERROR
    assert "link 14 down, up earlier in this boot" in starts[0].getMessage()
    assert "NVLink 17/18, link 14 inactive" in render(st, host.clock.now, 2, "")
    nvlink(host)
    st = host.tick(2).state
    assert all(not g["problems"] for g in st["gpus"])
    cleared = [r.getMessage() for r in host.events(Event.PROBLEM_CLEARED)]
    assert cleared == [f"GPU {slot}: nvlink_down cleared"]
    assert len(host.events(Event.PROBLEM_NVLINK_DOWN)) == 1


def test_counters_rising_past_the_budget_then_flat(host: Host) -> None:
    slot = host.slots[0]
    nvlink(host, override={slot: {"14": {"Recovery Errors": "505"}}})
    host.make_agent(nvlink_interval=10.0, nvlink_window=100.0)
    st = host.tick(2).state
    # A lifetime count already there at start is no rise.
    assert not st["gpus"][0]["problems"]
    assert st["gpus"][0]["nvlink"]["counters"]["14"] == {"replay": 0, "recovery": 505, "crc": 0}
    nvlink(host, override={slot: {"14": {"Recovery Errors": "542"}}})
    st = host.tick(1).state
    (p,) = st["gpus"][0]["problems"]
    assert (p["kind"], p["severity"], p["action"]) == ("nvlink_errors", "warning", "reset_gpu")
    assert "link 14 recovery 505 \u2192 542" in p["message"]
    (line,) = host.events(Event.PROBLEM_NVLINK_ERRORS)
    assert line.levelno == logging.WARNING
    host.tick(8)
    assert host.state["gpus"][0]["problems"]  # still within the window
    host.tick(4)
    assert not host.state["gpus"][0]["problems"]
    assert [r.getMessage() for r in host.events(Event.PROBLEM_CLEARED)] == [
        f"GPU {slot}: nvlink_errors cleared"
    ]


def test_a_pcie_only_host_reads_nvlink_once(host: Host) -> None:
    host.make_agent(nvlink_interval=10.0)  # the fake answers nvlink with nothing
    st = host.tick(20).state
    assert host.nvlink_spawns == 1
    assert "nvlink" not in st["gpus"][0]
    assert host.agent is not None and host.agent.last.nvlink.no_nvlink


def test_no_nvlink_spawns_in_1000_ticks_once_learnt(tmp_path: str) -> None:
    log = os.path.join(tmp_path, "calls")
    smi = os.path.join(tmp_path, "nvidia-smi")
    with open(smi, "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> {log}\n')  # prints nothing: no NVLink
    os.chmod(smi, stat.S_IRWXU)
    root = os.path.join(tmp_path, "sys")
    slots = fakesysfs.gpu_host(root, 2)
    cfg = Config(interval=10.0, nvlink_interval=10.0, sysfs_root=root)
    source = NvlinkSource(cfg, Runner(timeout=5), EventLog(), monotonic=lambda: 0.0)
    for _ in range(1000):
        source.read(smi, slots, [])
    with open(log) as f:
        assert f.read().splitlines() == ["nvlink --status"]
    assert source.view.no_nvlink and source.view.spawns_total == 1


def nvswitch_host(host: Host, n: int = 4) -> None:
    for i in range(n):
        fakesysfs.add_device(host.root, f"0000:{0xA0 + i:02x}:00.0", 0x10DE, 0x22A3, 0x068000)


def fabric_pending(host: Host) -> None:
    host.healthy(override={s: {"fabric.state": "In Progress"} for s in host.slots})


def test_fabric_manager_down_on_an_nvswitch_host_is_one_host_problem(host: Host) -> None:
    nvswitch_host(host)
    fabric_pending(host)
    units = FakeUnits()
    units.set(unit(FM, "failed", "failed", result="exit-code", restarts=0), unit(PD))
    host.make_agent(units=units)
    st = host.tick(2).state
    assert [p["kind"] for p in st["host_problems"]] == ["fabricmanager_down"]
    assert st["host_problems"][0]["action"] == "restart_service"
    assert len(st["gpus"]) == 8
    for g in st["gpus"]:
        assert [(p["kind"], p.get("cause")) for p in g["problems"]] == [
            ("fabric", "fabricmanager_down")
        ]
    # One journal line for the host, none for the eight GPUs' fabric problems.
    assert len(host.events(Event.PROBLEM_FABRICMANAGER_DOWN)) == 1
    assert host.events(Event.PROBLEM_FABRIC) == []
    # One page: the host's; no GPU's worst problem, their fabric is the host's cause's.
    text = metrics.render(st)
    assert "gpuagent_gpu_worst_problem{" not in text
    pages = [line for line in text.splitlines() if line.startswith("gpuagent_host_problem{")]
    assert len(pages) == 1 and 'kind="fabricmanager_down"' in pages[0], pages
    text = render(st, host.clock.now, 2, "")
    assert "services: fabric manager failed (failed), persistenced active" in text
    assert "cause: host fabricmanager_down" in text
    assert st["services"][FM] == {
        "load_state": "loaded",
        "active_state": "failed",
        "sub_state": "failed",
        "result": "exit-code",
        "restarts": 0,
    }
    # It comes back, and the GPUs join: the host's line ends, the GPUs say nothing.
    units.set(unit(FM), unit(PD))
    host.healthy()
    st = host.tick(2).state
    assert st["host_problems"] == [] and all(not g["problems"] for g in st["gpus"])
    assert [r.getMessage() for r in host.events(Event.PROBLEM_CLEARED)] == [
        "host: fabricmanager_down cleared"
    ]


def test_the_fabric_manager_going_down_after_the_gpus_fabric_problems_is_quiet(
    host: Host,
) -> None:
    nvswitch_host(host)
    fabric_pending(host)
    units = FakeUnits()
    units.set(unit(FM), unit(PD))
    host.make_agent(units=units)
    host.tick(1)
    assert len(host.events(Event.PROBLEM_FABRIC)) == 8  # no cause known: each GPU's own
    units.set(unit(FM, "inactive", "dead"), unit(PD))
    host.tick(2)
    assert len(host.events(Event.PROBLEM_FABRIC)) == 8
    assert host.events(Event.PROBLEM_CLEARED) == []
    assert len(host.events(Event.PROBLEM_FABRICMANAGER_DOWN)) == 1


def test_a_gb200_like_tray_has_no_fabricmanager_down(host: Host) -> None:
    fabric_pending(host)  # an NVLink fabric, but no NVSwitch on its own bus
    units = FakeUnits()
    units.set(unit(FM, "inactive", "dead", load="not-found", restarts=None), unit(PD))
    host.make_agent(units=units)
    st = host.tick(2).state
    assert st["host_problems"] == []
    assert all([p["kind"] for p in g["problems"]] == ["fabric"] for g in st["gpus"])
    assert all("cause" not in g["problems"][0] for g in st["gpus"])
    assert len(host.events(Event.PROBLEM_FABRIC)) == 8
    assert "fabric manager not installed, persistenced active" in render(st, 0, 2, "")


def test_persistenced_down_and_persistence_off(host: Host) -> None:
    host.healthy(override={host.slots[0]: {"persistence_mode": "Disabled"}})
    units = FakeUnits()
    units.set(unit(FM, load="not-found", restarts=None), unit(PD, "inactive", "dead"))
    host.make_agent(units=units)
    st = host.tick(2).state
    assert [p["kind"] for p in st["host_problems"]] == ["persistenced_down"]
    assert [p["kind"] for p in st["gpus"][0]["problems"]] == ["persistence_off"]
    assert all(not g["problems"] for g in st["gpus"][1:])
    assert len(host.events(Event.PROBLEM_PERSISTENCED_DOWN)) == 1
    assert len(host.events(Event.PROBLEM_PERSISTENCE_OFF)) == 1


def test_fabric_manager_flapping(host: Host) -> None:
    units = FakeUnits()
    host.make_agent(units=units)
    for restarts in (0, 1, 2, 3):
        units.set(unit(FM, restarts=restarts), unit(PD))
        host.tick(1)
    assert [p["kind"] for p in host.state["host_problems"]] == ["fabricmanager_flapping"]
    assert len(host.events(Event.PROBLEM_FABRICMANAGER_FLAPPING)) == 1
    host.tick(61)
    assert host.state["host_problems"] == []


def test_no_system_bus_is_one_info_line_and_nothing_else(host: Host) -> None:
    host.make_agent(units=FakeUnits(Result(Watch.NOT_WATCHED)))
    st = host.tick(5).state
    (line,) = host.events(Event.SYSTEM_BUS_MISSING)
    assert line.levelno == logging.INFO
    assert st["services"] == {} and st["problems"] == {} and st["host_problems"] == []
    assert [r for r in host.logs.records if r.levelno > logging.INFO] == []


def test_a_failing_bus_is_one_warning_and_a_problems_entry(host: Host) -> None:
    error = "system bus (unix:path=/run/dbus/system_bus_socket): Connection refused"
    units = FakeUnits(Result(Watch.ERROR, error=error))
    host.make_agent(units=units)
    st = host.tick(3).state
    (line,) = host.events(Event.SYSTEM_BUS_FAILED)
    assert line.levelno == logging.WARNING and error in line.getMessage()
    assert st["problems"] == {"system_bus": error}
    assert st["probe"]["state"] == "ok"  # sampling goes on
    units.set(unit(FM), unit(PD))
    st = host.tick(1).state
    assert st["problems"] == {}
    assert len(host.events(Event.SYSTEM_BUS_RECOVERED)) == 1


def test_an_unreadable_line_is_one_warning_naming_it_and_the_reads_go_on(host: Host) -> None:
    nvlink(host, override={host.slots[1]: {"3": "26.562 furlongs"}})
    host.make_agent(nvlink_interval=10.0)
    st = host.tick(4).state
    (line,) = host.events(Event.NVLINK_UNREADABLE)
    assert line.levelno == logging.WARNING
    assert "Link 3: 26.562 furlongs" in line.getMessage()
    assert st["gpus"][0]["nvlink"]["active"] == 18  # the rest is read
    assert st["probe"]["state"] == "ok"
    assert host.nvlink_spawns == 8  # --status and --errorcounters, every tick


def test_under_the_loop_sampler_nvlink_is_read_every_5_minutes_and_at_once_on_a_fault(
    host: Host, make: Any
) -> None:
    journal, clock = _loop_agent(host, make, 60.0)
    try:
        host.tick(6)
        assert _status_reads(host) == 2  # the first tick, then every fifth
        dev = host.slots[0].rpartition(".")[0]
        append(journal, kernel_entry(clock[0] + 1, f"NVRM: Xid (PCI:{dev}): 74, pid=1, NVLink"))
        clock[0] += 2
        host.tick(1)
        assert _status_reads(host) == 3  # at once: the links of the fault
        host.make_agent(sampler="loop", interval=60.0, nvlink_interval=60.0)
        before = _status_reads(host)
        host.tick(3)
        assert _status_reads(host) - before == 3  # a set nvlink_interval holds
    finally:
        assert host.agent is not None
        host.agent.close()


def test_under_the_loop_sampler_a_storm_of_faults_reads_nvlink_once_a_minute(
    host: Host, make: Any
) -> None:
    journal, clock = _loop_agent(host, make, 10.0)
    try:
        host.tick(2)
        before = _status_reads(host)
        dev = host.slots[0].rpartition(".")[0]
        for _ in range(7):  # a critical Xid every tick for 70 s
            clock[0] += 10
            append(journal, kernel_entry(clock[0], f"NVRM: Xid (PCI:{dev}): 79, pid=1, GPU"))
            host.tick(1)
        assert _status_reads(host) - before == 2  # at the first fault, and a minute later
    finally:
        assert host.agent is not None
        host.agent.close()


def test_under_spawns_nvlink_is_read_once_a_minute(host: Host) -> None:
    nvlink(host)
    host.make_agent(interval=30.0)
    host.tick(4)
    assert _status_reads(host) == 2


def _loop_agent(host: Host, make: Any, interval: float) -> tuple[str, list[float]]:
    """An agent on the loop sampler over the NVLink host, reading the kernel's records from
    a journal it returns with the wall clock the test moves."""
    nvlink(host, loop_ms=20)
    journal: str = make("[    1.000000] nvidia: loading out-of-tree module taints kernel.\n")
    clock = [time.time()]
    host.make_agent(
        sampler="loop", interval=interval, journal_directory=journal, wall=lambda: clock[0]
    )
    return journal, clock


def _status_reads(host: Host) -> int:
    return len([c for c in host.calls() if c[:2] == ["nvlink", "--status"]])
