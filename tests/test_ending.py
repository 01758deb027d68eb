"""Every problem says how it ends, on every surface that shows it: a live one "ends by itself
when …", a latching one "after the repair: gpuagent clear SLOT KIND" (the journal line, the
catalog, the state, ``status``, the worst problem's series, the drain reason); and root's
``gpuagent clear SLOT gone_from_bus`` ends that GPU's share of ``gpu_count``."""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

import pytest

from gpuagent import metrics
from gpuagent.commands import drain, statustext
from gpuagent.health import CRITICAL, WARNING
from gpuagent.logs import Event, EventLog
from gpuagent.schema import State
from gpuagent.sources.bus.known import FILE, KnownGpus
from gpuagent.sources.kernel import clears, xidcount
from gpuagent.sources.kernel.xidcatalog import lookup
from gpuagent.sources.probe import rules
from gpuagent.views import Finding, Problem, Row, XidCount
from tests import fakesysfs, states
from tests.conftest import Host
from tests.test_catalog import entries
from tests.test_clear import LATER, clear_entry
from tests.test_kernel import FELL_OFF
from tests.test_kernlog import append, make
from tests.test_known import unplug

__all__ = ["make"]  # the fixture

SLOT = "0000:18:00.0"
XID = Finding(
    "xid", CRITICAL, "reboot", "Xid 79 (GPU has fallen off the bus): reboot", (("xid", 79),)
)
FM = Finding(
    "fabricmanager_down",
    CRITICAL,
    "restart_service",
    "nvidia-fabricmanager.service is inactive",
    ends="when nvidia-fabricmanager.service runs again",
)
LATCHED = f"holds until the next boot; after the repair: gpuagent clear {SLOT} xid"
LIVE = "ends by itself when nvidia-fabricmanager.service runs again"


@pytest.mark.parametrize(
    ("slot", "kind", "when", "said", "latches"),
    [
        (SLOT, "xid", "", LATCHED, True),
        (SLOT, "init_failed", "", f"{LATCHED.replace(' xid', ' init_failed')}", True),
        ("", "fabricmanager_down", "when nvidia-fabricmanager.service runs again", LIVE, False),
        (
            SLOT,
            "gone_from_bus",
            "when the GPU is back on the PCI bus",
            "ends by itself when the GPU is back on the PCI bus; if it left for good: "
            f"gpuagent clear {SLOT} gone_from_bus",
            False,
        ),
        # A warning Xid lapses, and a clear ends it sooner: no repair is asked for.
        (
            SLOT,
            "xid",
            "3600 s after its last record",
            f"ends by itself 3600 s after its last record; or sooner: gpuagent clear {SLOT} xid",
            False,
        ),
        # The host's Xid (an address that is no GPU): no GPU slot to clear.
        ("", "xid", "", "ends at the next boot", False),
        ("", "gpu_count", "", "ends when its cause does", False),
    ],
)
def test_the_words_of_each_ending(
    slot: str, kind: str, when: str, said: str, latches: bool
) -> None:
    assert clears.ending(slot, kind, when) == (said, latches)


def test_every_rule_of_a_live_problem_says_when_it_ends() -> None:
    row: Row = {
        "remapped_rows.failure": "Yes",
        "remapped_rows.pending": "Yes",
        "retired_pages.pending": "Yes",
        "inforom.checksum_validation": "invalid",
        "clocks_event_reasons.active": "0x8",
        "pcie.link.width.current": 8,
        "pcie.link.width.max": 16,
        "mig.mode.current": "Disabled",
        "mig.mode.pending": "Enabled",
        "fabric.state": "In Progress",
        "ecc.errors.uncorrected.volatile.total": 2,
        "gpu_recovery_action": "Reset",
    }
    found = rules.row_findings(row, ["memory.used"])
    found += [rules.error_finding("GPU is lost"), rules.missing_finding()]
    found += [rules.inforom_warning(), *rules.count_findings(7, 8, ["0000:cf:00.0"])]
    bus = rules.bus_findings(
        [states.nvidia(SLOT, None)], {SLOT, "0000:cf:00.0"}, module_loaded=True
    )
    found += [f for fs in bus.values() for f in fs]
    found += [
        f
        for fs in rules.wrong_driver_findings([states.nvidia("0000:2a:00.0", "nouveau")]).values()
        for f in fs
    ]
    assert len({f.kind for f in found}) == 17
    assert [f.kind for f in found if not f.ends.startswith("when ")] == []


