"""GPU health on a fake host: the five inputs of issue 11 and every kind's start and end.

Each scenario is a real capture (H200, driver 590.48.01) answered for the fake host's GPUs,
with the fault put in the way nvidia-smi shows it: a captured error line before the rows,
a captured infoROM warning, a cell overridden in one GPU's row, a sysfs change.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import pytest

from gpuagent.commands.status import ExitCode, judge
from gpuagent.logs import Event
from gpuagent.schema import GpuEntry, State
from gpuagent.sources.probe import rules
from tests import fakesysfs
from tests.conftest import Host

NVIDIA, H200, CLASS_3D = 0x10DE, 0x2335, 0x030200
RESET = "[GPU requires reset]"


def gpu(state: State, slot: str) -> GpuEntry:
    entries = [g for g in state["gpus"] if g["pci_slot"] == slot]
    assert len(entries) == 1
    return entries[0]


def verdicts(entry: GpuEntry) -> list[tuple[str, str, str]]:
    """A GPU entry's problems as (kind, severity, action)."""
    return [(p["kind"], p["severity"], p["action"]) for p in entry["problems"]]


def loud(host: Host) -> list[logging.LogRecord]:
    return [r for r in host.logs.records if r.levelno >= logging.INFO]


def code(host: Host) -> ExitCode:
    # judge() checks the pid and the age: this process, written just now.
    return judge(host.state, time.time())[0]


def others_fresh(host: Host, sick: str) -> None:
    """Every GPU but ``sick`` has fresh values: temperature, utilization, power."""
    for g in host.state["gpus"]:
        if g["pci_slot"] == sick:
            continue
        assert (g["health"], g["stale"], g["problems"]) == ("ok", False, []), g["pci_slot"]
        assert g["fields"]["temperature.gpu"] == 52
        assert g["fields"]["utilization.gpu"] == 100
        assert g["fields"]["power.draw"] == 627.4


def one_start(host: Host, kind: str, slot: str, level: int) -> None:
    starts = host.events(Event.problem(kind))
    assert len(starts) == 1, [r.getMessage() for r in starts]
    assert starts[0].levelno == level
    assert slot == starts[0].PCI_SLOT  # type: ignore[attr-defined]
    assert kind in starts[0].getMessage() and slot in starts[0].getMessage()
    assert "action: " in starts[0].getMessage()


def one_end(host: Host, kind: str, slot: str) -> None:
    ends = [r for r in host.events(Event.PROBLEM_CLEARED) if kind == r.PROBLEM]  # type: ignore[attr-defined]
    assert len(ends) == 1
    assert ends[0].levelno == logging.INFO
    assert slot == ends[0].PCI_SLOT  # type: ignore[attr-defined]


def rebound(host: Host, kind: str, sick: str) -> None:
    """``sick`` bound to nvidia again and answering: its ``kind`` problem ends, all is ok."""
    fakesysfs.bind(host.root, sick, "nvidia")
    host.healthy()
    host.tick()
    one_end(host, kind, sick)
    assert code(host) == ExitCode.OK


# The five inputs -----------------------------------------------------------------------------


def test_one_gpu_lost_the_others_fine(host: Host) -> None:
    """categraf#1056: one GPU's error line, the others' rows, exit 255."""
    lost = "0000:07:00.0"  # the slot the captured line names (no space after "GPU")
    fakesysfs.add_device(host.root, lost, NVIDIA, H200, CLASS_3D, "nvidia")
    host.healthy(prepend="device-handle-unknown-error-no-space-synology.txt", exit=255)
    host.make_agent()
    host.tick(5)
    snap = host.state
    assert snap["probe"]["state"] == "ok"
    others_fresh(host, lost)
    entry = gpu(snap, lost)
    assert entry["health"] == "critical"
    assert verdicts(entry) == [("lost", "critical", "reboot")]
    assert "Unknown Error" in entry["problems"][0]["message"]
    assert snap["missing"] == [lost]
    assert snap["status"] == f"drain and reboot: fixes {lost}; 1 critical; 9 GPUs, sampling"
    assert code(host) == ExitCode.CRITICAL
    one_start(host, "lost", lost, logging.ERROR)
    assert host.events(Event.GPU_MISSING) == []  # one line for one fault
    assert len(loud(host)) == 1
    host.healthy(slots=[lost, *host.slots])
    host.tick()
    one_end(host, "lost", lost)
    assert host.events(Event.GPU_BACK) == []
    assert code(host) == ExitCode.OK
    assert len(loud(host)) == 2


