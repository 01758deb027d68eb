"""The status line: the problems first, criticals first, every one counted, within 80 columns."""

from __future__ import annotations

import itertools
import re

import pytest

from gpuagent.health import ACTIONS, CRITICAL, WARNING
from gpuagent.logs import Event
from gpuagent.schema import ProbeState
from gpuagent.statusline import WIDTH, Line, Problems, status_line, with_trouble
from gpuagent.views import BusView, Failure, Finding, Gate, PciGpu, ProbeView, Problem

# The H200 HGX board's slots (fakesysfs.gpu_slots(8)); 0000:ba:00.0 is as long as any
# slot in domain 0000.
SLOTS = tuple(f"0000:{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db"))
# A VMD domain (Intel Volume Management Device) has five hex digits: the longest slot.
VMD_SLOT = "10000:e1:00.0"
OK = ProbeView(state=ProbeState.OK)
# Every kind this version logs a problem of, and the longest of them.
KINDS = [
    e.name.removeprefix("PROBLEM_").lower()
    for e in Event
    if e.name.startswith("PROBLEM_") and e is not Event.PROBLEM_CLEARED
]
LONGEST_KIND = max(KINDS, key=len)
# The agent's own trouble, every kind the state's ``problems`` may hold.
TROUBLE = (
    "internal",
    "internal_publish",
    "journal",
    "journal_retention",
    "known_gpus",
    "nvlink_links",
    "state_file",
    "sysfs",
    "system_bus",
    "textfile",
    "wear_records",
)


def bus(n: int = 8, driver: str | None = "nvidia") -> BusView:
    return BusView(gpus=tuple(PciGpu(s, "0x2335", "0x030200", driver) for s in SLOTS[:n]))


def problem(
    slot: str, kind: str, severity: str = CRITICAL, action: str = "reboot", xid: int | None = None
) -> Problem:
    extra: tuple[tuple[str, int | str], ...] = () if xid is None else (("xid", xid),)
    return Problem(slot, Finding(kind, severity, action, "m", extra), 0.0)


def by_slot(*problems: Problem) -> Problems:
    out: dict[str, list[Problem]] = {}
    for p in problems:
        out.setdefault(p.slot, []).append(p)
    return out


def text(
    *problems: Problem,
    probe: ProbeView = OK,
    gpus: BusView | None = None,
    trouble: tuple[str, ...] = (),
    interval: float = 5,
) -> str:
    line = status_line(bus() if gpus is None else gpus, probe, by_slot(*problems), interval)
    return with_trouble(line, trouble)


XID79 = problem("0000:ba:00.0", "xid", xid=79)
FM_DOWN = problem("", "fabricmanager_down", action="restart_service")
THROTTLED = problem("0000:18:00.0", "throttled", WARNING, "check_host")


# No problem, one, many -------------------------------------------------------------------


def test_no_problem_is_the_summary_alone() -> None:
    assert text() == "8 GPUs, sampling"
    assert text(gpus=bus(1)) == "1 GPU, sampling"


def test_one_problem_leads_named_by_its_slot() -> None:
    assert text(XID79) == "1 critical (0000:ba:00.0 Xid 79); 8 GPUs, sampling"
    assert text(FM_DOWN) == "1 critical (host fabricmanager_down); 8 GPUs, sampling"
    assert text(THROTTLED) == "1 warning (0000:18:00.0 throttled); 8 GPUs, sampling"


def test_only_warnings_are_counted_as_warnings() -> None:
    lost_clocks = problem("0000:3a:00.0", "pcie_link_degraded", WARNING, "check_host")
    assert text(THROTTLED, lost_clocks) == (
        "2 warnings (0000:18:00.0 throttled, +1 more); 8 GPUs, sampling"
    )


def test_the_issues_host_and_gpu_mix_names_the_worst_first() -> None:
    """The issue's example: an Xid 79 (reboot) before the host's fabricmanager_down
    (restart_service), a warning after both; 86 columns in full, so the second name goes."""
    assert text(FM_DOWN, THROTTLED, XID79) == (
        "2 critical (0000:ba:00.0 Xid 79, +1 more), 1 warning; 8 GPUs, sampling"
    )
    assert text(FM_DOWN, XID79) == (
        "2 critical (0000:ba:00.0 Xid 79, host fabricmanager_down); 8 GPUs, sampling"
    )


def test_criticals_lead_whatever_the_slot_order() -> None:
    """Today's line went host first, then by slot: a host warning hid a GPU's critical."""
    host_warning = problem("", "inforom", WARNING, "none")
    gpu_critical = problem("0000:db:00.0", "lost")
    assert text(host_warning, gpu_critical) == (
        "1 critical (0000:db:00.0 lost), 1 warning (host inforom); 8 GPUs, sampling"
    )


