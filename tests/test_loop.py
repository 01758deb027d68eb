"""nvidia-smi's loop as the probe (``sampler = "loop"``) on a fake host: the fake nvidia-smi's
own loop mode (``-lms``), a sample every ``loop_ms`` of the scenario, driven in real time;
each wait is for a condition, with a deadline."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator

import pytest

from gpuagent.commands.status import ExitCode, judge
from gpuagent.schema import ProbeState
from gpuagent.sources.probe import loop
from gpuagent.sources.probe.loop import LoopSampler
from gpuagent.sources.probe.source import Probe
from tests import fakesysfs
from tests.conftest import Host
from tests.fake_units import unit
from tests.test_driverstate import installed, loaded

FAST = 20  # ms between the fake loop's samples
LOST = "0000:03:00.0"  # the GPU of gpu-is-lost-linux.txt


@pytest.fixture
def looping(host: Host) -> Iterator[Host]:
    """The host's agent probing by loop, its fake answering a sample every FAST ms."""
    host.healthy(loop_ms=FAST)
    host.make_agent(sampler="loop", interval=1.0, probe_timeout=0.5)
    yield host
    if host.agent is not None:
        host.agent.close()


def sampler(host: Host) -> LoopSampler:
    assert host.agent is not None
    (probe,) = [s for s in host.agent.sources if isinstance(s, Probe)]
    return probe.probing.sampler


def until(host: Host, done: Callable[[], bool], seconds: float = 15.0) -> None:
    """Tick until ``done()``, for at most ``seconds`` of real time."""
    end = time.monotonic() + seconds
    while not done():
        if time.monotonic() > end:
            pytest.fail(f"not within {seconds} s: {host.probe}")
        host.tick()


def probes(host: Host) -> int:
    assert host.agent is not None
    (probe,) = [s for s in host.agent.sources if isinstance(s, Probe)]
    return probe.probing.view.probes_total


def loop_sample(host: Host) -> None:
    """Tick until the probe takes a sample of the loop (a probe that started nothing)."""
    spawns, before = host.probe["spawns_total"], probes(host)
    until(host, lambda: probes(host) > before)
    assert host.probe["spawns_total"] == spawns


def test_one_spawn_then_the_loop_answers_every_tick(looping: Host) -> None:
    looping.tick()
    assert looping.probe["state"] == ProbeState.OK
    assert looping.spawns == 2  # the first answer, then the loop
    assert sampler(looping).child.running
    for _ in range(3):
        loop_sample(looping)
    assert looping.probe["state"] == ProbeState.OK
    assert looping.spawns == 2
    assert [c[-2:] for c in looping.calls() if "-lms" in c] == [["-lms", "1000"]]


def test_a_gpu_lost_mid_loop_is_judged_and_the_loop_goes_on(host: Host) -> None:
    fakesysfs.add_device(host.root, LOST, 0x10DE, 0x2335, 0x030200, "nvidia")
    host.healthy(loop_ms=FAST)
    host.make_agent(sampler="loop", interval=1.0, probe_timeout=0.5)
    try:
        host.tick()
        host.healthy(append="gpu-is-lost-linux.txt", exit=15, loop_ms=FAST)
        until(host, lambda: "GPU is lost" in str(host.state["gpus"]))
        assert host.spawns == 2
        assert sampler(host).child.running
        assert judge(host.state, time.time())[0] == ExitCode.CRITICAL
    finally:
        assert host.agent is not None
        host.agent.close()


def test_garbage_is_a_failed_probe_and_two_failed_loops_fall_back_to_spawns(
    looping: Host,
) -> None:
    looping.tick()
    looping.scenario(stdout="this is not csv at all\n", loop_ms=FAST)
    until(looping, lambda: looping.probe["state"] == ProbeState.FAILING)
    assert looping.probe["failure_class"] == "unparseable"
    assert not sampler(looping).child.running
    looping.healthy(loop_ms=FAST)
    until(looping, lambda: sampler(looping).child.running)
    # The second: the loop exits (exit 9: the driver went), its status classifies it.
    looping.scenario(exit=9, loop_ms=FAST)
    until(looping, lambda: looping.probe["state"] == ProbeState.FAILING)
    assert "loop exit 9" in (looping.probe["last_error"] or "")
    assert looping.probe["failure_class"] == "driver_not_loaded"
    fallback = [m for m in looping.lines(logging.WARNING) if "probing by spawn" in m]
    assert len(fallback) == 1
    looping.healthy(loop_ms=FAST)
    until(looping, lambda: looping.probe["state"] == ProbeState.OK)
    spawns = looping.spawns
    looping.tick(3)
    assert looping.spawns == spawns + 3  # one a tick: no loop any more
    assert not sampler(looping).child.running
    assert len([m for m in looping.lines(logging.WARNING) if "probing by spawn" in m]) == 1


