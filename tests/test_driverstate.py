"""The driver's host problems on a fake host: no_driver_module, driver_mismatch, driver_hung,
from real kernel lines (make-test-journal, this boot), the fake sysfs and the fake nvidia-smi."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import pytest

from gpuagent.commands import drain
from gpuagent.commands.status import ExitCode, judge
from gpuagent.logs import Event
from gpuagent.schema import ProblemEntry
from gpuagent.sources.driver import driver, driverstate
from gpuagent.sources.driver.driver import NvmlLibrary
from tests import fakesysfs, test_kernlog
from tests.conftest import Host
from tests.fake_units import FakeUnits, unit
from tests.test_kernlog import NOT_FOUND, REJECTED, append, userspace

FM, PD = "nvidia-fabricmanager.service", "nvidia-persistenced.service"

make = test_kernlog.make

HOST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus", "host")
# siderolabs/talos (the capture's .source.txt): the kernel's own line under Secure Boot.
KEY_REJECTED = "[    5.120000] Loading of module with unavailable key is rejected\n"


def host_text(name: str) -> str:
    with open(os.path.join(HOST, name + ".txt"), encoding="utf-8") as f:
        return f.read()


def host_problems(host: Host) -> list[ProblemEntry]:
    return host.state["host_problems"]


def kinds(host: Host) -> list[tuple[str, str, str]]:
    return [(p["kind"], p["severity"], p["action"]) for p in host_problems(host)]


def code(host: Host) -> ExitCode:
    return judge(host.state, time.time())[0]


def test_gpus_waiting_for_the_module_past_the_grace(host: Host, make: Any) -> None:
    fakesysfs.set_module(host.root, False)
    host.make_agent(journal_directory=make(KEY_REJECTED), driver_absent_grace=60.0)
    host.tick(6)  # 0 … 50 s: within the grace, a warning (the writer's, not status's)
    assert kinds(host) == [("no_driver_module", "warning", "check_host")]
    assert host_problems(host)[0]["message"].startswith(
        "the nvidia kernel module is not loaded (critical after driver_absent_grace, 60 s): "
    )
    assert code(host) == ExitCode.WARNING
    assert host.probe["gate"] == "driver_not_loaded"
    (unloaded,) = host.events(Event.DRIVER_UNLOADED)
    assert unloaded.getMessage() == (
        "NVIDIA kernel module not loaded with 8 GPUs on the PCI bus; not probing "
        "(nvidia-smi would load it)"
    )
    assert "upgrade" not in unloaded.getMessage()
    host.tick()
    assert kinds(host) == [("no_driver_module", "critical", "check_host")]
    message = host_problems(host)[0]["message"]
    assert message.startswith("the nvidia kernel module has not been loaded for 60 s: ")
    assert "the kernel rejected the module's signature" in message
    assert "fixes no_driver_module" in host.state["status"]
    assert code(host) == ExitCode.CRITICAL
    # The warning's start is the gate's line above; the verdict says its turn to critical:
    # one problem, one since.
    (restated,) = host.events(Event.problem("no_driver_module"))
    assert restated.levelno == logging.ERROR
    assert restated.getMessage().startswith("host: critical no_driver_module: ")
    fakesysfs.set_module(host.root, True)
    host.healthy()
    host.tick()
    assert host_problems(host) == []
    assert code(host) == ExitCode.OK
    assert [r.PROBLEM for r in host.events(Event.PROBLEM_CLEARED)] == ["no_driver_module"]  # type: ignore[attr-defined]


def test_without_nvidia_smi_the_verdict_says_the_wait_itself(host: Host) -> None:
    # The gate stops at nvidia-smi's absence and says nothing of the module.
    fakesysfs.set_module(host.root, False)
    host.make_agent(nvidia_smi="/nonexistent/nvidia-smi", driver_absent_grace=60.0)
    host.tick(2)
    assert host.events(Event.DRIVER_UNLOADED) == []
    (start,) = host.events(Event.problem("no_driver_module"))
    assert start.levelno == logging.WARNING and start.getMessage().startswith("host: warning ")
    fakesysfs.set_module(host.root, True)
    host.tick()
    assert [r.PROBLEM for r in host.events(Event.PROBLEM_CLEARED)] == ["no_driver_module"]  # type: ignore[attr-defined]


def test_without_a_reason_in_the_journal_it_says_so(host: Host) -> None:
    fakesysfs.set_module(host.root, False)
    host.make_agent(driver_absent_grace=20.0)
    host.tick(3)
    assert host_problems(host)[0]["message"].endswith("nothing in the journal says why")


def absent_with(host: Host, make: Any, records: bytes) -> str:
    """The no_driver_module line once the grace is over, the journal holding a quiet boot of
    the kernel and ``records`` (export format) appended."""
    journal = make("[    1.000000] Linux version 6.1.0-28-amd64\n")
    append(journal, records)
    fakesysfs.set_module(host.root, False)
    host.make_agent(journal_directory=journal, driver_absent_grace=20.0)
    host.tick(3)
    assert kinds(host) == [("no_driver_module", "critical", "check_host")]
    return host_problems(host)[0]["message"]


def test_modprobe_found_no_module_for_the_running_kernel(host: Host, make: Any) -> None:
    # NVIDIA/nvidia-docker#291 and #365: modprobe's stderr in a unit's journal.
    message = absent_with(
        host, make, userspace(NOT_FOUND, comm="modprobe", unit="nvidia-persistenced.service")
    )
    assert message == (
        "the nvidia kernel module has not been loaded for 20 s: modprobe found no nvidia "
        "module for the running kernel: install the driver for it (DKMS)"
    )


def test_modprobe_refused_by_secure_boot(host: Host, make: Any) -> None:
    # canonical/nvidia-graphics-drivers#61 (535.113.01, Secure Boot on).
    message = absent_with(host, make, userspace(REJECTED, comm="modprobe", transport="syslog"))
    assert message.endswith(
        ": the kernel rejected the module's signature (Secure Boot or module.sig_enforce): "
        "sign the module or enroll its key with mokutil"
    )


def test_systemd_modules_load_found_no_module(host: Host, make: Any) -> None:
    found = userspace("Failed to find module 'nvidia'", comm="systemd-modules-load")
    assert "modprobe found no nvidia module" in absent_with(host, make, found)


def test_a_forged_loader_line_explains_nothing(host: Host, make: Any) -> None:
    # `logger -t modprobe …`: its identifier is the user's choice, its _COMM is logger's.
    forged = userspace(NOT_FOUND, comm="logger", identifier="modprobe", transport="syslog")
    assert absent_with(host, make, forged).endswith("nothing in the journal says why")


def test_a_reload_applies_the_new_grace(host: Host) -> None:
    fakesysfs.set_module(host.root, False)
    agent = host.make_agent()
    host.tick(3)
    assert kinds(host) == [("no_driver_module", "warning", "check_host")]
    agent.configure(host.config(driver_absent_grace=20.0))
    host.tick()
    assert kinds(host) == [("no_driver_module", "critical", "check_host")]


def test_gpus_all_passed_through_wait_for_no_module(host: Host) -> None:
    for slot in host.slots:
        fakesysfs.bind(host.root, slot, "vfio-pci")
    fakesysfs.set_module(host.root, False)
    host.make_agent(driver_absent_grace=10.0)
    host.tick(5)
    assert host_problems(host) == []


def installed(host: Host, version: str) -> str:
    """An NVML library of ``version`` as the driver installs it; returns the link's path."""
    lib = os.path.join(host.dir, "lib")
    os.makedirs(lib, exist_ok=True)
    real = os.path.join(lib, f"libnvidia-ml.so.{version}")
    with open(real, "w") as f:
        f.write("ELF")
    link = os.path.join(lib, "libnvidia-ml.so.1")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(real, link)
    return link