def test_every_host_problem_is_named_not_only_the_first() -> None:
    count = problem("", "gpu_count", action="check_host")
    hung = problem("", "driver_hung")
    assert text(count, FM_DOWN) == (
        "2 critical (host gpu_count, host fabricmanager_down); 8 GPUs, sampling"
    )
    assert text(count, FM_DOWN, hung) == (
        "3 critical (host driver_hung, host gpu_count, +1 more); 8 GPUs, sampling"
    )


def test_the_order_is_healths_action_that_takes_most_first() -> None:
    """Of criticals on the host and the GPUs, the action that takes most leads
    (:data:`ACTIONS` from its end), then the slot, the host's first."""
    problems = [problem(SLOTS[i % 8], f"k{i}", action=a) for i, a in enumerate(ACTIONS)]
    line = status_line(bus(), OK, by_slot(*problems), 5)
    assert line.critical == tuple(f"{SLOTS[i % 8]} k{i}" for i in reversed(range(len(ACTIONS))))


def test_a_problem_caused_by_the_host_comes_after_the_cause() -> None:
    fabric = Problem(
        "0000:18:00.0",
        Finding("fabric", CRITICAL, "drain_and_rma", "m", (("cause", "fabricmanager_down"),)),
        0.0,
    )
    line = status_line(bus(), OK, by_slot(fabric, FM_DOWN), 5)
    assert line.critical == ("host fabricmanager_down", "0000:18:00.0 fabric")


def test_two_xids_on_one_gpu_are_two_problems_told_apart() -> None:
    """Why an Xid is named by its code (:attr:`Finding.name`), as in the journal's lines and
    the drain reason's ``(Xid 79)``: ``xid, xid`` would not tell them apart."""
    xid48 = problem("0000:ba:00.0", "xid", action="drain_and_reset", xid=48)
    assert text(xid48, XID79) == (
        "2 critical (0000:ba:00.0 Xid 79, 0000:ba:00.0 Xid 48); 8 GPUs, sampling"
    )


# Long lists: +N more, within 80 columns ------------------------------------------------


def test_a_long_list_keeps_the_worst_and_counts_the_rest() -> None:
    lost = [problem(s, "lost") for s in SLOTS]
    assert text(*lost) == (
        "8 critical (0000:18:00.0 lost, 0000:2a:00.0 lost, +6 more); 8 GPUs, sampling"
    )


def test_warnings_get_the_room_criticals_leave() -> None:
    inforom = problem("", "inforom", WARNING, "none")
    assert text(XID79, inforom) == (
        "1 critical (0000:ba:00.0 Xid 79), 1 warning (host inforom); 8 GPUs, sampling"
    )
    warnings = [problem(s, "throttled", WARNING, "check_host") for s in SLOTS]
    assert text(XID79, *warnings) == (
        "1 critical (0000:ba:00.0 Xid 79), 8 warnings; 8 GPUs, sampling"
    )
    # 82 columns with one name: none.
    many = [problem(s, "row_remap_failed") for s in SLOTS]
    assert text(*many, *warnings) == "8 critical, 8 warnings; 8 GPUs, sampling"


def test_a_group_with_no_name_left_is_its_count() -> None:
    gone = [problem(s, "gone_from_bus") for s in SLOTS]
    failing = ProbeView(state=ProbeState.FAILING, failure=Failure.PERMISSION_DENIED)
    assert text(*gone, THROTTLED, probe=failing) == (
        "8 critical, 1 warning; 8 GPUs, nvidia-smi failing (permission_denied)"
    )


@pytest.mark.parametrize("count", [1, 2, 3, 8, 20, 200])
@pytest.mark.parametrize("slot", [SLOTS[6], VMD_SLOT, ""])
def test_every_problem_is_counted_and_the_line_fits(count: int, slot: str) -> None:
    """The longest slots and kinds, many at once, with every probe state and all the
    agent's trouble: the counts always stand, and the line fits."""
    for probe, trouble in itertools.product(PROBES, ((), ("journal",), TROUBLE)):
        problems = [
            problem(slot, f"{LONGEST_KIND}{i}" if i else LONGEST_KIND, sev, "drain_and_rma")
            for i in range(count)
            for sev in (CRITICAL, WARNING)
        ]
        line = text(*problems, probe=probe, trouble=trouble, interval=3600)
        assert len(line) <= WIDTH, line
        assert line.startswith(f"{count} critical")
        assert f", {count} warning" in line
        names = re.findall(r"\(([^)]*)\)", line.split(";")[0])
        for group in names:
            shown = [n for n in group.split(", ") if not n.startswith("+")]
            more = [int(n[1:].split()[0]) for n in group.split(", ") if n.startswith("+")]
            assert len(shown) + sum(more) == count, line