def test_gpu_the_driver_failed_to_initialise(host: Host) -> None:
    """aicr#1858: the module is loaded, one GPU on the bus with no driver, exit 0."""
    sick = host.slots[2]
    fakesysfs.bind(host.root, sick, None)
    host.healthy(slots=[s for s in host.slots if s != sick])
    host.make_agent()
    host.tick(5)
    snap = host.state
    others_fresh(host, sick)
    entry = gpu(snap, sick)
    assert verdicts(entry) == [("no_driver", "critical", "reboot")]
    assert code(host) == ExitCode.CRITICAL
    one_start(host, "no_driver", sick, logging.ERROR)
    assert len(loud(host)) == 1
    rebound(host, "no_driver", sick)


def test_inforom_corrupted(host: Host) -> None:
    """pai#3756: the warning before the rows, exit 14."""
    sick = "0000:00:1e.0"  # the slot the captured warning names
    fakesysfs.add_device(host.root, sick, NVIDIA, H200, CLASS_3D, "nvidia")
    slots = [sick, *host.slots]
    host.healthy(slots=slots, prepend="inforom-corrupted-warning-exit14.txt", exit=14)
    host.make_agent()
    host.tick(5)
    snap = host.state
    assert snap["probe"]["state"] == "ok"
    others_fresh(host, sick)
    entry = gpu(snap, sick)
    assert entry["fields"]["temperature.gpu"] == 52  # the sick GPU keeps its samples
    assert verdicts(entry) == [("inforom", "warning", "drain_and_rma")]
    assert code(host) == ExitCode.WARNING
    one_start(host, "inforom", sick, logging.WARNING)
    assert len(loud(host)) == 1
    host.healthy(slots=slots)
    host.tick()
    one_end(host, "inforom", sick)
    assert code(host) == ExitCode.OK


def test_gpu_requires_reset_in_its_values(host: Host) -> None:
    """gpud#1133: [GPU requires reset] as pstate, temperature.gpu and utilization.gpu."""
    sick = host.slots[5]
    cells = {"pstate": RESET, "temperature.gpu": RESET, "utilization.gpu": RESET}
    host.healthy(override={sick: cells})
    host.make_agent()
    host.tick(5)
    snap = host.state
    others_fresh(host, sick)
    entry = gpu(snap, sick)
    assert entry["fields"]["temperature.gpu"] is None
    assert entry["fields"]["memory.used"] == 32362  # what it still reports is kept
    assert verdicts(entry) == [("requires_reset", "critical", "reset_gpu")]
    assert code(host) == ExitCode.CRITICAL
    one_start(host, "requires_reset", sick, logging.ERROR)
    host.healthy()
    host.tick()
    one_end(host, "requires_reset", sick)


def test_gpu_recovery_action_reset(host: Host) -> None:
    """DCGM#263: gpu_recovery_action is Reset."""
    sick = host.slots[0]
    host.healthy(override={sick: {"gpu_recovery_action": "Reset"}})
    host.make_agent()
    host.tick(5)
    snap = host.state
    others_fresh(host, sick)
    entry = gpu(snap, sick)
    assert verdicts(entry) == [("recovery_action", "critical", "reset_gpu")]
    assert code(host) == ExitCode.CRITICAL
    one_start(host, "recovery_action", sick, logging.ERROR)
    host.healthy()
    host.tick()
    one_end(host, "recovery_action", sick)