def loaded(host: Host, version: str) -> None:
    with open(os.path.join(host.root, "module", "nvidia", "version"), "w") as f:
        f.write(version + "\n")


def booted(host: Host, at: float) -> None:
    """This boot began at ``at`` (s since the epoch): the proc tree's ``stat``."""
    with open(os.path.join(host.proc, "stat"), "w") as f:
        f.write(f"cpu  1 2 3 4\nctxt 100\nbtime {at:.0f}\nprocesses 50\n")


def test_an_upgrade_awaiting_its_reboot(host: Host, make: Any) -> None:
    # The capture's client 'kwin_wayland' of 595.84 refused by kernel module 595.80.
    text = host_text("kernel-api-mismatch-dmesg-client-name-pid-driver595.84-vs-595.80")
    host.healthy()
    loaded(host, "595.80")
    library = installed(host, "595.84")
    booted(host, os.stat(library).st_mtime - 3600)  # installed an hour after the boot
    host.make_agent(journal_directory=make(text), nvml_library=library)
    host.tick(2)
    assert kinds(host) == [("driver_mismatch", "critical", "reboot")]
    message = host_problems(host)[0]["message"]
    assert message.startswith("driver 595.84 is installed but kernel module 595.80 is loaded; ")
    assert "the kernel refused a client 'kwin_wayland' of version 595.84" in message
    assert "no new CUDA job can start" in message
    assert code(host) == ExitCode.CRITICAL
    assert len(host.events(Event.problem("driver_mismatch"))) == 1
    # The reboot did not load it (illinois-scicomp/machine-shop-maintenance#70): the library
    # is older than the boot now, and a reboot again would not help.
    booted(host, os.stat(library).st_mtime + 60)
    host.tick()
    assert kinds(host) == [("driver_mismatch", "critical", "check_host")]
    assert "reboot" not in host_problems(host)[0]["message"]
    # Rebuilt for this kernel: the new module is loaded; the old record names the old one.
    loaded(host, "595.84")
    host.tick()
    assert host_problems(host) == []


