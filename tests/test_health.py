from __future__ import annotations

import pytest

from gpuagent.health import ACTIONS, CRITICAL, OK, WARNING, Finding, worst


def test_worst_of_none_is_ok() -> None:
    assert worst([]) == OK


def test_worst_picks_critical_over_warning() -> None:
    w = Finding("throttled", WARNING, "check_host", "slowed")
    c = Finding("lost", CRITICAL, "reboot", "gone")
    assert worst([w]) == WARNING
    assert worst([w, c]) == CRITICAL


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
