"""The Source seam: the tick's order declared once, a source added through the seam alone,
one source's bug that the others outlive, and a tick that keeps one tick back only."""

from __future__ import annotations

import dataclasses
import logging

from gpuagent.health import WARNING
from gpuagent.sources import Outcome, Source
from gpuagent.views import Finding, Tick
from tests.conftest import Host

NOW_AND_CONFIG = {"now", "mono", "config", "previous"}


class Fixture(Source):
    """A source that is nowhere in gpuagent: a warning (of a kind the catalog has) on the
    first GPU of the bus, its own trouble, and, when ``broken``, a bug.  ``seen`` is what it
    read of the earlier sources."""

    name = "fixture"

    def __init__(self) -> None:
        self.broken = False
        self.seen: list[tuple[int, str]] = []

    def step(self, tick: Tick) -> Outcome:
        if self.broken:
            raise ValueError("the fixture broke")
        self.seen.append((len(tick.bus.gpus), tick.probe.state))
        slot = tick.bus.slots[0]
        finding = Finding("inforom", WARNING, "check_host", "the fixture says so")
        return Outcome(None, {"fixture": {slot: [finding]}}, {"fixture": "fixture trouble"})


def test_the_tick_has_one_field_per_source_in_the_sequence_order(host: Host) -> None:
    agent = host.make_agent()
    names = [s.name for s in agent.sources]
    assert len(set(names)) == len(names)
    fields = [f.name for f in dataclasses.fields(Tick) if f.name not in NOW_AND_CONFIG]
    # Every view of the tick is a source's, in the order the sources fill them.
    assert fields == [n for n in names if n in fields]


def test_a_source_added_through_the_seam_alone_appears_in_the_report(host: Host) -> None:
    agent = host.make_agent()
    fixture = Fixture()
    agent.sources = (*agent.sources, fixture)
    st = host.tick(2).state
    gpu = next(g for g in st["gpus"] if g["pci_slot"] == host.slots[0])
    assert [p["kind"] for p in gpu["problems"]] == ["inforom"]
    assert gpu["problems"][0]["message"] == "the fixture says so"
    assert st["problems"] == {"fixture": "fixture trouble"}
    # It read the views of the sources before it, this tick's.
    assert fixture.seen == [(len(host.slots), "ok"), (len(host.slots), "ok")]


def test_one_sources_bug_is_logged_once_and_the_others_go_on(host: Host) -> None:
    agent = host.make_agent()
    fixture = Fixture()
    agent.sources = (*agent.sources, fixture)
    host.tick()
    fixture.broken = True
    st = host.tick(3).state
    errors = [r.getMessage() for r in host.logs.records if r.levelno >= logging.ERROR]
    assert errors == [
        "internal error in a tick's fixture step, carrying on: ValueError: the fixture broke"
    ]
    assert st["problems"]["internal"] == "ValueError: the fixture broke"
    assert st["ticks"] == 4 and st["probe"]["state"] == "ok"
    fixture.broken = False
    assert "internal" not in host.tick().state["problems"]


def test_a_tick_keeps_one_tick_back_only(host: Host) -> None:
    agent = host.make_agent()
    host.tick(3)
    assert agent.last.previous is not None
    assert agent.last.previous.previous is None
