"""The status line: the host's remedy first, then the problems, criticals first, every one
counted, within 80 columns."""

from __future__ import annotations

import itertools

import pytest

from gpuagent.health import ACTIONS, CRITICAL, WARNING
from gpuagent.logs import Event
from gpuagent.schema import ProbeState, RemedyEntry
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


def test_one_problem_leads_with_its_remedy_naming_its_slot() -> None:
    assert text(XID79) == "drain and reboot: fixes 0000:ba:00.0; 1 critical; 8 GPUs, sampling"
    assert text(FM_DOWN) == (
        "restart the service: fixes fabricmanager_down; 1 critical; 8 GPUs, sampling"
    )
    assert text(THROTTLED) == "check the host: fixes 0000:18:00.0; 1 warning; 8 GPUs, sampling"


def test_the_sick_demos_three_criticals_are_one_reboot() -> None:
    """The issue's example: two resets and a reboot ask one thing, the reboot."""
    sick = (
        problem("0000:db:00.0", "gone_from_bus"),
        problem("0000:2a:00.0", "xid", action="reset_gpu", xid=119),
        problem("0000:ab:00.0", "requires_reset", action="reset_gpu"),
    )
    assert text(*sick, gpus=bus(7)) == (
        "drain and reboot: fixes db:00.0, 2a:00.0, ab:00.0; 3 critical; 7 GPUs, sampling"
    )


def test_what_the_remedy_leaves_is_named_or_counted() -> None:
    rma = problem("0000:2a:00.0", "xid", action="drain_and_rma", xid=48)
    reset = problem("0000:ab:00.0", "requires_reset", action="reset_gpu")
    assert text(rma, reset) == (
        "drain and RMA: fixes 2a:00.0, leaves ab:00.0; 2 critical; 8 GPUs, sampling"
    )
    count = problem("", "gpu_count", action="check_host")
    assert text(count, FM_DOWN) == (
        "check the host: fixes gpu_count, leaves 1; 2 critical; 8 GPUs, sampling"
    )


def test_without_a_remedy_the_problems_are_named_as_before() -> None:
    """Problems that ask for nothing (``none``) have no remedy: the line names them."""
    inforom = problem("", "inforom", WARNING, "none")
    assert text(inforom) == "1 warning (host inforom); 8 GPUs, sampling"
    assert text(problem("0000:db:00.0", "lost", action="none"), inforom) == (
        "1 critical (0000:db:00.0 lost), 1 warning (host inforom); 8 GPUs, sampling"
    )


def test_only_warnings_are_counted_as_warnings() -> None:
    lost_clocks = problem("0000:3a:00.0", "pcie_link_degraded", WARNING, "check_host")
    assert text(THROTTLED, lost_clocks) == (
        "check the host: fixes 0000:18:00.0, 0000:3a:00.0; 2 warnings; 8 GPUs, sampling"
    )


def test_the_issues_host_and_gpu_mix_names_the_worst_first() -> None:
    """An Xid 79 (reboot) before the host's fabricmanager_down (restart_service, which a boot
    starts again), a warning after both (check_host, which a boot does not mend): too long in
    words, so the remedy goes by its action's name, and names go from the end."""
    assert text(FM_DOWN, THROTTLED, XID79) == (
        "reboot: fixes ba:00.0, +1 more; 2 critical, 1 warning; 8 GPUs, sampling"
    )
    assert text(FM_DOWN, XID79) == (
        "reboot: fixes ba:00.0, fabricmanager_down; 2 critical; 8 GPUs, sampling"
    )


def test_criticals_lead_whatever_the_slot_order() -> None:
    """Today's line went host first, then by slot: a host warning hid a GPU's critical."""
    host_warning = problem("", "inforom", WARNING, "none")
    gpu_critical = problem("0000:db:00.0", "lost")
    assert text(host_warning, gpu_critical) == (
        "drain and reboot: fixes 0000:db:00.0; 1 critical, 1 warning; 8 GPUs, sampling"
    )