def test_the_state_and_status_say_how_each_problem_ends() -> None:
    st = states.state(
        problems={SLOT: [Problem(SLOT, XID, states.NOW)], "": [Problem("", FM, states.NOW)]}
    )
    (gpu,) = st["gpus"]
    assert (gpu["problems"][0]["ends"], gpu["problems"][0]["latches"]) == (LATCHED, True)
    assert (st["host_problems"][0]["ends"], st["host_problems"][0]["latches"]) == (LIVE, False)
    text = statustext.render(st, states.NOW, 2, "", width=200).splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith("      - reboot: critical xid:"))
    assert text[at + 1] == f"        {LATCHED}"
    at = next(i for i, line in enumerate(text) if line.startswith("    host: restart_service:"))
    assert text[at + 1] == f"      {LIVE}"


def test_an_older_agents_state_without_ends_shows_none() -> None:
    st = states.state(problems={SLOT: [Problem(SLOT, XID, states.NOW)]})
    old: Any = {**st, "gpus": [{**st["gpus"][0], "problems": [dict(st["gpus"][0]["problems"][0])]}]}
    del old["gpus"][0]["problems"][0]["ends"]
    del old["gpus"][0]["problems"][0]["latches"]
    text = statustext.render(old, states.NOW, 2, "", width=200)
    assert "gpuagent clear" not in text
    assert drain.worst(old).reason == f"gpuagent: {SLOT} xid reboot (Xid 79)"  # type: ignore[union-attr]


def test_the_problem_series_say_how_they_end() -> None:
    st = states.state(
        problems={SLOT: [Problem(SLOT, XID, states.NOW)], "": [Problem("", FM, states.NOW)]}
    )
    lines = metrics.render(st).splitlines()
    (worst,) = [line for line in lines if line.startswith("gpuagent_gpu_worst_problem{")]
    assert f'pci_slot="{SLOT}"' in worst and f'ends="{LATCHED}"' in worst
    (host,) = [line for line in lines if line.startswith("gpuagent_host_problem{")]
    assert f'ends="{LIVE}"' in host


def test_a_drain_for_a_latching_problem_says_a_clear_ends_it_where_it_fits() -> None:
    st = states.state(problems={SLOT: [Problem(SLOT, XID, states.NOW)]})
    bad = drain.critical(st)
    assert bad is not None and bad.latches
    assert bad.reason == f"gpuagent: {SLOT} xid reboot (Xid 79); then gpuagent clear"
    assert len(bad.reason) <= drain.REASON_WIDTH
    # A live problem ends the drain by itself: nothing to add.
    st = states.state(problems={"": [Problem("", FM, states.NOW)]})
    assert drain.critical(st).reason == "gpuagent: host fabricmanager_down restart_service"  # type: ignore[union-attr]
    # Where the ending does not fit, the reason is what it was.
    long = drain.Worst(CRITICAL, SLOT, "k" * 40, "reboot", latches=True)
    assert long.reason == f"gpuagent: {SLOT} {'k' * 40} reboot"


