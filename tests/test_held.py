"""gpuagent.held and the restart it serves: what holds is restated at info with its first
``since``, never paged again; a reboot restores nothing; ``gpuagent history`` counts one start
per fault.  The verdict alone on plain values, then whole agents on a fake host, restarted on
one state directory, with a fake wall clock."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from gpuagent.health import CRITICAL, WARNING
from gpuagent.held import FILE, Held, HeldProblems
from gpuagent.logs import Event, EventLog
from gpuagent.sources.kernel import clears, timeline
from gpuagent.sources.probe import rules
from gpuagent.untrusted import MESSAGE_MAX
from gpuagent.verdict import Verdict
from gpuagent.views import BusView, Finding, PciGpu
from tests import fakesysfs, test_kernlog
from tests.conftest import Clock, Host, ListHandler
from tests.test_kernlog import corpus_text

make = test_kernlog.make

BOOT = "0123456789abcdef0123456789abcdef"
SLOT = "0000:2a:00.0"
WRONG = Finding("wrong_driver", CRITICAL, "check_host", "bound to nouveau, not nvidia")
LINKS = Finding("nvlink_down", WARNING, "drain_p2p", "link 3 is down", (("links", 1),))


def logged() -> tuple[EventLog, ListHandler]:
    handler = ListHandler()
    logger = logging.getLogger(f"test.held.{id(handler)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.handlers[:] = [handler]
    return EventLog(logger), handler


def nouveau_bus() -> BusView:
    gpu = PciGpu(SLOT, "0x2335", "0x030200", "nouveau")
    return BusView((gpu,), frozenset({SLOT}))


def nvidia_bus() -> BusView:
    gpu = PciGpu(SLOT, "0x2335", "0x030200", "nvidia")
    return BusView((gpu,), frozenset({SLOT}))


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


# The verdict alone --------------------------------------------------------------------------


def test_a_problem_held_before_the_restart_keeps_its_since_and_is_restated_once_at_info() -> None:
    log, lines = logged()
    verdict = Verdict(log, started=5000.0, held=[Held("pci", SLOT, WRONG, 1000.0)])
    for now in (5000.0, 5010.0, 5020.0):
        verdict.judge(now, nouveau_bus(), None)
    (p,) = verdict.problems()[SLOT]
    assert (p.finding.kind, p.since) == ("wrong_driver", 1000.0)
    (line,) = lines.records
    assert (line.levelno, getattr(line, "MESSAGE_ID", None)) == (
        logging.INFO,
        Event.STILL_HOLDS.value,
    )
    (live,) = rules.wrong_driver_findings(nouveau_bus().gpus)[SLOT]
    assert line.getMessage() == (
        f"GPU {SLOT}: still critical wrong_driver: {live.message}; action: check_host; "
        f"{clears.ending(SLOT, 'wrong_driver', live.ends)[0]}; "
        f"since {clock(1000.0)}, seen before the restart"
    )
    assert (line.PCI_SLOT, line.PROBLEM, line.SEVERITY) == (SLOT, "wrong_driver", "critical")  # type: ignore[attr-defined]


def test_what_no_longer_holds_ends_once_its_source_has_had_a_whole_look() -> None:
    log, lines = logged()
    verdict = Verdict(log, started=5000.0, held=[Held("nvlink", SLOT, LINKS, 1000.0)])
    # NVLink is read on its cadence, and a boot's records may be read in part: until the
    # source has had a whole look of its own, what it found before the restart holds.
    verdict.judge(5000.0, nvidia_bus(), None)
    verdict.report("nvlink", {}, complete=False)
    verdict.judge(5010.0, nvidia_bus(), None)
    assert [p.since for p in verdict.problems()[SLOT]] == [1000.0]
    verdict.report("nvlink", {})
    verdict.judge(5020.0, nvidia_bus(), None)
    assert verdict.problems() == {}
    events = [r.MESSAGE_ID for r in lines.records]  # type: ignore[attr-defined]
    assert events == [Event.STILL_HOLDS.value, Event.PROBLEM_CLEARED.value]


def test_found_again_by_its_source_it_keeps_its_first_since_and_no_new_start() -> None:
    log, lines = logged()
    verdict = Verdict(log, started=5000.0, held=[Held("nvlink", SLOT, LINKS, 1000.0)])
    verdict.judge(5000.0, nvidia_bus(), None)
    again = Finding("nvlink_down", WARNING, "drain_p2p", "link 3 is down (read again)", LINKS.extra)
    verdict.report("nvlink", {SLOT: [again]})
    verdict.judge(5010.0, nvidia_bus(), None)
    (p,) = verdict.problems()[SLOT]
    assert (p.finding.message, p.since) == (again.message, 1000.0)
    assert [r.MESSAGE_ID for r in lines.records] == [Event.STILL_HOLDS.value]  # type: ignore[attr-defined]
    assert [(h.source, h.since) for h in verdict.held()] == [("nvlink", 1000.0)]


def test_a_fault_that_predates_a_first_agent_is_still_its_start() -> None:
    # Nothing remembered (the first agent of the boot, or a hand run): an Xid read from the
    # boot's records was told by no agent, so it is said at its own severity (issue 39), and
    # it is the problem's one start line.
    log, lines = logged()
    verdict = Verdict(log, started=5000.0)
    xid = Finding("xid", CRITICAL, "reboot", "Xid 79", (("xid", 79),), at=1000.0)
    verdict.report("xid", {SLOT: [xid]})
    verdict.judge(5000.0, nvidia_bus(), None)
    (line,) = lines.records
    assert (line.levelno, line.MESSAGE_ID) == (logging.ERROR, Event.XID_PROBLEM.value)  # type: ignore[attr-defined]
    assert not line.getMessage().endswith("seen before the restart")


# The file ----------------------------------------------------------------------------------


def test_written_when_what_it_holds_changes_and_read_back(tmp_path: str) -> None:
    log, lines = logged()
    directory = str(tmp_path)
    path = os.path.join(directory, FILE)
    held = HeldProblems(directory, log, boot=BOOT)
    assert held.held == () and held.told == frozenset()
    unit = Finding("lost", CRITICAL, "reboot", "gone", (("xid", 79), ("cause", "x")), unit="a@1")
    now = [Held("pci", SLOT, WRONG, 1000.5), Held("smi", "0000:3a:00.0", unit, 1001.0)]
    told = frozenset({(SLOT, "xid", 94)})
    held.update(now, told)
    written = os.stat(path).st_ino
    # The same problems in new words, a quiet tick: no write.
    reworded = [Held("pci", SLOT, Finding(WRONG.kind, CRITICAL, "check_host", "x"), 1000.5)]
    held.update([*reworded, now[1]], told)
    held.update(list(reversed(now)), told)
    assert os.stat(path).st_ino == written
    again = HeldProblems(directory, log, boot=BOOT)
    assert [(h.source, h.slot, h.finding, h.since) for h in again.held] == [
        ("pci", SLOT, WRONG, 1000.5),
        ("smi", "0000:3a:00.0", unit, 1001.0),
    ]
    assert again.held[1].finding.unit == "a@1" and again.told == told
    assert again.held_for(SLOT, "wrong_driver", 1010.5) == 10.0
    assert again.held_for("", "no_driver_module", 1010.5) is None
    # A since that changes (a problem ended and came back) is written.
    again.update([Held("pci", SLOT, WRONG, 1020.0)], told)
    assert os.stat(path).st_ino != written
    assert lines.records == []


def test_a_reboot_restores_nothing(tmp_path: str) -> None:
    log, _ = logged()
    HeldProblems(str(tmp_path), log, boot=BOOT).update(
        [Held("pci", SLOT, WRONG, 1000.0)], frozenset({(SLOT, "xid", 94)})
    )
    rebooted = HeldProblems(str(tmp_path), log, boot="f" * 32)
    assert rebooted.held == () and rebooted.told == frozenset()
    # Nor does an unknown boot: the file could not say which boot it is of.
    assert HeldProblems(str(tmp_path), log, boot="").held == ()


def test_a_damaged_record_is_one_warning_and_a_fresh_start(tmp_path: str) -> None:
    log, lines = logged()
    path = os.path.join(tmp_path, FILE)
    entry: dict[str, object] = {"source": "pci", "pci_slot": SLOT, "kind": "wrong_driver"}
    entry["severity"] = "fatal"
    entry |= {"action": "check_host", "message": "m", "extra": [], "unit": None, "since": 1.0}
    for text in ("{not json", json.dumps({"boot_id": BOOT, "problems": [entry], "told": []})):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        held = HeldProblems(str(tmp_path), log, boot=BOOT)
        assert held.held == ()
        assert held.error is not None and held.error.startswith(f"{path}: cannot read ")
    assert [r.levelno for r in lines.records] == [logging.WARNING, logging.WARNING]
    assert lines.records[0].getMessage().endswith("; going on with the problems seen from now")
    # The first update replaces it, even with nothing open: the trouble ends.
    held.update([], frozenset())
    assert held.error is None
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == {"boot_id": BOOT, "problems": [], "told": []}


def test_out_of_range_numbers_are_one_warning_naming_the_field(tmp_path: str) -> None:
    # Issue 40: a 400-digit integer since crashed every start (float() overflowed), even a
    # file of another boot's.
    log, lines = logged()
    path = os.path.join(tmp_path, FILE)
    entry: dict[str, object] = {"source": "pci", "pci_slot": SLOT, "kind": "wrong_driver"}
    entry |= {"severity": CRITICAL, "action": "check_host", "message": "m", "extra": []}
    cases = [
        ({**entry, "since": 10**400}, [], "problems[0].since"),
        ({**entry, "since": -1.0}, [], "problems[0].since"),
        ({**entry, "since": 1.0, "extra": [["xid", 10**400]]}, [], "problems[0].extra"),
        ({**entry, "since": 1.0, "unread": [10**400, "x"]}, [], "problems[0].unread"),
        ({**entry, "since": 1.0}, [[SLOT, "xid", 10**400]], "told"),
    ]
    for bad, told, field in cases:
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"boot_id": BOOT, "problems": [bad], "told": told}))
        held = HeldProblems(str(tmp_path), log, boot=BOOT)
        assert held.held == () and held.error is not None
        assert held.error.startswith(f"{path}: cannot read the problems that hold: {field}")
    assert len(lines.records) == len(cases)  # one warning a start
    # Another boot's file is never a crash either.
    assert HeldProblems(str(tmp_path), log, boot="f" * 32).held == ()


def test_a_message_of_any_length_leaves_a_file_its_reader_takes(tmp_path: str) -> None:
    # Issue 40: one 200,000-character IMEX address made a 1.2 MB problems.json that the next
    # start refused, so every problem paged again.
    log, lines = logged()
    huge = Finding("imex_domain_not_ready", WARNING, "check_host", "x" * 1_200_000)
    assert len(huge.message) == MESSAGE_MAX
    held = HeldProblems(str(tmp_path), log, boot=BOOT)
    held.update([Held("imex", "", huge, 1000.0)], frozenset())
    again = HeldProblems(str(tmp_path), log, boot=BOOT)
    assert [h.finding.message for h in again.held] == [huge.message]
    # However many problems, the writer never writes what the reader refuses: it says so.
    many = [Held("imex", f"s{i}", huge, 1000.0) for i in range(600)]
    held.update(many, frozenset())
    assert held.error is not None and "over its reader's 1048576" in held.error
    assert os.path.getsize(os.path.join(tmp_path, FILE)) <= 1024 * 1024
    assert len(HeldProblems(str(tmp_path), log, boot=BOOT).held) == 1  # the last one written
    assert [r.levelno for r in lines.records] == [logging.WARNING]


# Whole agents, restarted -------------------------------------------------------------------


def restart(host: Host, directory: str, wall: Clock, boot: str = BOOT, **config: Any) -> int:
    """A new agent on ``host`` (an upgrade, ``systemctl restart``) a minute on; returns how
    many lines were logged before it."""
    before = len(host.logs.records)
    wall.now += 60
    host.make_agent(state_directory=directory, boot=lambda: boot, wall=wall, **config)
    return before


def since(host: Host, kind: str) -> float:
    problems = [
        *host.state["host_problems"],
        *(p for g in host.state["gpus"] for p in g["problems"]),
    ]
    (p,) = [p for p in problems if p["kind"] == kind]
    return p["since"]


def history(host: Host) -> list[timeline.Step]:
    """``gpuagent history`` of the lines logged, as the journal would hold them."""
    entries = []
    for r in host.logs.records:
        fields = {k: v for k, v in vars(r).items() if k.isupper()}
        entry = {
            **fields,
            "_BOOT_ID": BOOT,
            "_SYSTEMD_UNIT": timeline.UNIT,
            "MESSAGE": r.getMessage(),
        }
        entries.append((r.created, entry))
    return timeline.events(entries, None)


def test_a_restart_restates_what_holds_at_info_with_its_first_since(
    host: Host, tmp_path: str
) -> None:
    directory, wall = str(tmp_path), Clock(1_800_000_000.0)
    taken, sick = host.slots[1], host.slots[6]
    fakesysfs.bind(host.root, taken, "nouveau")
    host.make_agent(state_directory=directory, boot=lambda: BOOT, wall=wall, expected_gpus=9)
    host.tick()
    host.healthy(slots=[s for s in host.slots if s not in (taken, sick)])
    host.tick(2)
    first = {k: since(host, k) for k in ("wrong_driver", "gpu_count", "missing")}
    started = [r for r in host.logs.records if r.levelno == logging.ERROR]
    assert sorted(r.PROBLEM for r in started) == ["gpu_count", "missing", "wrong_driver"]  # type: ignore[attr-defined]
    written = os.stat(os.path.join(directory, FILE)).st_ino
    host.tick(3)
    assert os.stat(os.path.join(directory, FILE)).st_ino == written  # quiet ticks: no write
    before = restart(host, directory, wall, expected_gpus=9)
    host.tick(3)
    after = host.logs.records[before:]
    assert [r.getMessage() for r in after if r.levelno >= logging.WARNING] == []
    still = [r for r in after if getattr(r, "MESSAGE_ID", None) == Event.STILL_HOLDS.value]
    assert sorted(r.PROBLEM for r in still) == ["gpu_count", "missing", "wrong_driver"]  # type: ignore[attr-defined]
    assert all(r.levelno == logging.INFO for r in still)
    assert {k: since(host, k) for k in first} == first
    assert host.events(Event.PROBLEM_CLEARED) == []
    # gpuagent history (a GPU's problem lines): one start per fault, whatever the restarts.
    starts = [(s.pci_slot, s.kind) for s in history(host) if s.event == "problem_start"]
    assert starts == [(taken, "wrong_driver")]


def test_after_a_reboot_a_fault_seen_again_is_news(host: Host, tmp_path: str) -> None:
    directory, wall = str(tmp_path), Clock(1_800_000_000.0)
    taken = host.slots[1]
    fakesysfs.bind(host.root, taken, "nouveau")
    host.make_agent(state_directory=directory, boot=lambda: BOOT, wall=wall)
    host.tick()
    before = restart(host, directory, wall, boot="f" * 32)
    host.tick()
    (line,) = [r for r in host.logs.records[before:] if r.levelno == logging.ERROR]
    assert line.PROBLEM == "wrong_driver"  # type: ignore[attr-defined]
    assert getattr(line, "MESSAGE_ID", None) == Event.problem("wrong_driver").value
    assert since(host, "wrong_driver") == wall.now


def test_the_driver_grace_counts_from_the_first_time(host: Host, tmp_path: str) -> None:
    directory, wall = str(tmp_path), Clock(1_800_000_000.0)
    fakesysfs.set_module(host.root, False)
    host.make_agent(
        state_directory=directory, boot=lambda: BOOT, wall=wall, driver_absent_grace=30.0
    )
    for _ in range(5):
        host.tick()
        wall.now += 10
    first = since(host, "no_driver_module")
    before = restart(host, directory, wall, driver_absent_grace=30.0)
    host.tick()
    # At once, not 30 s after the restart: no end, no new error line.
    assert since(host, "no_driver_module") == first
    after = host.logs.records[before:]
    assert [r.getMessage() for r in after if r.levelno >= logging.ERROR] == []
    (still,) = [r for r in after if getattr(r, "MESSAGE_ID", None) == Event.STILL_HOLDS.value]
    assert still.getMessage().startswith("host: still critical no_driver_module: ")
    host.tick(4)
    assert host.events(Event.PROBLEM_CLEARED) == []
    assert since(host, "no_driver_module") == first


def test_an_old_counted_xid_is_not_told_again_after_a_restart(
    host: Host, make: Any, tmp_path: str
) -> None:
    # The DBE cascade 48 -> 63 -> 94 two hours ago: Xid 48 holds (critical), Xid 63's warning
    # hold is over, Xid 94 (an application's) is counted only: its line once a boot.
    text = corpus_text("xid-48-63-94-driver550-dbe-rowremap").replace("0000:52:00", "0000:2a:00")
    directory, wall = str(tmp_path), Clock(time.time())
    journal = make(text, start=wall.now - 7200 - 430954)
    host.make_agent(
        state_directory=directory, boot=lambda: BOOT, wall=wall, journal_directory=journal
    )
    host.tick(2)
    assert [r.XID for r in host.events(Event.XID_COUNTED)] == ["94"]  # type: ignore[attr-defined]
    first = since(host, "xid")
    before = restart(host, directory, wall, journal_directory=journal)
    host.tick(2)
    assert len(host.events(Event.XID_COUNTED)) == 1
    xids = (Event.XID_PROBLEM.value, Event.XID_COUNTED.value, Event.STILL_HOLDS.value)
    after = [getattr(r, "MESSAGE_ID", None) for r in host.logs.records[before:]]
    assert [m for m in after if m in xids] == [Event.STILL_HOLDS.value]
    assert [
        p["xid"] for p in next(g for g in host.state["gpus"] if g["pci_slot"] == SLOT)["problems"]
    ] == [48]
    assert since(host, "xid") == first
