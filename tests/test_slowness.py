"""gpuagent.sources.driver.slowness: what explains a slow nvidia-smi (the agent's own trouble),
and the agent's CPU pressure as the kernel reports it (PSI)."""

from __future__ import annotations

import os

from gpuagent.health import WARNING
from gpuagent.sources.driver.slowness import STARVED, cpu_pressure, explain, pressure
from gpuagent.views import Finding

# /proc/pressure/cpu on a loaded 2-core Debian 12 box (kernel 6.1); the full line is the
# kernel's since 5.13 and says nothing of CPU at the host level.
LOADED = (
    "some avg10=81.23 avg60=72.40 avg300=30.02 total=201872345\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
)
IDLE = "some avg10=0.00 avg60=0.12 avg300=0.05 total=5542\n"
PD_DOWN = Finding("persistenced_down", WARNING, "restart_service", "down")


def test_pressure_is_some_avg60() -> None:
    assert pressure(LOADED) == 72.40
    assert pressure(IDLE) == 0.12
    assert pressure("") is None
    assert pressure("some avg10=x avg60=1.0 ") is None
    assert pressure("full avg10=1.00 avg60=99.00 avg300=1.00 total=1\n") is None


def test_the_agents_own_cgroup_first_then_the_host(tmp_path: str) -> None:
    sysfs, proc = os.path.join(tmp_path, "sys"), os.path.join(tmp_path, "proc")
    unit = os.path.join(sysfs, "fs", "cgroup", "system.slice", "gpuagent.service")
    os.makedirs(unit)
    os.makedirs(os.path.join(proc, "self"))
    os.makedirs(os.path.join(proc, "pressure"))
    assert cpu_pressure(sysfs, proc) is None  # a kernel without PSI
    with open(os.path.join(proc, "pressure", "cpu"), "w") as f:
        f.write(IDLE)
    assert cpu_pressure(sysfs, proc) == 0.12
    with open(os.path.join(proc, "self", "cgroup"), "w") as f:
        f.write("0::/system.slice/gpuagent.service\n")
    with open(os.path.join(unit, "cpu.pressure"), "w") as f:
        f.write(LOADED)
    assert cpu_pressure(sysfs, proc) == 72.40  # its CPUQuota= counts there
    with open(os.path.join(proc, "self", "cgroup"), "w") as f:
        f.write("0::/../../etc\n")
    assert cpu_pressure(sysfs, proc) == 0.12


def test_explain() -> None:
    assert explain((), {}, None) is None
    assert explain((), {"0000:01:00.0": {"persistence_mode": "Enabled"}}, 1.0) is None
    said, action = explain([PD_DOWN], {}, None) or ("", "")
    assert action == "restart_service"
    assert said.endswith("start it (systemctl start nvidia-persistenced)")
    said, action = explain((), {"0000:01:00.0": {"persistence_mode": "Disabled"}}, None) or (
        "",
        "",
    )
    assert action == "check_host" and "nvidia-smi -pm 1" in said
    said, action = explain((), {}, STARVED) or ("", "")
    assert action == "check_host"
    assert said.startswith(f"the agent waited for a CPU {STARVED:g} % of the last minute")
    said, _ = explain([PD_DOWN], {}, 90.0) or ("", "")
    assert "nvidia-persistenced" in said and "CPU pressure" in said
