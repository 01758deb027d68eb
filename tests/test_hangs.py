"""gpuagent.sources.driver.hangs: a driver that keeps hanging."""

from __future__ import annotations

from gpuagent.health import CRITICAL
from gpuagent.logs import Event
from gpuagent.sources.driver.hangs import ProbeHangs


def test_three_timeouts_within_an_hour_with_the_driver_loaded_is_a_hung_driver() -> None:
    # NVIDIA/NVSentinel#1748: under load the degrading GPU's "dcgmi health" hangs past its
    # 45 s deadline, and the monitor is restarted ~15 times a day; idle it answers in 0 s.
    hangs = ProbeHangs()
    hangs.observe(0.0, timed_out=True, module_loaded=True)
    hangs.observe(600.0, timed_out=False, module_loaded=True)  # idle: it answers
    hangs.observe(1200.0, timed_out=True, module_loaded=True)
    assert hangs.finding(1200.0) is None
    hangs.observe(3000.0, timed_out=True, module_loaded=True)
    f = hangs.finding(3000.0)
    assert f is not None
    assert (f.kind, f.severity, f.action) == ("driver_hung", CRITICAL, "reboot")
    assert f.message == (
        "nvidia-smi timed out 3 times within 3600 s with the nvidia module loaded: the driver "
        "no longer answers"
    )
    assert Event.problem(f.kind).name == "PROBLEM_DRIVER_HUNG"
    hangs.observe(3100.0, timed_out=False, module_loaded=True)
    assert hangs.finding(3100.0) == f  # an answer between hangs does not end it
    assert hangs.finding(3600.0) is None  # the first timeout has left the hour


def test_timeouts_without_the_module_do_not_count() -> None:
    hangs = ProbeHangs(count=3, window=3600.0)
    for t in (0.0, 10.0, 20.0):
        hangs.observe(t, timed_out=True, module_loaded=False)
    assert hangs.finding(20.0) is None
    for t in (30.0, 40.0, 50.0):
        hangs.observe(t, timed_out=True, module_loaded=True)
    assert hangs.finding(50.0) is not None
    hangs.observe(60.0, timed_out=False, module_loaded=False)  # unloaded: a new driver
    assert hangs.finding(60.0) is None
