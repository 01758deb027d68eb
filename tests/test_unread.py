"""Evidence before verdict (issue 39): a problem holds while its source cannot look.

A GPU reads ``[GPU requires reset]`` and the node is drained for it; then its source goes dark
(the nvidia module unloaded by a driver upgrade, nvidia-smi moved away or failing, the GPU
absent from nvidia-smi's answer, systemd's units unread).  Nobody reset the GPU: the problem
holds as last seen, the GPU's health is unknown, nothing is logged as cleared and Slurm keeps
the drain, until a read shows the cause gone.
"""

from __future__ import annotations

import os
import time
from typing import Any

from gpuagent.commands import drain
from gpuagent.commands.status import ExitCode, judge
from gpuagent.commands.statustext import render
from gpuagent.edges.systemd.units import Result, Watch
from gpuagent.logs import Event
from gpuagent.schema import GpuEntry
from tests import fakesysfs
from tests.conftest import Host
from tests.fake_units import FakeUnits, unit
from tests.test_clear import clear_entry
from tests.test_kernlog import append, make

__all__ = ["make"]  # the journal fixture

RESET = "[GPU requires reset]"
FM, PD = "nvidia-fabricmanager.service", "nvidia-persistenced.service"


def entry(host: Host, slot: str) -> GpuEntry:
    (g,) = [g for g in host.state["gpus"] if g["pci_slot"] == slot]
    return g


def cleared(host: Host) -> list[str]:
    return [r.getMessage() for r in host.events(Event.PROBLEM_CLEARED)]


def reset_needed(host: Host) -> str:
    """A host whose sixth GPU needs a reset, ticked until the agent says so."""
    sick = host.slots[5]
    host.healthy(override={sick: {"pstate": RESET, "temperature.gpu": RESET}})
    host.make_agent()
    host.tick(2)
    assert [p["kind"] for p in entry(host, sick)["problems"]] == ["requires_reset"]
    return sick


def held_dark(host: Host, sick: str, why: str) -> None:
    """``sick``'s requires_reset holds as last seen, said so on every surface."""
    g = entry(host, sick)
    (p,) = [p for p in g["problems"] if p["kind"] == "requires_reset"]
    assert (p["severity"], p["action"]) == ("critical", "reset_gpu")
    assert p["unread"] == why
    assert p["unread_since"] <= time.time()
    assert g["health"] == "unknown"
    assert cleared(host) == []
    assert judge(host.state, time.time())[0] == ExitCode.CRITICAL
    reason = f"gpuagent: {sick} requires_reset reset_gpu"
    node = drain.Node("gpu01", frozenset({"IDLE", "DRAIN"}), reason)
    decided = drain.decide(node, host.state, "", time.time())
    assert (decided.update, decided.held) == ((), reason)  # slurm-check keeps the drain
    shown = render(host.state, time.time(), 2, "", width=200)
    assert "not read since" in shown and f"({why}), last seen critical requires_reset" in shown


def test_the_module_unloaded_under_a_critical_gpu_holds_it(host: Host) -> None:
    sick = reset_needed(host)
    fakesysfs.set_module(host.root, False)
    host.tick(3)
    held_dark(host, sick, "the nvidia module is not loaded")
    assert all(g["health"] == "unknown" for g in host.state["gpus"])
    fakesysfs.set_module(host.root, True)
    host.healthy()
    host.tick()
    (line,) = cleared(host)
    assert line == f"GPU {sick}: requires_reset cleared"
    assert entry(host, sick)["health"] == "ok"


def test_nvidia_smi_moved_away_holds_it(host: Host) -> None:
    sick = reset_needed(host)
    os.rename(host.smi, host.smi + ".away")
    host.tick(3)
    held_dark(host, sick, "nvidia-smi is not found")
    os.rename(host.smi + ".away", host.smi)
    host.tick()
    assert [p["kind"] for p in entry(host, sick)["problems"]] == ["requires_reset"]
    assert "unread" not in entry(host, sick)["problems"][0]
    assert entry(host, sick)["health"] == "critical"
    assert len(host.events(Event.problem("requires_reset"))) == 1  # never told again


def test_nvidia_smi_failing_holds_it(host: Host) -> None:
    sick = reset_needed(host)
    host.failing("Failed to initialize NVML: Unknown Error", code=255)
    host.tick(4)
    held_dark(host, sick, "nvidia-smi failing (other)")


