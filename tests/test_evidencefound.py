"""gpuagent.evidence.found and plan.Bundles: a GPU's critical problem names the bundle root's
unit gathered of it since the problem began, in the state, `gpuagent status --json` and the
status text; the agent only lists the evidence directory's names (a fake host's agent, a
directory made here as root's store makes it)."""

from __future__ import annotations

import os
import time
from typing import Any, cast

import pytest

from gpuagent.commands.status import judge
from gpuagent.commands.statustext import render
from gpuagent.evidence import found, plan
from gpuagent.logs import Event
from tests.conftest import Host

T0 = 1_750_000_000.0
SLOT, OTHER = "0000:18:00.0", "0000:2a:00.0"


class Log:
    """An EventLog stand-in that keeps each line's text."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, level: int, event: Event | None, message: str, **fields: Any) -> None:
        self.lines.append(message)


def names(*pairs: tuple[float, str]) -> tuple[str, ...]:
    return tuple(sorted(plan.bundle_name(at, slot) for at, slot in pairs))


def test_a_problem_names_its_gpus_newest_bundle_since_it_began() -> None:
    b = plan.Bundles("/e", names((T0 - 60, SLOT), (T0, SLOT), (T0 + 90, SLOT), (T0 + 9, OTHER)))
    assert b.since(SLOT, T0 - 3600) == f"/e/{plan.bundle_name(T0 + 90, SLOT)}"
    assert b.since(OTHER, T0) == f"/e/{plan.bundle_name(T0 + 9, OTHER)}"
    # A name keeps whole seconds: the bundle of the problem's own second is its.
    assert b.since(SLOT, T0 + 90.9) == f"/e/{plan.bundle_name(T0 + 90, SLOT)}"
    assert b.since(SLOT, T0 + 91) is None
    assert b.since("0000:3b:00.0", 0) is None
    assert plan.NO_BUNDLES.since(SLOT, 0) is None
    assert plan.bundle_time(plan.bundle_name(T0, SLOT)) == T0
    assert plan.bundle_time(".partial-" + plan.bundle_name(T0, SLOT)) is None


def test_the_agent_lists_only_bundle_names(tmp_path: Any) -> None:
    evidence = tmp_path / "evidence"
    log = Log()
    f = found.Found(str(evidence), cast(Any, log))
    assert f.bundles() == plan.Bundles(str(evidence))  # none gathered yet: no line
    evidence.mkdir()
    whole = plan.bundle_name(T0, SLOT)
    for name in (whole, ".partial-" + plan.bundle_name(T0 + 5, SLOT), ".ledger.json", "x"):
        (evidence / name).mkdir()
    assert f.bundles().names == (whole,)
    listed_at = os.stat(evidence).st_mtime_ns
    # Listed only while a GPU has a critical problem to name a bundle.
    assert f.named({}) is plan.NO_BUNDLES
    # A bundle renamed whole while the directory's mtime stays put (a coarse clock): the
    # change is under a second old, so the directory is listed again.
    later = plan.bundle_name(T0 + 60, SLOT)
    (evidence / later).mkdir()
    os.utime(evidence, ns=(time.time_ns(), listed_at))
    assert f.bundles().names == (whole, later)
    # A change over a second old is listed once; then, while the mtime stays, not again.
    os.utime(evidence, ns=(time.time_ns(), listed_at - 5_000_000_000))
    assert f.bundles().names == (whole, later)
    (evidence / plan.bundle_name(T0 + 120, SLOT)).mkdir()
    os.utime(evidence, ns=(time.time_ns(), listed_at - 5_000_000_000))
    assert f.bundles().names == (whole, later)
    assert log.lines == []


def test_a_directory_it_cannot_list_is_one_line(tmp_path: Any) -> None:
    log = Log()
    blocker = tmp_path / "file"
    blocker.write_text("")
    f = found.Found(str(blocker / "evidence"), cast(Any, log))
    for _ in range(3):
        assert f.bundles().names == ()
    assert log.lines == [f"cannot list the evidence bundles in {blocker}/evidence: Not a directory"]


@pytest.mark.parametrize("gathered", [True, False])
def test_a_critical_problem_names_the_bundle_in_state_and_status(
    host: Host, tmp_path: Any, gathered: bool
) -> None:
    state = tmp_path / "state"
    (state / "evidence").mkdir(parents=True)
    sick, well = host.slots[0], host.slots[1]
    host.healthy(override={sick: {"gpu_recovery_action": "Reset"}})
    host.make_agent(state_directory=str(state))
    st = host.tick().state
    (problem,) = next(g for g in st["gpus"] if g["pci_slot"] == sick)["problems"]
    assert problem["severity"] == "critical" and "evidence" not in problem
    # Root's unit writes the sick GPU's bundle (and one of a GPU with no problem).
    name = plan.bundle_name(problem["since"] + (1 if gathered else -3600), sick)
    (state / "evidence" / name).mkdir()
    (state / "evidence" / plan.bundle_name(problem["since"], well)).mkdir()
    st = host.tick().state
    (problem,) = next(g for g in st["gpus"] if g["pci_slot"] == sick)["problems"]
    path = f"{state}/evidence/{name}"
    assert problem.get("evidence") == (path if gathered else None)
    assert all(not g["problems"] for g in st["gpus"] if g["pci_slot"] != sick)
    now = time.time()
    text = render(st, now, *judge(st, now), width=200)
    said = f"\n        evidence: {path}\n"
    assert (said in text) is gathered, text
