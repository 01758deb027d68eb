from __future__ import annotations

import pytest

from gpuagent.health import ACTIONS, CRITICAL, OK, WARNING, Health
from gpuagent.verdict import Tracker
from gpuagent.views import Finding, worst
from tests import states


def test_worst_of_none_is_ok() -> None:
    assert worst([]) == OK


def test_worst_picks_critical_over_warning() -> None:
    w = Finding("throttled", WARNING, "check_host", "slowed")
    c = Finding("lost", CRITICAL, "reboot", "gone")
    assert worst([w]) == Health.WARNING
    assert worst([w, c]) == Health.CRITICAL


def test_bad_severity_or_action_is_refused() -> None:
    with pytest.raises(ValueError, match="severity"):
        Finding("x", "fatal", "reboot", "m")
    with pytest.raises(ValueError, match="action"):
        Finding("x", WARNING, "pray", "m")


def test_key_tells_two_xids_apart() -> None:
    a = Finding("xid", CRITICAL, "reboot", "m", (("xid", 79),))
    b = Finding("xid", CRITICAL, "reset_gpu", "m", (("xid", 48),))
    assert a.key != b.key
    assert "drain_and_rma" in ACTIONS


LOST = Finding("lost", CRITICAL, "reboot", "gone")
HOT = Finding("throttled", WARNING, "check_host", "clocks held down: hardware slowdown")


def test_tracker_starts_once_and_ends_once() -> None:
    t = Tracker()
    t.report("smi", {"0000:cf:00.0": [LOST]})
    started, ended = t.settle(100.0)
    assert [(p.slot, p.finding.kind, p.since) for p in started] == [("0000:cf:00.0", "lost", 100.0)]
    assert ended == []
    for now in (110.0, 120.0, 130.0):  # a burst: the same finding tick after tick
        t.report("smi", {"0000:cf:00.0": [LOST, LOST]})
        assert t.settle(now) == ([], [])
    assert t.problems("0000:cf:00.0")[0].since == 100.0
    t.report("smi", {})
    started, ended = t.settle(140.0)
    assert started == [] and [p.finding.kind for p in ended] == ["lost"]
    assert t.problems("0000:cf:00.0") == []


def test_tracker_merges_sources_and_keeps_since_across_a_new_message() -> None:
    t = Tracker()
    t.report("smi", {"a": [HOT]})
    t.report("xid", {"a": [Finding("xid", CRITICAL, "reset_gpu", "Xid 48", (("xid", 48),))]})
    started, _ = t.settle(1.0)
    assert sorted(p.finding.kind for p in started) == ["throttled", "xid"]
    # Worst first.
    assert [p.finding.kind for p in t.problems("a")] == ["xid", "throttled"]
    # As the state file holds it.
    (entry, _) = states.gpu(states.state(bus=(), problems={"a": t.problems("a")}), "a")["problems"]
    assert entry == {
        "kind": "xid",
        "severity": "critical",
        "action": "reset_gpu",
        "message": "Xid 48",
        "since": 1.0,
        "ends": "holds until the next boot; after the repair: gpuagent clear a xid",
        "latches": True,
        "xid": 48,
    }
    hotter = Finding("throttled", WARNING, "check_host", "clocks held down: power brake")
    t.report("smi", {"a": [hotter]})
    assert t.settle(2.0) == ([], [])
    (p,) = [p for p in t.problems("a") if p.finding.kind == "throttled"]
    assert (p.finding.message, p.since) == (hotter.message, 1.0)
    # One source clearing does not clear what another still sees.
    t.report("xid", {})
    t.report("other", {"a": [hotter]})
    t.report("smi", {})
    _, ended = t.settle(3.0)
    assert [p.finding.kind for p in ended] == ["xid"]


def test_exempt_slots_have_no_problems() -> None:
    t = Tracker()
    t.report("pci", {"v": [LOST], "w": [LOST]})
    started, _ = t.settle(1.0, exempt=["v"])
    assert [p.slot for p in started] == ["w"]
    assert t.slots() == {"w"}


def test_a_change_of_severity_or_action_is_restated_and_new_wording_is_not() -> None:
    t = Tracker()
    nonfatal = Finding("xid", WARNING, "none", "Nonfatal", (("xid", 145),))
    t.report("xid", {"a": [nonfatal]})
    t.settle(1.0)
    assert t.restated == []
    fatal = Finding("xid", CRITICAL, "reset_gpu", "Fatal", (("xid", 145),))
    t.report("xid", {"a": [fatal]})
    started, ended = t.settle(2.0)
    assert (started, ended) == ([], [])
    assert [(p.finding, p.since) for p in t.restated] == [(fatal, 1.0)]
    t.report("xid", {"a": [Finding("xid", CRITICAL, "reset_gpu", "reworded", (("xid", 145),))]})
    t.settle(3.0)
    assert t.restated == []
    assert fatal.name == "Xid 145"
    assert HOT.name == "throttled"
