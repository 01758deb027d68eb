"""The three cadenced reads (the probe, NVLink, the processes) driven tick by tick through the
agent with the fake nvidia-smi: one cadence, so their outages warn at the same failure, back
off on the same ticks, and a reload's ``backoff_after`` reaches all three."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from gpuagent.logs import Event
from tests.conftest import Host
from tests.fakehost import NOT_LOADED
from tests.test_nvidia_scenarios import COUNTERS, STATUS

NVLINK = {"status": STATUS, "errorcounters": COUNTERS}


@dataclass(frozen=True)
class Cadenced:
    """One cadenced read: how to make it fail, how many times it ran, its two lines."""

    fail: Callable[[Host], None]
    spawns: Callable[[Host], int]
    warning: Event
    recovered: Event


READS = {
    "probe": Cadenced(
        lambda host: host.failing(NOT_LOADED, 9),
        lambda host: host.spawns,
        Event.FAILING_DRIVER_NOT_LOADED,
        Event.RECOVERED,
    ),
    # The probe answers; nvlink --status exits 3.
    "nvlink": Cadenced(
        lambda host: host.healthy(nvlink={**NVLINK, "exit": 3}),
        lambda host: host.nvlink_spawns,
        Event.NVLINK_READ_FAILED,
        Event.NVLINK_READ_RECOVERED,
    ),
    "processes": Cadenced(
        lambda host: host.healthy(nvlink=NVLINK, apps={"stdout": "Unknown Error\n", "exit": 15}),
        lambda host: host.apps_spawns,
        Event.PROCESSES_READ_FAILED,
        Event.PROCESSES_READ_RECOVERED,
    ),
}


def agent(host: Host, backoff_after: int) -> None:
    """An agent whose three reads run every tick (10 s; retry_max 60 s: 6 ticks at most
    apart), one healthy tick behind it."""
    host.healthy(nvlink=NVLINK)
    host.make_agent(backoff_after=backoff_after, nvlink_interval=10.0)
    host.tick()


def reload(host: Host, backoff_after: int) -> None:
    assert host.agent is not None
    host.agent.configure(host.config(backoff_after=backoff_after, nvlink_interval=10.0))


def run(host: Host, read: Cadenced, ticks: int) -> tuple[list[int], list[int]]:
    """The ticks, of the next ``ticks``, the read ran on and those its warning was on."""
    ran, warned = [], []
    for tick in range(ticks):
        spawns, warnings = read.spawns(host), len(host.events(read.warning))
        host.tick()
        if read.spawns(host) > spawns:
            ran.append(tick)
        if len(host.events(read.warning)) > warnings:
            warned.append(tick)
    return ran, warned


@pytest.mark.parametrize("name", sorted(READS))
def test_an_outage_warns_at_the_threshold_and_backs_off_alike(host: Host, name: str) -> None:
    read = READS[name]
    agent(host, backoff_after=2)
    read.fail(host)
    # Failures 1 and 2 the next tick each, the second warns; then 2, 4 and 6 (the cap) apart.
    assert run(host, read, 20) == ([0, 1, 3, 7, 13, 19], [1])
    host.healthy(nvlink=NVLINK)
    host.tick(6)
    assert len(host.events(read.recovered)) == 1
    assert len(host.events(read.warning)) == 1


@pytest.mark.parametrize("name", sorted(READS))
def test_a_blip_below_the_threshold_is_no_warning(host: Host, name: str) -> None:
    read = READS[name]
    agent(host, backoff_after=3)
    read.fail(host)
    assert run(host, read, 2) == ([0, 1], [])
    host.healthy(nvlink=NVLINK)
    host.tick()
    assert host.events(read.warning) == host.events(read.recovered) == []


@pytest.mark.parametrize("name", sorted(READS))
def test_a_reload_lowering_backoff_after_reaches_the_read(host: Host, name: str) -> None:
    read = READS[name]
    agent(host, backoff_after=10)
    read.fail(host)
    assert run(host, read, 5) == ([0, 1, 2, 3, 4], [])
    reload(host, backoff_after=3)
    # The sixth failure, the first after the reload, is past the new threshold: it warns
    # (">=") and the backoff is at its cap at once.
    assert run(host, read, 14) == ([0, 6, 12], [0])


@pytest.mark.parametrize("name", sorted(READS))
def test_a_reload_raising_backoff_after_mid_outage_reaches_the_read(host: Host, name: str) -> None:
    read = READS[name]
    agent(host, backoff_after=2)
    read.fail(host)
    assert run(host, read, 4) == ([0, 1, 3], [1])
    reload(host, backoff_after=6)
    # Failures 4 to 6 are under the new threshold: the next tick each, then gaps of 2 and 4.
    # The outage goes on: no second warning.
    assert run(host, read, 10) == ([0, 1, 2, 4, 8], [])
    host.healthy(nvlink=NVLINK)
    host.tick(5)  # the next read is the cap's 6 ticks after the last
    assert len(host.events(read.recovered)) == 1