def test_the_journal_line_says_how_each_problem_ends(host: Host, make: Any) -> None:
    journal = make(FELL_OFF)
    directory = os.path.join(host.dir, "state")
    os.mkdir(directory)
    host.make_agent(journal_directory=journal, expected_gpus=9, state_directory=directory)
    host.tick()
    (xid,) = host.events(Event.XID_PROBLEM)
    # Logged before this agent started, and told by none: an error, with its time after
    # the ending (a boot-time Xid must reach journalctl -p err).
    assert xid.levelno == logging.ERROR
    assert xid.getMessage().startswith(f"GPU {SLOT}: critical xid: Xid 79 ")
    assert f"; action: reboot; {LATCHED}; since " in xid.getMessage()
    # A restart: told already (problems.json), so restated at info.
    host.make_agent(journal_directory=journal, expected_gpus=9, state_directory=directory)
    host.tick()
    (still,) = [r for r in host.events(Event.STILL_HOLDS) if r.PROBLEM == "xid"]  # type: ignore[attr-defined]
    assert still.levelno == logging.INFO
    assert still.getMessage().startswith(f"GPU {SLOT}: still critical xid: Xid 79 ")
    assert still.getMessage().endswith(", seen before the restart")
    assert len(host.events(Event.XID_PROBLEM)) == 1
    (count,) = [r.getMessage() for r in host.events(Event.problem("gpu_count"))]
    # No GPU this host knows is missing: none to clear as gone for good.
    assert count.endswith(
        "; action: check_host; ends by itself when 9 GPUs are on the PCI bus, or expected_gpus "
        "is lowered"
    )


PROBLEM_EVENTS = [
    e for e in Event if e.name.startswith("PROBLEM_") and e is not Event.PROBLEM_CLEARED
] + [Event.XID_PROBLEM, Event.GPU_INIT_FAILED, Event.GPU_MISSING]


@pytest.mark.parametrize("event", PROBLEM_EVENTS, ids=[e.name for e in PROBLEM_EVENTS])
def test_the_catalog_says_how_each_problem_ends(event: Event) -> None:
    (text,) = [t for m, t in entries() if m == event.value]
    body = " ".join(text)
    assert re.search(r"ends (by itself|once)|gpuagent clear (@PCI_SLOT@|SLOT|host)", body)
    if event is Event.XID_PROBLEM:
        assert "gpuagent clear SLOT xid" in body
    if event is Event.GPU_INIT_FAILED:
        assert "gpuagent clear @PCI_SLOT@ init_failed" in body


def remembering(make: Any, tmp_path: str) -> tuple[str, str]:
    """A journal without the driver's records, and a $STATE_DIRECTORY."""
    directory = os.path.join(str(tmp_path), "lib")
    os.mkdir(directory)
    return make("kernel: nothing of the driver's\n"), directory


def test_a_clear_of_gone_from_bus_ends_its_share_of_gpu_count(
    host: Host, make: Any, tmp_path: str
) -> None:
    journal, directory = remembering(make, tmp_path)
    sick = host.slots[4]
    host.make_agent(state_directory=directory, journal_directory=journal, expected_gpus=8)
    host.tick()
    unplug(host, sick)
    st = host.tick().state
    assert [p["kind"] for p in st["host_problems"]] == ["gpu_count"]
    assert st["host_problems"][0]["ends"].endswith(
        f"; if it left for good: gpuagent clear {sick} gone_from_bus, or expected_gpus is lowered"
    )
    # Root says it left for good: neither its gone_from_bus nor the count holds.
    append(journal, clear_entry("0", LATER, slot=sick, kind="gone_from_bus"))
    st = host.tick().state
    assert st["host_problems"] == []
    assert [g["problems"] for g in st["gpus"] if g["problems"]] == []
    ended = [r.getMessage() for r in host.events(Event.PROBLEM_CLEARED)]
    # The count was the gone GPU's (its cause): it started and ends with no line of its own.
    assert [m for m in ended if "gpu_count" in m] == []
    assert host.events(Event.problem("gpu_count")) == []
    # A restart, and another boot (the clear's journal entry is not read there): remembered.
    host.make_agent(
        state_directory=directory, journal_directory=journal, expected_gpus=8, boot=lambda: "b" * 32
    )
    assert host.tick().state["host_problems"] == []
    # Another GPU gone: the count says so, less the one removed for good.
    other = host.slots[5]
    fakesysfs.remove_device(host.root, other)
    host.healthy(slots=[s for s in host.slots if s not in (sick, other)])
    (count,) = host.tick().state["host_problems"]
    assert count["message"] == (
        f"6 NVIDIA GPUs on the PCI bus where expected_gpus is 8, less 1 removed for good "
        f"({sick}); missing: {other}"
    )
    fakesysfs.add_device(
        host.root, other, fakesysfs.NVIDIA, fakesysfs.H200, fakesysfs.CLASS_3D, "nvidia"
    )
    # A GPU in the removed one's slot again (its replacement): expected once more.
    fakesysfs.add_device(
        host.root, sick, fakesysfs.NVIDIA, fakesysfs.H200, fakesysfs.CLASS_3D, "nvidia"
    )
    host.healthy()
    assert host.tick().state["host_problems"] == []
    unplug(host, sick)
    kinds = [p["kind"] for p in host.tick().state["host_problems"]]
    assert kinds == ["gpu_count"]