def test_every_host_problem_is_named_not_only_the_first() -> None:
    count = problem("", "gpu_count", action="check_host")
    hung = problem("", "driver_hung")
    line = status_line(bus(), OK, by_slot(count, FM_DOWN, hung), 5)
    assert line.remedy is not None
    assert line.remedy["fixes"] == ["host driver_hung", "host fabricmanager_down"]
    assert line.remedy["leaves"] == ["host gpu_count"]
    assert text(count, FM_DOWN, hung) == (
        "reboot: fixes driver_hung, +1 more, leaves 1; 3 critical; 8 GPUs, sampling"
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
    line = status_line(bus(), OK, by_slot(xid48, XID79), 5)
    assert line.critical == ("0000:ba:00.0 Xid 79", "0000:ba:00.0 Xid 48")
    assert line.remedy is not None
    assert line.remedy["fixes"] == ["0000:ba:00.0 Xid 79", "0000:ba:00.0 Xid 48"]
    # The line names the GPU once: the remedy is done to a GPU, not to each of its problems.
    assert text(xid48, XID79) == (
        "drain and reboot: fixes 0000:ba:00.0; 2 critical; 8 GPUs, sampling"
    )


# Long lists: +N more, within 80 columns ------------------------------------------------


def test_a_long_list_keeps_the_worst_and_counts_the_rest() -> None:
    lost = [problem(s, "lost") for s in SLOTS]
    assert text(*lost) == (
        "reboot: fixes 18:00.0, 2a:00.0, 3a:00.0, +5 more; 8 critical; 8 GPUs, sampling"
    )


def test_what_the_remedy_leaves_is_counted_before_more_names() -> None:
    warnings = [problem(s, "throttled", WARNING, "check_host") for s in SLOTS]
    assert text(XID79, *warnings) == (
        "reboot: fixes ba:00.0, leaves 8; 1 critical, 8 warnings; 8 GPUs, sampling"
    )
    # 82 columns with the count of what it leaves: without it.
    many = [problem(s, "row_remap_failed") for s in SLOTS]
    assert text(*many, *warnings) == (
        "reboot: fixes 18:00.0, +7 more; 8 critical, 8 warnings; 8 GPUs, sampling"
    )


def test_a_line_too_long_for_the_remedy_is_its_counts() -> None:
    gone = [problem(s, "gone_from_bus") for s in SLOTS]
    failing = ProbeView(state=ProbeState.FAILING, failure=Failure.PERMISSION_DENIED)
    assert text(*gone, THROTTLED, probe=failing) == (
        "reboot; 8 critical, 1 warning; 8 GPUs, nvidia-smi failing (permission_denied)"
    )
    rma = [problem(s, "row_remap_failed", action="drain_and_rma") for s in SLOTS]
    assert text(*rma, *[THROTTLED] * 10, probe=failing) == (
        "8 critical, 10 warnings; 8 GPUs, nvidia-smi failing (permission_denied)"
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
        head, counts = line.split("; ")[:2]
        if not head.startswith(f"{count} critical"):
            # The remedy leads, each place it fixes named or counted.
            assert head.startswith("drain and RMA") or head.startswith("drain_and_rma"), line
            assert counts.startswith(f"{count} critical"), line
            fixes = head.partition(": fixes ")[2].split(", ")
            if fixes != [""]:
                more = [int(n[1:].split()[0]) for n in fixes if n.startswith("+")]
                assert len(fixes) - len(more) + sum(more) == (1 if slot else count), line
        assert f", {count} warning" in line


def test_the_worst_name_goes_before_the_summarys_detail() -> None:
    """nvidia-smi timing out, the driver hung: the name says more than when it retries."""
    hung = problem("", "driver_hung")
    failing = ProbeView(state=ProbeState.FAILING, failure=Failure.TIMEOUT, next_in_ticks=4)
    assert text(probe=failing) == "8 GPUs, nvidia-smi failing (timeout), next try in 20 s"
    assert text(hung, probe=failing) == (
        "reboot: fixes driver_hung; 1 critical; 8 GPUs, nvidia-smi failing (timeout)"
    )
    assert text(problem("", "lost", action="none"), probe=failing) == (
        "1 critical (host lost); 8 GPUs, nvidia-smi failing (timeout), next try in 20 s"
    )


def test_a_summary_too_long_even_alone_is_cut() -> None:
    odd = BusView(gpus=(PciGpu(SLOTS[0], "0x2335", "0x030200", "x" * 90),))
    line = text(XID79, gpus=odd, probe=ProbeView(gate=Gate.NO_GPU, state=ProbeState.GATED))
    assert len(line) == WIDTH
    assert line.startswith("1 critical; 1 GPU, all bound to xxx"), line
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
    assert line.split("; ")[1] == "1 critical", line
    assert line.startswith("check"), line
    assert summary.startswith(line.split("; ", 2)[2])
    # Without a remedy, named as before.
    told = problem("", "gpu_count", action="none")
    line = text(told, probe=probe, gpus=gpus)
    assert line.startswith("1 critical (host gpu_count); ")
    assert summary.startswith(line.removeprefix("1 critical (host gpu_count); "))


def test_no_gpu_on_the_bus_still_names_the_hosts_problems() -> None:
    count = problem("", "gpu_count", action="check_host")
    assert text(gpus=bus(0)) == "no NVIDIA GPU on the PCI bus"
    assert text(count, gpus=bus(0)) == (
        "check the host: fixes gpu_count; 1 critical; no NVIDIA GPU on the PCI bus"
    )


# The agent's own trouble, at the end -------------------------------------------------


def test_the_agents_trouble_comes_last_by_kind() -> None:
    assert text(trouble=("textfile", "journal")) == (
        "8 GPUs, sampling; agent problems: journal, textfile"
    )
    assert text(XID79, trouble=("journal",)) == (
        "reboot: fixes ba:00.0; 1 critical; 8 GPUs, sampling; agent problem: journal"
    )


def test_the_agents_trouble_gives_way_to_the_problems_names() -> None:
    assert text(XID79, trouble=TROUBLE) == (
        "drain and reboot: fixes ba:00.0; 1 critical; 8 GPUs, sampling; 11 agent problems"
    )
    lost = [problem(s, "lost") for s in SLOTS]
    assert text(*lost, trouble=TROUBLE) == (
        "reboot: fixes 18:00.0, +7 more; 8 critical; 8 GPUs, sampling; 11 agent problems"
    )


def test_a_line_is_the_same_whatever_trouble_it_is_told_later() -> None:
    """The report keeps the line's parts: the state file names other trouble in it."""
    line = status_line(bus(), OK, by_slot(XID79), 5)
    cure: RemedyEntry = {
        "action": "reboot",
        "says": "drain and reboot",
        "fixes": ["0000:ba:00.0 Xid 79"],
        "leaves": [],
    }
    assert line == Line(("0000:ba:00.0 Xid 79",), (), "8 GPUs, sampling", remedy=cure)
    assert with_trouble(line, ()) == (
        "drain and reboot: fixes 0000:ba:00.0; 1 critical; 8 GPUs, sampling"
    )