# Every kind appears and clears -------------------------------------------------------------

ROW_FAULTS: dict[str, tuple[dict[str, str], str]] = {
    "requires_reset": ({"power.draw": RESET}, "critical"),
    "recovery_action": ({"gpu_recovery_action": "Drain P2P"}, "warning"),
    "row_remap_pending": ({"remapped_rows.pending": "Yes"}, "warning"),
    "row_remap_failed": ({"remapped_rows.failure": "Yes"}, "critical"),
    "retired_pages_pending": ({"retired_pages.pending": "Yes"}, "warning"),
    # google/cadvisor#2035, Azure/azurehpc#752: a V100 with 3 single-bit and 61 double-bit.
    "retired_pages_limit": (
        {"retired_pages.single_bit_ecc.count": "3", "retired_pages.double_bit.count": "61"},
        "critical",
    ),
    "inforom": ({"inforom.checksum_validation": "invalid"}, "warning"),
    "throttled": ({"clocks_event_reasons.active": "0x0000000000000040"}, "warning"),
    "pcie_link_degraded": ({"pcie.link.width.current": "8"}, "warning"),
    # NVIDIA/gpu-operator#1845: MIG enabled, pending until a reset.
    "mig_pending": ({"mig.mode.pending": "Enabled"}, "warning"),
    "fabric": ({"fabric.state": "In Progress", "fabric.status": "N/A"}, "critical"),
    "ecc_uncorrected": ({"ecc.errors.uncorrected.volatile.total": "2"}, "warning"),
}


@pytest.mark.parametrize("kind", sorted(ROW_FAULTS))
def test_row_kind_appears_and_clears(host: Host, kind: str) -> None:
    cells, severity = ROW_FAULTS[kind]
    sick = host.slots[3]
    host.make_agent()
    host.tick()
    host.healthy(override={sick: cells})
    # A burst: the same problem on every tick; throttling until its samples cover half of
    # throttle_window (300 s).
    host.tick(30 if kind == "throttled" else 20)
    entry = gpu(host.state, sick)
    assert [(p["kind"], p["severity"]) for p in entry["problems"]] == [(kind, severity)]
    assert entry["health"] == severity
    assert code(host) == (ExitCode.CRITICAL if severity == "critical" else ExitCode.WARNING)
    one_start(host, kind, sick, logging.ERROR if severity == "critical" else logging.WARNING)
    host.healthy()
    # Throttling is judged over throttle_window (600 s): it ends once the window has passed.
    host.tick(61 if kind == "throttled" else 5)
    one_end(host, kind, sick)
    assert len(loud(host)) == 2
    assert code(host) == ExitCode.OK


def test_throttling_is_judged_over_the_window_not_one_sample(host: Host) -> None:
    """One sample of hardware thermal slowdown (0x40) in 27 is under throttle_fraction (10 %):
    no problem; held down in 5 of 31, the samples covering half of throttle_window, it is
    one, with the counts, and one start line."""
    sick = host.slots[3]
    slowdown = {sick: {"clocks_event_reasons.active": "0x0000000000000040"}}
    host.healthy()
    host.make_agent()
    host.tick(26)
    host.healthy(override=slowdown)
    host.tick()
    assert gpu(host.state, sick)["problems"] == []
    host.tick(4)  # 5 of 31, 300 s from the first to the last
    (problem,) = gpu(host.state, sick)["problems"]
    assert (problem["kind"], problem["severity"], problem["action"]) == (
        "throttled",
        "warning",
        "check_host",
    )
    assert problem["message"] == (
        "clocks held down in 5 of 31 samples over the last 600 s: hardware thermal slowdown; "
        f"{rules.COOLING}"
    )
    host.tick(3)
    one_start(host, "throttled", sick, logging.WARNING)
    # A reload to a fraction of one half: 9 of 35 is not enough any more.
    assert host.agent is not None
    host.agent.configure(host.config(throttle_fraction=0.5))
    host.tick()
    assert gpu(host.state, sick)["problems"] == []
    one_end(host, "throttled", sick)


