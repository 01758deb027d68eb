"""gpuagent.sources.services.nvservices: the fabric manager and persistence rules, on hosts with
NVSwitches (HGX H100, Azure ND A100 v4) and without (a GB200 NVL compute tray), from real lspci
listings (data/corpus/pci)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.bus import pci
from gpuagent.sources.services.nvservices import (
    FABRICMANAGER,
    PERSISTENCED,
    RestartWatch,
    UnitFacts,
    fabricmanager_findings,
    fabricmanager_rerun_findings,
    fm_resumes,
    fold_fabric,
    persistence_findings,
    persistenced_findings,
)
from gpuagent.views import Finding, Row
from tests import fakesysfs
from tests.replay import CORPUS

HGX_H100 = "hgx-h100-8x-sxm5-4x-nvswitch22a3-matrox-bmc.lspci-vvv.txt"
AZURE_A100 = "azure-nd-a100-v4-8x-a100-sxm4-80gb-6x-nvswitch-bridge0680.lspci-nn.txt"
GB200_TRAY = "gb200-nvl-compute-tray-4x-gpu-aspeed-ast2600.lspci.txt"

RUNNING = UnitFacts(FABRICMANAGER, "loaded", "active", "running", "success", 0)
FAILED = UnitFacts(FABRICMANAGER, "loaded", "failed", "failed", "exit-code", 5)
STOPPED = UnitFacts(FABRICMANAGER, "loaded", "inactive", "dead", "success", 0)
LOOPING = UnitFacts(FABRICMANAGER, "loaded", "activating", "auto-restart", "exit-code", 9)
ABSENT = UnitFacts(FABRICMANAGER, "not-found", "inactive", "dead")


def switches(tmp_path: str, listing: str) -> list[str]:
    fakesysfs.from_lspci(str(tmp_path), os.path.join(CORPUS, "pci", listing))
    found, problems = pci.nvswitches(str(tmp_path))
    assert problems == []
    return found


@pytest.mark.parametrize(("listing", "count"), [(HGX_H100, 4), (AZURE_A100, 6), (GB200_TRAY, 0)])
def test_nvswitches_on_real_buses(tmp_path: str, listing: str, count: int) -> None:
    found = switches(tmp_path, listing)
    assert len(found) == count
    assert found == sorted(found)
    gpus, _ = pci.scan(str(tmp_path))
    assert not set(found) & {g.slot for g in gpus}


def test_nvswitches_without_a_bus(tmp_path: str) -> None:
    found, problems = pci.nvswitches(str(tmp_path))
    assert found == []
    assert problems[0].endswith("cannot list PCI devices: No such file or directory")


@pytest.mark.parametrize(
    ("vendor", "cls", "nvswitch"),
    [
        (0x10DE, 0x068000, True),
        (0x10DE, 0x068001, True),
        (0x10DE, 0x030200, False),
        (0x10DE, 0x060400, False),  # a PCI bridge
        (0x8086, 0x068000, False),
    ],
)
def test_is_nvswitch(vendor: int, cls: int, nvswitch: bool) -> None:
    assert pci.is_nvswitch(vendor, cls) is nvswitch


@pytest.mark.parametrize("listing", [HGX_H100, AZURE_A100])
@pytest.mark.parametrize(
    ("fm", "state"),
    [
        (FAILED, "failed (failed), result exit-code"),
        (STOPPED, "inactive (dead)"),
        (LOOPING, "activating (auto-restart), result exit-code"),
        (ABSENT, "not installed"),
    ],
)
def test_fabricmanager_down_on_nvswitch_hosts(
    tmp_path: str, listing: str, fm: UnitFacts, state: str
) -> None:
    found = switches(tmp_path, listing)
    [f] = fabricmanager_findings(found, fm)
    assert (f.kind, f.severity, f.action) == ("fabricmanager_down", CRITICAL, "restart_service")
    assert f.message == (
        f"{FABRICMANAGER} is {state} and {len(found)} NVSwitches on the PCI bus need it: "
        "no GPU can join the NVLink fabric"
    )


@pytest.mark.parametrize("listing", [HGX_H100, AZURE_A100])
def test_a_running_fabric_manager_is_no_problem(tmp_path: str, listing: str) -> None:
    assert fabricmanager_findings(switches(tmp_path, listing), RUNNING) == []
    reloading = UnitFacts(FABRICMANAGER, "loaded", "reloading", "reload")
    assert fabricmanager_findings(switches(tmp_path, listing), reloading) == []


@pytest.mark.parametrize("fm", [RUNNING, FAILED, STOPPED, ABSENT, None])
def test_a_gb200_compute_tray_never_has_fabricmanager_down(
    tmp_path: str, fm: UnitFacts | None
) -> None:
    # Its NVLink fabric is managed from the NVLink switch trays: no NVSwitch on its own bus,
    # no local fabric manager.
    assert fabricmanager_findings(switches(tmp_path, GB200_TRAY), fm) == []


def test_an_unknown_unit_state_is_no_problem(tmp_path: str) -> None:
    assert fabricmanager_findings(switches(tmp_path, HGX_H100), None) == []


FLAP = "fabricmanager_flapping"


def flaps(watch: RestartWatch, now: float, n: int | None) -> bool:
    found = watch.update(now, n)
    assert all((f.kind, f.severity, f.action) == (FLAP, WARNING, "restart_service") for f in found)
    return bool(found)


def test_flapping_starts_at_three_restarts_within_ten_minutes() -> None:
    w = RestartWatch()
    assert not flaps(w, 0, 40)  # a count already there at start is the baseline
    assert not flaps(w, 100, 41)
    assert not flaps(w, 200, 42)
    assert flaps(w, 300, 43)
    assert w.update(310, 43)[0].message == (
        f"{FABRICMANAGER} restarted 3 times within 10 min (NRestarts 43): it keeps crashing; "
        f"see journalctl -u {FABRICMANAGER}"
    )


def test_three_restarts_spread_over_more_than_ten_minutes_are_no_flapping() -> None:
    w = RestartWatch()
    assert not flaps(w, 0, 0)
    for i, t in enumerate((0.5, 400, 800, 1200, 1600), start=1):
        assert not flaps(w, t, i)


def test_flapping_ends_when_it_has_not_risen_for_ten_minutes() -> None:
    w = RestartWatch()
    flaps(w, 0, 0)
    assert flaps(w, 10, 5)  # five at once
    assert flaps(w, 400, 6)  # one more: the last rise is now t=400
    assert flaps(w, 900, 6)  # 500 s since
    assert flaps(w, 999, 6)
    assert not flaps(w, 1000, 6)  # 600 s since the last rise
    assert not flaps(w, 1100, 7)  # one rise alone does not start it again


def test_a_reset_count_is_a_new_baseline_and_unknown_counts_change_nothing() -> None:
    w = RestartWatch()
    flaps(w, 0, 10)
    assert not flaps(w, 10, 0)  # systemctl restart resets NRestarts
    assert not flaps(w, 20, None)
    assert not flaps(w, 30, 2)
    assert flaps(w, 40, 3)


PERSIST_RUNNING = UnitFacts(PERSISTENCED, "loaded", "active", "running", "success", 0)
PERSIST_FAILED = UnitFacts(PERSISTENCED, "loaded", "failed", "failed", "exit-code", 0)
PERSIST_MASKED = UnitFacts(PERSISTENCED, "masked", "inactive", "dead")
PERSIST_ABSENT = UnitFacts(PERSISTENCED, "not-found", "inactive", "dead")


@pytest.mark.parametrize(
    ("unit", "message"),
    [
        (PERSIST_RUNNING, None),
        (PERSIST_ABSENT, None),  # not installed: not "down"
        (PERSIST_MASKED, None),  # off on purpose
        (None, None),
        (
            PERSIST_FAILED,
            f"{PERSISTENCED} is failed (failed), result exit-code: without it every "
            "nvidia-smi run initialises the GPUs again",
        ),
        (
            UnitFacts(PERSISTENCED, "loaded", "inactive", "dead"),
            f"{PERSISTENCED} is inactive (dead): without it every nvidia-smi run initialises "
            "the GPUs again",
        ),
    ],
)
def test_persistenced_down(unit: UnitFacts | None, message: str | None) -> None:
    found = persistenced_findings(unit)
    if message is None:
        assert found == []
    else:
        assert found == [Finding("persistenced_down", WARNING, "restart_service", message)]


ROWS: dict[str, Row] = {
    "0000:18:00.0": {"persistence_mode": "Disabled"},  # as the L40S capture has it
    "0000:2a:00.0": {"persistence_mode": "Enabled"},  # as the H200 capture has it
    "0000:3a:00.0": {"persistence_mode": None},  # [N/A] (Windows, WDDM)
}


@pytest.mark.parametrize(
    ("unit", "action"),
    [
        (PERSIST_RUNNING, None),
        (None, None),  # not known whether it runs
        (PERSIST_FAILED, "restart_service"),
        # Nothing to restart: nvidia-smi -pm 1, which lasts until the next reboot.
        (PERSIST_ABSENT, "check_host"),
        (PERSIST_MASKED, "check_host"),
    ],
)
def test_persistence_off(unit: UnitFacts | None, action: str | None) -> None:
    found = persistence_findings(ROWS, unit)
    if action is None:
        assert found == {}
        return
    assert list(found) == ["0000:18:00.0"]
    [f] = found["0000:18:00.0"]
    assert (f.kind, f.severity, f.action) == ("persistence_off", WARNING, action)
    assert f.message.startswith(f"persistence mode is off and {PERSISTENCED} is ")
    if action == "restart_service":
        assert f.message.endswith("start it (systemctl restart nvidia-persistenced)")
    else:
        assert "nvidia-smi -pm 1" in f.message and "until the next reboot" in f.message
        assert "restart" not in f.message


FABRIC = Finding("fabric", CRITICAL, "check_host", "not joined the NVLink fabric")
OTHER = Finding("throttled", WARNING, "check_host", "clocks held down")
DOWN = Finding("fabricmanager_down", CRITICAL, "restart_service", "x")


def test_fabric_problems_fold_under_fabricmanager_down() -> None:
    gpus = {"0000:18:00.0": [FABRIC, OTHER], "0000:2a:00.0": [FABRIC], "0000:3a:00.0": []}
    folded = fold_fabric([DOWN], gpus)
    cause = ("cause", "fabricmanager_down")
    assert folded == {
        "0000:18:00.0": [Finding(**{**FABRIC.__dict__, "extra": (cause,)}), OTHER],
        "0000:2a:00.0": [Finding(**{**FABRIC.__dict__, "extra": (cause,)})],
        "0000:3a:00.0": [],
    }
    assert fold_fabric([DOWN], folded) == folded  # folding twice changes nothing
    assert fold_fabric([], gpus) == gpus
    assert (
        fold_fabric([Finding("persistenced_down", WARNING, "restart_service", "y")], gpus) == gpus
    )


# Started again at this wall time after a stop earlier this boot (systemd's timestamps).
RERUN = replace(RUNNING, rerun=1_765_000_000.0)


def test_a_restart_after_a_stop_this_boot_asks_for_the_gpus_reset() -> None:
    (f,) = fabricmanager_rerun_findings(["0000:a0:00.0"], RERUN, resumes=False, cleared=None)
    assert (f.kind, f.severity, f.action, f.ends) == (
        "fabricmanager_restarted",
        CRITICAL,
        "drain_and_reset",
        "",
    )
    assert "NVIDIA's Fabric Manager guide has the GPUs and NVSwitches reset" in f.message
    assert "nvidia-smi -r" in f.message


@pytest.mark.parametrize(
    ("nvswitches", "fm", "resumes", "cleared"),
    [
        ([], RERUN, False, None),  # no NVSwitch: no fabric manager needed
        (["0000:a0:00.0"], RUNNING, False, None),  # its first start this boot
        (["0000:a0:00.0"], replace(FAILED, rerun=1_765_000_000.0), False, None),  # down: not this
        (["0000:a0:00.0"], None, False, None),  # not known
        (["0000:a0:00.0"], RERUN, True, None),  # its restart mode resumes the fabric
        (["0000:a0:00.0"], RERUN, False, 1_765_000_100.0),  # root cleared it after the restart
        (["0000:a0:00.0"], RERUN, False, 1_765_000_000.0),
    ],
)
def test_no_reset_asked_for(
    nvswitches: list[str], fm: UnitFacts | None, resumes: bool, cleared: float | None
) -> None:
    assert fabricmanager_rerun_findings(nvswitches, fm, resumes=resumes, cleared=cleared) == []


def test_a_clear_before_the_latest_restart_ends_nothing() -> None:
    found = fabricmanager_rerun_findings(
        ["0000:a0:00.0"], RERUN, resumes=False, cleared=1_764_999_000.0
    )
    assert [f.kind for f in found] == ["fabricmanager_restarted"]


@pytest.mark.parametrize(
    ("config", "resumes"),
    [
        (None, False),  # not installed: bare metal, its default
        ("FABRIC_MODE=0\nFABRIC_MODE_RESTART=1\n", False),  # bare metal never resumes
        ("FABRIC_MODE=1\nFABRIC_MODE_RESTART=0\n", False),
        ("FABRIC_MODE=1\nFABRIC_MODE_RESTART=1\n", True),  # Shared NVSwitch
        ("FABRIC_MODE=2\nFABRIC_MODE_RESTART=1\n", True),  # vGPU multitenancy
        ("# FABRIC_MODE=1\nFABRIC_MODE_RESTART=1\n", False),  # a comment is no setting
        (" FABRIC_MODE = 1 # shared\nFABRIC_MODE_RESTART=1", True),
        ("FABRIC_MODE=1\nFABRIC_MODE_RESTART=1\nFABRIC_MODE=0\n", False),  # the last wins
        ("garbage\x00\n=\n==", False),
    ],
)
def test_the_restart_mode_from_the_fabric_managers_config(
    config: str | None, resumes: bool
) -> None:
    assert fm_resumes(config) is resumes
