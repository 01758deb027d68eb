"""Pages that tell the truth: one fault is one worst problem (one page) whatever sources see it,
one severity on every surface, and the agent's own trouble as a series (issue 20)."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from gpuagent import metrics
from gpuagent.commands import status
from gpuagent.health import CRITICAL, WARNING
from gpuagent.logs import Event
from gpuagent.schema import State
from gpuagent.views import Finding, Problem
from tests import fakesysfs, states
from tests.conftest import Host
from tests.test_kernel import FELL_OFF, make

__all__ = ["make"]

_WORST = re.compile(r"^gpuagent_gpu_worst_problem\{(.*)\} 1\.0$", re.MULTILINE)


def worst(host: Host) -> list[dict[str, str]]:
    """The textfile's worst-problem series, as label dicts."""
    text = metrics.render(host.state)
    return [dict(re.findall(r'(\w+)="([^"]*)"', m)) for m in _WORST.findall(text)]


def test_an_xid_79_gpu_that_leaves_nvidia_smi_then_the_bus_is_one_page(
    host: Host, make: Any
) -> None:
    fell = host.slots[0]
    host.make_agent(journal_directory=make(FELL_OFF))
    host.tick()
    (page,) = worst(host)
    assert (page["pci_slot"], page["kind"], page["severity"]) == (fell, "xid", "critical")
    # nvidia-smi stops reporting it: a second problem, still one worst one (one page).
    host.healthy(slots=host.slots[1:])
    host.tick(2)
    kinds = [p["kind"] for p in host.state["gpus"][0]["problems"]]
    assert sorted(kinds) == ["missing", "xid"]
    (page,) = worst(host)
    assert (page["pci_slot"], page["severity"], page["action"]) == (fell, "critical", "reboot")
    # One severity on every surface: the journal's line is an error, as status says critical.
    (line,) = host.events(Event.GPU_MISSING)
    assert line.levelno == logging.ERROR
    assert line.getMessage().startswith(f"GPU {fell}: critical missing: ")
    assert status.judge(host.state, time.time())[0] == status.ExitCode.CRITICAL
    # Then it leaves the bus: still one worst problem for the slot.
    fakesysfs.remove_device(host.root, fell)
    host.tick(2)
    pages = worst(host)
    assert [p["pci_slot"] for p in pages] == [fell]
    assert pages[0]["severity"] == "critical"


def test_the_agents_own_trouble_is_a_series_and_in_the_status_line(host: Host) -> None:
    host.make_agent(journal_directory=f"{host.dir}/no-journal")
    report = host.tick()
    assert report.status == "8 GPUs, sampling; agent problem: journal"
    assert 'gpuagent_agent_problem{kind="journal"} 1.0' in metrics.render(report.state)


def test_a_boots_xid_no_agent_told_is_an_error_with_its_real_start(host: Host, make: Any) -> None:
    """The journal's Xid 79 is older than this agent, and no agent told it (the boot's first
    agent, one that started after the fault): an error, so that it reaches `journalctl -p
    err`, with its real start (issue 39)."""
    fell = host.slots[0]
    host.make_agent(journal_directory=make(FELL_OFF))
    host.tick(2)
    (line,) = host.events(Event.XID_PROBLEM)
    assert line.levelno == logging.ERROR
    (xid,) = host.state["gpus"][0]["xids"]
    clock = time.strftime("%H:%M:%S", time.localtime(xid["first"]))
    assert line.getMessage().startswith(f"GPU {fell}: critical xid: Xid 79 ")
    assert line.getMessage().endswith(
        f"; action: reboot; holds until the next boot; after the repair: gpuagent clear {fell} "
        f"xid; since {clock}"
    )
    (problem,) = host.state["gpus"][0]["problems"]
    assert problem["since"] == xid["first"]
    # Still critical on every other surface.
    assert status.judge(host.state, time.time())[0] == status.ExitCode.CRITICAL


def test_each_host_problem_is_a_series_of_its_own_and_each_gpu_one() -> None:
    """A host whose GPU count is short, then whose fabric manager stops as well: two host
    series, one a kind (two pages), beside one worst-problem series a GPU."""
    count = states.problem("gpu_count", CRITICAL, "check_host", slot="", message="7 of 8")
    fm = states.problem("fabricmanager_down", CRITICAL, "restart_service", slot="")
    hot = states.problem("throttled", WARNING, "check_host")
    xid = Problem(states.SLOT, Finding("xid", CRITICAL, "reboot", "m", (("xid", 79),)), 1.0)
    before = states.state(problems={"": [count], states.SLOT: [hot]})
    after = states.state(problems={"": [count, fm], states.SLOT: [xid, hot]})
    assert labels(before, "gpuagent_host_problem") == [
        {
            "kind": "gpu_count",
            "severity": "critical",
            "action": "check_host",
            "message": "7 of 8",
            "ends": "ends when its cause does",
        }
    ]
    assert [s["kind"] for s in labels(after, "gpuagent_host_problem")] == [
        "gpu_count",
        "fabricmanager_down",
    ]
    # A GPU's problems stay one series, its worst; the host has none there.
    for st, kind in ((before, "throttled"), (after, "xid")):
        (gpu,) = labels(st, "gpuagent_gpu_worst_problem")
        assert (gpu["pci_slot"], gpu["kind"]) == (states.SLOT, kind)


def labels(st: State, name: str) -> list[dict[str, str]]:
    """The labels of the metric ``name``'s series in ``st``'s textfile."""
    return [s.labels for f in metrics.families(st) if f.name == name for s in f.samples]