def test_one_slowed_sample_at_start_opens_nothing(host: Host) -> None:
    """leptonai/gpud#330: a GPU slowed by the hardware in the agent's first sample (1 of 1)
    was ``throttled`` at once; now it takes samples covering half of throttle_window
    (31 ticks of 10 s), and one slowed sample alone (then the captured 0x0) never does."""
    sick = host.slots[3]
    slowdown = {sick: {"clocks_event_reasons.active": "0x0000000000000040"}}
    host.healthy(override=slowdown)
    host.make_agent()
    host.tick()
    assert gpu(host.state, sick)["problems"] == []
    host.healthy()
    host.tick(60)
    assert gpu(host.state, sick)["problems"] == []
    assert host.events(Event.problem("throttled")) == []
    # Slowed from the start: nothing for 30 ticks, the problem on the 31st.
    host.make_agent()
    host.healthy(override=slowdown)
    host.tick(30)
    assert gpu(host.state, sick)["problems"] == []
    host.tick()
    assert verdicts(gpu(host.state, sick)) == [("throttled", "warning", "check_host")]


def test_an_nvidia_smi_outage_restarts_the_window_without_opening_one(host: Host) -> None:
    """An outage longer than throttle_window (100 s here) pruned the window: the first slowed
    sample after it was 1 of 1, a problem.  Now the window starts over and waits for its
    evidence."""
    sick = host.slots[3]
    host.make_agent(throttle_window=100.0)
    host.tick(10)
    host.failing()
    host.tick(12)  # 120 s without an answer (the backoff asks now and then)
    host.healthy(override={sick: {"clocks_event_reasons.active": "0x0000000000000040"}})
    for _ in range(20):
        host.tick()
        if host.probe["state"] == "ok":
            break
    assert host.probe["state"] == "ok"
    assert gpu(host.state, sick)["problems"] == []
    assert host.events(Event.problem("throttled")) == []


def test_gone_from_bus_and_back(host: Host) -> None:
    sick = host.slots[4]
    host.make_agent()
    host.tick()
    fakesysfs.remove_device(host.root, sick)
    host.healthy(slots=[s for s in host.slots if s != sick])
    host.tick(10)
    snap = host.state
    entry = gpu(snap, sick)
    assert [(p["kind"], p["action"]) for p in entry["problems"]] == [("gone_from_bus", "reboot")]
    assert entry["stale"] is True  # its last sample is kept, for its UUID, never as current
    assert snap["missing"] == []
    assert code(host) == ExitCode.CRITICAL
    one_start(host, "gone_from_bus", sick, logging.ERROR)
    fakesysfs.add_device(host.root, sick, NVIDIA, H200, CLASS_3D, "nvidia")
    host.healthy()
    host.tick()
    one_end(host, "gone_from_bus", sick)
    assert gpu(host.state, sick)["health"] == "ok"
    assert len(loud(host)) == 2


def test_gpu_missing_from_nvidia_smi_then_leaving_the_bus_is_not_back(host: Host) -> None:
    sick = host.slots[6]
    host.make_agent()
    host.tick()
    host.healthy(slots=[s for s in host.slots if s != sick])
    host.tick(3)
    assert len(host.events(Event.GPU_MISSING)) == 1
    fakesysfs.remove_device(host.root, sick)
    host.tick(3)
    assert host.events(Event.GPU_BACK) == []
    one_start(host, "gone_from_bus", sick, logging.ERROR)
    assert code(host) == ExitCode.CRITICAL