def test_nvidia_smi_s_exit_18_is_a_driver_mismatch(host: Host) -> None:
    # oddmario/NVIDIA-Ubuntu-Driver-Guide#4: an unattended upgrade; nvidia-smi says
    # "Failed to initialize NVML: Driver/library version mismatch" (exit 18).  The NVML
    # library's version is unknown here (no such file): exit 18 is nvidia-smi's own word.
    host.scenario(error="driver-library-version-mismatch-exit18-nvml550.144.txt", exit=18)
    host.make_agent()
    host.tick(2)
    assert host.probe["failure_class"] == "version_mismatch"
    assert host_problems(host) == []  # two failures are a blip, no outage yet
    host.tick()
    assert kinds(host) == [("driver_mismatch", "critical", "check_host")]
    assert host_problems(host)[0]["message"].startswith(
        "nvidia-smi: Driver/library version mismatch (exit 18): no new CUDA job can start"
    )
    assert code(host) == ExitCode.CRITICAL
    host.healthy()
    for _ in range(6):  # the backoff's next try
        if host.tick().state["probe"]["state"] == "ok":
            break
    assert host_problems(host) == []


def test_the_same_driver_installed_and_loaded_is_no_problem(host: Host) -> None:
    host.healthy()
    loaded(host, "590.48.01")
    host.make_agent(nvml_library=installed(host, "590.48.01"))
    host.tick(2)
    assert host_problems(host) == []
    assert code(host) == ExitCode.OK