def test_a_gpu_absent_from_the_answer_holds_what_was_read_of_it(host: Host) -> None:
    sick = reset_needed(host)
    host.healthy(slots=[s for s in host.slots if s != sick])
    host.tick(2)
    g = entry(host, sick)
    assert sorted(p["kind"] for p in g["problems"]) == ["missing", "requires_reset"]
    (p,) = [p for p in g["problems"] if p["kind"] == "requires_reset"]
    assert p["unread"] == "nvidia-smi does not report it"
    assert cleared(host) == []
    host.healthy()
    host.tick()
    assert entry(host, sick)["problems"] == []
    assert sorted(cleared(host)) == [
        f"GPU {sick}: missing cleared",
        f"GPU {sick}: requires_reset cleared",
    ]


def test_units_unread_hold_the_services_problems(host: Host) -> None:
    """A failed read of systemd's units (systemd restarting, a busy bus) is no unit state:
    persistenced_down holds, nothing pages again when the bus answers."""
    units = FakeUnits()
    units.set(unit(FM, load="not-found", restarts=None), unit(PD, "inactive", "dead"))
    host.healthy()
    host.make_agent(units=units)
    host.tick(2)
    assert [p["kind"] for p in host.state["host_problems"]] == ["persistenced_down"]
    down = units.result
    units.result = Result(Watch.ERROR, error="system bus: no answer within 2 s")
    host.tick(3)
    (p,) = host.state["host_problems"]
    assert p["kind"] == "persistenced_down"
    assert p["unread"] == "systemd's units not read: system bus: no answer within 2 s"
    units.result = down
    host.tick()
    (p,) = host.state["host_problems"]
    assert "unread" not in p
    assert cleared(host) == []
    assert len(host.events(Event.PROBLEM_PERSISTENCED_DOWN)) == 1
    units.set(unit(FM, load="not-found", restarts=None), unit(PD))
    host.tick()
    assert host.state["host_problems"] == []
    assert len(cleared(host)) == 1


def test_roots_clear_ends_a_problem_held_unread(host: Host, make: Any) -> None:
    """Nothing but a read or a clear ends it: root, who reset the GPU while the module was out,
    says so with gpuagent clear SLOT requires_reset."""
    sick = host.slots[5]
    host.healthy(override={sick: {"pstate": RESET, "temperature.gpu": RESET}})
    journal = make("kernel: nothing of the driver's\n")
    host.make_agent(journal_directory=journal)
    host.tick(2)
    fakesysfs.set_module(host.root, False)
    host.tick()
    assert entry(host, sick)["problems"][0]["unread"] == "the nvidia module is not loaded"
    append(journal, clear_entry("0", time.time() + 1, slot=sick, kind="requires_reset"))
    host.tick(2)
    assert entry(host, sick)["problems"] == []
    (line,) = cleared(host)
    assert line.startswith(f"GPU {sick}: requires_reset cleared by an operator (root at ")
    # A read that shows it again starts it again.
    fakesysfs.set_module(host.root, True)
    host.tick()
    assert [p["kind"] for p in entry(host, sick)["problems"]] == ["requires_reset"]
    assert len(host.events(Event.problem("requires_reset"))) == 2


def test_a_live_problem_read_now_is_not_cleared_by_hand(host: Host, make: Any) -> None:
    sick = reset_needed(host)
    journal = make("kernel: nothing of the driver's\n")
    host.make_agent(journal_directory=journal)
    host.tick()
    append(journal, clear_entry("0", time.time() + 1, slot=sick, kind="requires_reset"))
    host.tick(2)
    assert [p["kind"] for p in entry(host, sick)["problems"]] == ["requires_reset"]


def test_a_restart_keeps_what_is_held_unread(host: Host, tmp_path: str) -> None:
    """problems.json keeps the unread mark: a restart (an upgrade, during the driver's) holds
    the problem as last seen, unknown, not as read now."""
    sick = host.slots[5]
    host.healthy(override={sick: {"pstate": RESET, "temperature.gpu": RESET}})
    directory = str(tmp_path)
    host.make_agent(state_directory=directory)
    host.tick(2)
    fakesysfs.set_module(host.root, False)
    host.tick()
    host.make_agent(state_directory=directory)
    host.tick(2)
    g = entry(host, sick)
    (p,) = [p for p in g["problems"] if p["kind"] == "requires_reset"]
    assert p["unread"] == "the nvidia module is not loaded"
    assert g["health"] == "unknown"
    assert cleared(host) == []