def test_gpu_count_below_expected(host: Host) -> None:
    host.make_agent(expected_gpus=9)
    host.tick(5)
    assert host.agent is not None
    snap = host.state
    assert [(p["kind"], p["severity"], p["action"]) for p in snap["host_problems"]] == [
        ("gpu_count", "critical", "check_host")
    ]
    assert snap["status"] == "check the host: fixes gpu_count; 1 critical; 8 GPUs, sampling"
    assert code(host) == ExitCode.CRITICAL
    one_start_host = host.events(Event.PROBLEM_GPU_COUNT)
    assert len(one_start_host) == 1 and not hasattr(one_start_host[0], "PCI_SLOT")
    host.agent.configure(host.agent.config._replace(expected_gpus=8))
    host.tick()
    assert host.state["host_problems"] == []
    assert len(host.events(Event.PROBLEM_CLEARED)) == 1


def test_lost_by_a_gpu_is_lost_line(host: Host) -> None:
    """The 'GPU is lost' form, whose text says a reboot recovers it."""
    lost = "0000:03:00.0"
    fakesysfs.add_device(host.root, lost, NVIDIA, H200, CLASS_3D, "nvidia")
    host.healthy(append="gpu-is-lost-linux.txt", exit=15)
    host.make_agent()
    host.tick(3)
    one_start(host, "lost", lost, logging.ERROR)
    assert code(host) == ExitCode.CRITICAL


def test_pages_retired_fast_warn_once_before_the_limit(host: Host) -> None:
    """Six pages retired between two samples (of a count of 2 there at start, no rise): a
    warning, one start line; it holds while the count does (its 30 days have not passed)."""
    sick = host.slots[2]

    def retired(sbe: str, dbe: str) -> dict[str, dict[str, str]]:
        cells = {"retired_pages.single_bit_ecc.count": sbe, "retired_pages.double_bit.count": dbe}
        return {sick: cells}

    host.healthy(override=retired("1", "1"))
    host.make_agent()
    host.tick(3)
    assert verdicts(gpu(host.state, sick)) == []
    host.healthy(override=retired("1", "7"))
    host.tick(3)
    entry = gpu(host.state, sick)
    assert verdicts(entry) == [("retired_pages_rising", "warning", "drain_and_rma")]
    assert entry["problems"][0]["message"].startswith("6 memory pages retired within 30 days")
    one_start(host, "retired_pages_rising", sick, logging.WARNING)
    assert code(host) == ExitCode.WARNING
    others_fresh(host, sick)


def test_every_kind_has_a_scenario() -> None:
    covered = {
        *ROW_FAULTS,
        "retired_pages_rising",
        "lost",
        "missing",
        "no_driver",
        "inforom",
        "gone_from_bus",
        "gpu_count",
        "wrong_driver",
    }
    assert covered == set(rules.KINDS)


def test_a_gpu_nouveau_took_is_wrong_driver(host: Host) -> None:
    """mattshma/bigdata#133: "NVRM: The NVIDIA probe routine was not called for 3 device(s)."
    — nouveau held the GPU.  Unlike vfio-pci, that is no choice: critical, check_host."""
    sick = host.slots[1]
    fakesysfs.bind(host.root, sick, "nouveau")
    host.healthy(slots=[s for s in host.slots if s != sick])
    host.make_agent()
    host.tick(3)
    entry = gpu(host.state, sick)
    assert entry["health"] == "critical"
    assert verdicts(entry) == [("wrong_driver", "critical", "check_host")]
    assert "bound to nouveau, not nvidia: blacklist nouveau" in entry["problems"][0]["message"]
    one_start(host, "wrong_driver", sick, logging.ERROR)
    assert code(host) == ExitCode.CRITICAL
    others_fresh(host, sick)
    rebound(host, "wrong_driver", sick)