def test_the_versions_are_read_only_while_the_bus_has_the_module(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[str] = []
    library = NvmlLibrary.version

    def loaded_version(root: str) -> str | None:
        read.append("module")
        return driver.loaded_version(root)

    def version(self: NvmlLibrary) -> str | None:
        read.append("library")
        return library(self)

    monkeypatch.setattr(driverstate, "loaded_version", loaded_version)
    monkeypatch.setattr(NvmlLibrary, "version", version)
    host.healthy()
    fakesysfs.set_module(host.root, False)
    host.make_agent(nvml_library=installed(host, "595.84"))
    host.tick(3)
    assert read == []  # the scan saw no module: no version to compare, nothing pending
    fakesysfs.set_module(host.root, True)
    loaded(host, "595.80")
    host.tick()
    assert read == ["module", "library"]
    assert kinds(host) == [("driver_mismatch", "critical", "check_host")]  # no boot time


def test_nvidia_smi_timing_out_is_a_warning_and_never_drains(host: Host) -> None:
    # NVIDIA/NVSentinel#1748: nvidia-smi hangs with the driver loaded, again and again; the
    # field's complaint is a monitor that drains on that alone (issue 39).
    host.scenario(hang=60)
    host.make_agent(probe_timeout=0.3, hang=True, driver_hung_after=30.0)
    host.tick()
    assert kinds(host) == [("smi_timeout", "warning", "check_host")]
    assert code(host) == ExitCode.WARNING
    reports = [host.tick() for _ in range(8)]
    assert [(p["kind"], p["severity"]) for p in reports[-1].state["host_problems"]] == [
        ("smi_timeout", "warning")
    ]
    assert code(host) == ExitCode.WARNING
    # One answer between timeouts does not end it; three in a row do.
    host.healthy()
    host.patient()
    for _ in range(10):  # the backoff's cap is 6 ticks
        if host.tick().state["probe"]["state"] == "ok":
            break
    assert kinds(host) == [("smi_timeout", "warning", "check_host")]
    host.tick(2)
    assert host_problems(host) == []


def test_persistenced_down_explains_the_timeouts(host: Host) -> None:
    """Without nvidia-persistenced each nvidia-smi run initialises every GPU again (30 s
    instead of 2 s on 8-GPU A100 VMs, Azure/aks-gpu#105): its fix, no critical, no drain."""
    host.scenario(hang=60)
    units = FakeUnits()
    units.set(unit(FM, load="not-found", restarts=None), unit(PD, "inactive", "dead"))
    host.make_agent(units=units, probe_timeout=0.3, hang=True, driver_hung_after=30.0)
    host.tick(9)
    assert sorted(kinds(host)) == [
        ("persistenced_down", "warning", "restart_service"),
        ("smi_timeout", "warning", "restart_service"),
    ]
    (slow,) = [p for p in host.state["host_problems"] if p["kind"] == "smi_timeout"]
    assert "start it (systemctl start nvidia-persistenced)" in slow["message"]
    assert drain.critical(host.state) is None


def test_an_unloaded_module_ends_a_hung_driver(host: Host) -> None:
    host.scenario(hang=60)
    host.make_agent(probe_timeout=0.3, hang=True)
    host.tick()
    assert kinds(host) == [("smi_timeout", "warning", "check_host")]
    fakesysfs.set_module(host.root, False)
    host.tick()
    assert [k for k, _, _ in kinds(host)] == ["no_driver_module"]


def test_a_cpu_starved_agent_is_said_so_and_never_drains(host: Host) -> None:
    """The kernel's CPU pressure for the agent: its probes time out because it waits for a
    CPU, not because the driver hangs (issue 39)."""
    host.scenario(hang=60)  # the fake's /proc made anew: the pressure file after it
    os.makedirs(os.path.join(host.proc, "pressure"), exist_ok=True)
    with open(os.path.join(host.proc, "pressure", "cpu"), "w", encoding="ascii") as f:
        f.write("some avg10=91.00 avg60=80.50 avg300=40.00 total=123456789\n")
    host.make_agent(probe_timeout=0.3, hang=True, driver_hung_after=30.0)
    host.tick(9)
    (slow,) = host_problems(host)
    assert (slow["kind"], slow["severity"], slow["action"]) == (
        "smi_timeout",
        "warning",
        "check_host",
    )
    assert "the agent waited for a CPU 80.5 % of the last minute" in slow["message"]
    assert drain.critical(host.state) is None