def test_the_worst_name_goes_before_the_summarys_detail() -> None:
    """nvidia-smi timing out, the driver hung: the name says more than when it retries."""
    hung = problem("", "driver_hung")
    failing = ProbeView(state=ProbeState.FAILING, failure=Failure.TIMEOUT, next_in_ticks=4)
    assert text(probe=failing) == "8 GPUs, nvidia-smi failing (timeout), next try in 20 s"
    assert text(hung, probe=failing) == (
        "1 critical (host driver_hung); 8 GPUs, nvidia-smi failing (timeout)"
    )
    assert text(problem("", "lost"), probe=failing) == (
        "1 critical (host lost); 8 GPUs, nvidia-smi failing (timeout), next try in 20 s"
    )


def test_a_summary_too_long_even_alone_is_cut() -> None:
    odd = BusView(gpus=(PciGpu(SLOTS[0], "0x2335", "0x030200", "x" * 90),))
    line = text(XID79, gpus=odd, probe=ProbeView(gate=Gate.NO_GPU, state=ProbeState.GATED))
    assert len(line) == WIDTH
    assert line.startswith("1 critical; 1 GPU, all bound to xxx")
    assert line.endswith("x…")


# Probe states: the same summary as before, after the problems -------------------------


PROBES = [
    OK,
    ProbeView(),
    ProbeView(state=ProbeState.GATED, gate=Gate.NO_GPU),
    ProbeView(state=ProbeState.GATED, gate=Gate.NVIDIA_SMI_MISSING),
    ProbeView(state=ProbeState.GATED, gate=Gate.DRIVER_NOT_LOADED),
    ProbeView(state=ProbeState.STUCK),
    ProbeView(state=ProbeState.FAILING, failure=Failure.PERMISSION_DENIED, next_in_ticks=60),
]


@pytest.mark.parametrize(
    ("probe", "driver", "summary"),
    [
        (OK, "nvidia", "8 GPUs, sampling"),
        (ProbeView(), "nvidia", "8 GPUs, starting"),
        (PROBES[2], "vfio-pci", "8 GPUs, all bound to vfio-pci; not sampled"),
        (PROBES[3], "nvidia", "8 GPUs, nvidia-smi not found"),
        (PROBES[4], None, "8 GPUs, NVIDIA driver not loaded; not probing"),
        (PROBES[5], "nvidia", "8 GPUs, nvidia-smi stuck in the driver; not probing"),
        (PROBES[6], "nvidia", "8 GPUs, nvidia-smi failing (permission_denied), next try in 300 s"),
    ],
)
def test_each_probe_state_follows_the_problems(
    probe: ProbeView, driver: str | None, summary: str
) -> None:
    gpus = bus(driver=driver)
    assert text(probe=probe, gpus=gpus) == summary
    # Every state names the problems, a gate's or a stuck probe's too (it hid them before).
    count = problem("", "gpu_count", action="check_host")
    line = text(count, probe=probe, gpus=gpus)
    assert line.startswith("1 critical (host gpu_count); ")
    assert summary.startswith(line.removeprefix("1 critical (host gpu_count); "))


def test_no_gpu_on_the_bus_still_names_the_hosts_problems() -> None:
    count = problem("", "gpu_count", action="check_host")
    assert text(gpus=bus(0)) == "no NVIDIA GPU on the PCI bus"
    assert text(count, gpus=bus(0)) == "1 critical (host gpu_count); no NVIDIA GPU on the PCI bus"


# The agent's own trouble, at the end -------------------------------------------------


def test_the_agents_trouble_comes_last_by_kind() -> None:
    assert text(trouble=("textfile", "journal")) == (
        "8 GPUs, sampling; agent problems: journal, textfile"
    )
    assert text(XID79, trouble=("journal",)) == (
        "1 critical (0000:ba:00.0 Xid 79); 8 GPUs, sampling; agent problem: journal"
    )


def test_the_agents_trouble_gives_way_to_the_problems_names() -> None:
    assert text(XID79, trouble=TROUBLE) == (
        "1 critical (0000:ba:00.0 Xid 79); 8 GPUs, sampling; 11 agent problems"
    )
    lost = [problem(s, "lost") for s in SLOTS]
    assert text(*lost, trouble=TROUBLE) == (
        "8 critical (0000:18:00.0 lost, +7 more); 8 GPUs, sampling; 11 agent problems"
    )


def test_a_line_is_the_same_whatever_trouble_it_is_told_later() -> None:
    """The report keeps the line's parts: the state file names other trouble in it."""
    line = status_line(bus(), OK, by_slot(XID79), 5)
    assert line == Line(("0000:ba:00.0 Xid 79",), (), "8 GPUs, sampling")
    assert with_trouble(line, ()) == "1 critical (0000:ba:00.0 Xid 79); 8 GPUs, sampling"