def test_a_lower_expected_gpus_is_not_counted_twice(host: Host, make: Any, tmp_path: str) -> None:
    journal, directory = remembering(make, tmp_path)
    sick, other = host.slots[4], host.slots[5]
    host.make_agent(state_directory=directory, journal_directory=journal, expected_gpus=8)
    host.tick()
    unplug(host, sick)
    host.tick()
    append(journal, clear_entry("0", LATER, slot=sick, kind="gone_from_bus"))
    assert host.tick().state["host_problems"] == []
    # The operator lowers expected_gpus to 7 as well: that is the removed GPU, counted once.
    host.make_agent(state_directory=directory, journal_directory=journal, expected_gpus=7)
    assert host.tick().state["host_problems"] == []
    fakesysfs.remove_device(host.root, other)
    host.healthy(slots=[s for s in host.slots if s not in (sick, other)])
    (count,) = host.tick().state["host_problems"]
    assert count["message"] == (
        f"6 NVIDIA GPUs on the PCI bus where expected_gpus is 7; missing: {other}"
    )


def test_host_level_problems_with_their_rules_ending(host: Host) -> None:
    host.make_agent(expected_gpus=9)
    st: State = host.tick().state
    (count,) = st["host_problems"]
    assert count["latches"] is False
    assert count["ends"].startswith("ends by itself when 9 GPUs are on the PCI bus")
    logged = [r for r in host.logs.records if r.levelno == logging.ERROR]
    assert any(count["ends"] in r.getMessage() for r in logged)


def test_a_warning_xid_lapses_and_says_so() -> None:
    made = {
        code: xidcount.finding(XidCount(code, 1, 100.0, 100.0, lookup(code), "m"), 101.0, 3600.0)
        for code in (79, 63)
    }
    assert {c: (f.severity, f.ends) for c, f in made.items() if f is not None} == {
        79: (CRITICAL, ""),
        63: (WARNING, "3600 s after its last record"),
    }


def test_the_removed_gpus_are_kept_beside_the_known_ones(tmp_path: str) -> None:
    log = EventLog(logging.getLogger("test.ending"))
    path = os.path.join(str(tmp_path), FILE)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"gpus": [{"pci_slot": SLOT}]}, f)  # an older agent's file
    known = KnownGpus(str(tmp_path), log)
    assert (list(known.gpus), known.removed, known.error) == ([SLOT], {}, None)
    known.forget([SLOT], 8)
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["removed"] == [{"pci_slot": SLOT, "expected_gpus": 8}]
    assert KnownGpus(str(tmp_path), log).removed == {SLOT: 8}
    # Back in its slot (a replacement): expected again.
    known.update({SLOT: {"uuid": None, "name": None}})
    assert KnownGpus(str(tmp_path), log).removed == {}
    damaged: list[dict[str, object]] = [
        {"removed": {}},
        {"removed": [{"pci_slot": SLOT, "expected_gpus": "8"}]},
    ]
    for bad in damaged:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"gpus": [], **bad}, f)
        assert "cannot read" in (KnownGpus(str(tmp_path), log).error or "")