def test_a_stall_is_killed_at_the_timeout_backs_off_and_recovers_with_one_line(
    looping: Host,
) -> None:
    looping.tick()
    looping.scenario(hang=30)
    until(looping, lambda: looping.probe["state"] == ProbeState.FAILING)
    assert looping.probe["failure_class"] == "timeout"
    assert "no sample from nvidia-smi's loop" in (looping.probe["last_error"] or "")
    assert not sampler(looping).child.running
    # The spawns that follow hang too (the fake's step): the outage, then the backoff.
    until(looping, lambda: looping.probe["consecutive_failures"] >= 3)
    assert (looping.probe["next_probe_in_ticks"] or 0) >= 2
    looping.healthy(loop_ms=FAST)
    until(looping, lambda: looping.probe["state"] == ProbeState.OK, 30)
    assert [m for m in looping.lines(logging.INFO) if m == "nvidia-smi is answering again"]
    until(looping, lambda: sampler(looping).child.running)


def test_persistenced_stopping_releases_the_loop_within_the_tick(looping: Host) -> None:
    looping.units.set(unit("nvidia-persistenced.service"))
    looping.tick()
    assert sampler(looping).child.running
    looping.units.set(unit("nvidia-persistenced.service", "deactivating", "stop"))
    spawns = looping.spawns
    looping.tick()
    assert not sampler(looping).child.running
    assert looping.spawns == spawns + 1  # the tick still probed: by spawn
    assert looping.probe["state"] == ProbeState.OK
    assert any("nvidia-persistenced is deactivating" in m for m in looping.lines(logging.INFO))
    looping.tick()
    assert not sampler(looping).child.running
    looping.units.set(unit("nvidia-persistenced.service"))
    until(looping, lambda: sampler(looping).child.running)


def test_a_new_installed_driver_releases_the_loop_and_the_mismatch_is_still_told(
    host: Host,
) -> None:
    host.healthy(loop_ms=FAST)
    loaded(host, "590.48.01")
    library = installed(host, "590.48.01")
    host.make_agent(sampler="loop", interval=1.0, probe_timeout=0.5, nvml_library=library)
    try:
        host.tick()
        assert sampler(host).child.running
        installed(host, "595.84")
        host.failing()  # the new nvidia-smi against the old module: exit 18
        host.tick()
        assert not sampler(host).child.running
        assert any("595.84 is installed" in m for m in host.lines(logging.INFO))
        kinds = [p["kind"] for p in host.state["host_problems"]]
        assert "driver_mismatch" in kinds
    finally:
        assert host.agent is not None
        host.agent.close()


def test_a_module_holder_unloaded_releases_the_loop(looping: Host) -> None:
    holders = os.path.join(looping.root, "module", "nvidia", "holders")
    os.makedirs(os.path.join(holders, "nvidia_uvm"))
    looping.tick()
    assert sampler(looping).child.running
    os.rmdir(os.path.join(holders, "nvidia_uvm"))
    looping.tick()
    assert not sampler(looping).child.running
    assert looping.probe["state"] == ProbeState.OK


def test_a_reload_changing_the_interval_restarts_the_loop_at_it(looping: Host) -> None:
    looping.tick()
    assert looping.agent is not None
    looping.agent.configure(looping.agent.config._replace(interval=2.0))
    assert not sampler(looping).child.running
    until(looping, lambda: sampler(looping).child.running)
    proc = sampler(looping).child.proc
    assert proc is not None and proc.args[-2:] == ["-lms", "2000"]  # type: ignore[index]
    loop_sample(looping)


def restarted(host: Host, spawns: int, proc: object) -> bool:
    """Whether the loop was started afresh since the probe's ``spawns`` (its count) and
    ``proc``: a spawn and a new child, no failure."""
    child = sampler(host).child
    return (
        host.probe["spawns_total"] == spawns + 2
        and child.running
        and child.proc is not proc
        and host.probe["state"] == ProbeState.OK
        and sampler(host).misbehaved == 0
    )


def test_a_gpu_gone_from_the_bus_restarts_the_loop_in_the_tick(looping: Host) -> None:
    looping.tick()
    spawns, proc = looping.probe["spawns_total"], sampler(looping).child.proc
    fakesysfs.remove_device(looping.root, looping.slots[-1])
    looping.tick()
    assert restarted(looping, spawns, proc)
    spawns, proc = looping.probe["spawns_total"], sampler(looping).child.proc
    fakesysfs.bind(looping.root, looping.slots[0], None)  # its driver let go of it
    looping.tick()
    assert restarted(looping, spawns, proc)
    loop_sample(looping)


def test_a_loop_is_started_afresh_after_refresh_seconds(
    looping: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "REFRESH", 0.5)
    looping.tick()
    spawns, proc = looping.probe["spawns_total"], sampler(looping).child.proc
    until(looping, lambda: sampler(looping).child.proc is not proc)
    assert restarted(looping, spawns, proc)
    assert not looping.lines(logging.INFO)[1:]  # no line: no outage, no failure


def test_a_critical_xid_restarts_a_loop_a_minute_old(
    looping: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    looping.tick()
    child = sampler(looping).child
    bus = sampler(looping)._loop_bus
    sampler(looping).verify(bus, fault=True)
    assert child.running  # younger than FAULT_AGE: an Xid storm restarts it at most once
    monkeypatch.setattr(loop, "FAULT_AGE", 0.0)
    sampler(looping).verify(bus, fault=False)
    assert child.running
    sampler(looping).verify(bus, fault=True)
    assert not child.running
    until(looping, lambda: sampler(looping).child.running)
    assert sampler(looping).misbehaved == 0