def test_a_host_whose_gpus_nouveau_holds_is_critical_not_all_ok(host: Host) -> None:
    """The three V100s of mattshma/bigdata#133, all nouveau's: no longer "no_gpu, all OK"."""
    for slot in host.slots:
        fakesysfs.bind(host.root, slot, "nouveau")
    fakesysfs.set_module(host.root, False)
    host.make_agent()
    host.tick(2)
    assert host.probe["gate"] == "no_gpu"
    assert {g["health"] for g in host.state["gpus"]} == {"critical"}
    # Eight problems, the remedy and the worst named: the detail ("; not sampled") gives way.
    assert host.state["status"] == (
        f"check the host: fixes {host.slots[0].removeprefix('0000:')}, "
        f"+{len(host.slots) - 1} more; {len(host.slots)} critical; "
        f"{len(host.slots)} GPUs, all bound to nouveau"
    )
    assert code(host) == ExitCode.CRITICAL
    assert host.spawns == 0


def test_vfio_gpu_is_ok_without_problems(host: Host) -> None:
    vm = host.slots[1]
    fakesysfs.bind(host.root, vm, "vfio-pci")
    host.healthy(slots=[s for s in host.slots if s != vm])
    host.make_agent()
    host.tick(3)
    assert gpu(host.state, vm)["health"] == "ok"
    assert code(host) == ExitCode.OK
    assert loud(host) == []


def test_a_gpu_handed_to_a_vm_while_sampled_is_ok_not_stale(host: Host) -> None:
    vm = host.slots[1]
    host.healthy()
    host.make_agent()
    host.tick(2)
    fakesysfs.bind(host.root, vm, "vfio-pci")
    host.healthy(slots=[s for s in host.slots if s != vm])
    host.tick(5)
    entry = gpu(host.state, vm)
    assert (entry["health"], entry["stale"], entry["problems"]) == ("ok", False, [])
    assert code(host) == ExitCode.OK
    fakesysfs.bind(host.root, vm, "nvidia")
    host.healthy()
    host.tick()
    assert gpu(host.state, vm)["fields"]["uuid"]
    assert code(host) == ExitCode.OK


def test_gpus_appearing_on_a_reload_log_one_line(host: Host, tmp_path: Any) -> None:
    empty = str(tmp_path / "empty-sys")
    os.makedirs(os.path.join(empty, "bus", "pci", "devices"))
    fakesysfs.set_module(empty, True)
    agent = host.make_agent(sysfs_root=empty)
    assert host.tick(3).status == "no NVIDIA GPU on the PCI bus"
    agent.configure(agent.config._replace(sysfs_root=host.root))
    report = host.tick(3)
    lines = [r.getMessage() for r in loud(host)]
    assert lines == [
        f"8 NVIDIA GPUs appeared on the PCI bus ({', '.join(host.slots)}); 8 on it now"
    ]
    assert report.status == "8 GPUs, sampling"


def test_persistence_mode_hint_once_when_probes_are_slow(host: Host) -> None:
    host.healthy(override={s: {"persistence_mode": "Disabled"} for s in host.slots})
    # A probe takes longer than 5 ms, half this probe_timeout; the runner may take longer.
    host.make_agent(probe_timeout=0.01)
    assert host.runner is not None
    host.runner.timeout = 30.0
    host.tick(5)
    hints = [r.getMessage() for r in loud(host) if "nvidia-persistenced" in r.getMessage()]
    assert len(hints) == 1
    assert "re-initialises the GPUs" in hints[0]
    duration = host.probe["duration"]
    assert duration is not None and duration > 0


def test_a_bus_that_cannot_be_listed_is_not_every_gpu_gone(host: Host) -> None:
    host.make_agent()
    host.tick()
    devices = os.path.join(host.root, "bus", "pci", "devices")
    os.rename(devices, devices + ".away")
    host.tick(3)
    assert host.events(Event.PROBLEM_GONE_FROM_BUS) == []
    assert len(host.events(Event.SYSFS_PROBLEM)) == 1
    os.rename(devices + ".away", devices)
    host.tick()
    assert code(host) == ExitCode.OK
