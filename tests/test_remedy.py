"""The host's remedy: one action from the problems' actions, by one ordered rule."""

from __future__ import annotations

import itertools
import json
import os

import pytest

from gpuagent import remedy as remedy_module
from gpuagent.commands import drain
from gpuagent.health import ACTIONS, CRITICAL, WARNING, rank
from gpuagent.remedy import COVERS, HOST_WIDE, SAYS, Ailment, covers, of_state, plan, remedy
from gpuagent.schema import State

DONE = ACTIONS[1:]  # every action but none
A, B = "0000:2a:00.0", "0000:ab:00.0"
GOLDEN = os.path.join(os.path.dirname(__file__), "data", "golden")


def _table() -> dict[tuple[str, str], bool]:
    """The docstring's table: (done, asked) -> whether it covers."""
    doc = remedy_module.__doc__ or ""
    table = {}
    for cells in (line.split() for line in doc.splitlines()):
        if cells and cells[0] in DONE and len(cells) == len(DONE) + 1:
            for asked, mark in zip(DONE, cells[1:], strict=True):
                table[cells[0], asked] = mark == "x"
    return table


def test_the_docstrings_table_is_the_rule_for_every_pair() -> None:
    table = _table()
    assert set(table) == set(itertools.product(DONE, DONE))
    for (done, asked), mark in table.items():
        assert covers(done, asked) is mark, (done, asked)


def test_the_pairs_the_issue_names() -> None:
    for asked in ("reset_gpu", "drain_and_reset", "drain_p2p", "restart_app", "restart_service"):
        assert covers("reboot", asked)
    # A host fix outlives a reboot; a bad board stays bad.
    assert not covers("reboot", "check_host")
    assert not covers("reboot", "drain_and_rma")
    assert not covers("drain_and_rma", "check_host")
    for done in DONE:
        assert covers(done, done)
        assert not covers(done, "none") and not covers("none", done)
        # Nothing milder ends the worst, and check_host is ended by itself alone.
        assert covers(done, "drain_and_rma") is (done == "drain_and_rma")
        assert covers(done, "check_host") is (done == "check_host")


def test_every_action_has_words_and_a_row() -> None:
    assert set(SAYS) == set(DONE)
    assert set(COVERS) == set(ACTIONS)
    assert SAYS["reboot"] == "drain and reboot"


def ailing(*problems: tuple[str, str, str, str]) -> list[Ailment]:
    """(slot, kind, severity, action), put in the one order of the worst."""
    ordered = sorted(problems, key=lambda p: rank(p[2], p[3], p[0], p[1]))
    return [(slot, kind, action, False) for slot, kind, _, action in ordered]


def test_a_healthy_host_has_no_remedy() -> None:
    assert remedy([]) is None
    assert plan([]) == []
    # Nothing asked, or only what a cause explains: none either.
    assert remedy([("", "inforom", "none", False), (A, "fabric", "reset_gpu", True)]) is None


def test_the_sick_demo_is_one_reboot() -> None:
    cure = remedy(
        ailing(
            (B, "requires_reset", CRITICAL, "reset_gpu"),
            ("0000:db:00.0", "gone_from_bus", CRITICAL, "reboot"),
            (A, "Xid 119", CRITICAL, "reset_gpu"),
        )
    )
    assert cure == {
        "action": "reboot",
        "says": "drain and reboot",
        "fixes": ["0000:db:00.0 gone_from_bus", f"{A} Xid 119", f"{B} requires_reset"],
        "leaves": [],
    }


def test_a_caused_problem_is_left_out_and_its_cause_acted_on() -> None:
    cure = remedy(
        [("", "fabricmanager_down", "restart_service", False), (A, "fabric", "reset_gpu", True)]
    )
    assert cure is not None
    assert (cure["action"], cure["fixes"], cure["leaves"]) == (
        "restart_service",
        ["host fabricmanager_down"],
        [],
    )


@pytest.mark.parametrize(("first", "second"), list(itertools.product(DONE, DONE)))
@pytest.mark.parametrize("same", [True, False])
def test_every_pair_of_actions(first: str, second: str, same: bool) -> None:
    """Two criticals, on one GPU or two: the worst one's action leads; the other is fixed
    when that action covers it where it reaches, else left; the plan ends both."""
    worst, other = sorted([first, second], key=lambda a: rank(CRITICAL, a, A, "k"))
    slot = A if same else B
    cure = remedy(ailing((A, "one", CRITICAL, worst), (slot, "two", CRITICAL, other)))
    assert cure is not None
    assert cure["action"] == worst
    reaches = worst in HOST_WIDE or same or worst == other
    fixed = covers(worst, other) and reaches
    assert cure["fixes"] == [f"{A} one"] + ([f"{slot} two"] if fixed else [])
    assert cure["leaves"] == ([] if fixed else [f"{slot} two"])
    steps = plan(ailing((A, "one", CRITICAL, worst), (slot, "two", CRITICAL, other)))
    assert [s["action"] for s in steps] == ([worst] if fixed else [worst, other])


@pytest.mark.parametrize("action", DONE)
def test_a_hosts_problem_asking_a_gpus_action_asks_it_of_every_gpu(action: str) -> None:
    cure = remedy([("", "fabricmanager_restarted", action, False), (A, "k", action, False)])
    assert cure is not None and cure["leaves"] == []


def test_the_hosts_rma_reaches_every_gpu() -> None:
    rma = remedy(ailing(("", "h", CRITICAL, "drain_and_rma"), (A, "x", CRITICAL, "reset_gpu")))
    assert rma is not None and rma["fixes"] == ["host h", f"{A} x"]


def test_a_warning_does_not_lead_a_critical_as_in_the_drain_reason() -> None:
    """One order for every surface: the worst problem is critical first, its action leads even
    where a warning asks more."""
    cure = remedy(
        ailing(
            (A, "retired_pages_rising", WARNING, "drain_and_rma"), (B, "x", CRITICAL, "reset_gpu")
        )
    )
    assert cure is not None
    assert (cure["action"], cure["leaves"]) == ("reset_gpu", [f"{A} retired_pages_rising"])


def test_an_unknown_action_from_a_newer_agent_leads_and_covers_itself() -> None:
    cure = remedy([(A, "k", "replace_the_host", False), (B, "k", "reboot", False)])
    assert cure is not None
    assert (cure["says"], cure["fixes"], cure["leaves"]) == (
        "replace_the_host",
        [f"{A} k"],
        [f"{B} k"],
    )


def _golden_states() -> list[State]:
    states = []
    for name in sorted(os.listdir(GOLDEN)):
        with open(os.path.join(GOLDEN, name), encoding="utf-8") as f:
            steps = json.load(f)["steps"]
        states += [s["state"] for s in steps if isinstance(s.get("state"), dict)]
    return states


def test_every_captured_state_says_the_remedy_status_and_the_drain_reason_agree() -> None:
    """On every state the goldens recorded (the captured hosts, the sick demo): the state's
    remedy is the rule's on its problems, and its action is the drain reason's."""
    states = _golden_states()
    assert any(st.get("remedy") for st in states)
    for st in states:
        steps = of_state(st)
        assert st.get("remedy") == (steps[0] if steps else None)
        bad = drain.critical(st)
        if bad is not None and steps:
            assert bad.action == steps[0]["action"], st["status"]
