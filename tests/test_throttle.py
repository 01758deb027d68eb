"""gpuagent.sources.probe.throttle: throttling judged over a window of samples."""

from __future__ import annotations

from gpuagent.health import WARNING
from gpuagent.logs import Event
from gpuagent.sources.probe import rules
from gpuagent.sources.probe.throttle import ThrottleWindow
from tests.test_rules import h200

SLOT = "0000:18:00.0"
# The H200 capture's row with the hardware's own reasons set, as nvidia-smi prints them.
THERMAL = rules.throttle_reasons(h200(clocks_event_reasons__active="0x0000000000000040"))
BRAKE = rules.throttle_reasons(h200(clocks_event_reasons__active="0x0000000000000088"))
IDLE = rules.throttle_reasons(h200(clocks_event_reasons__active="0x0000000000000001"))


def feed(
    window: ThrottleWindow, start: float, reasons: list[list[str]], step: float = 10.0
) -> float:
    t = start
    for r in reasons:
        window.add(SLOT, t, r)
        t += step
    return t - step


def test_the_reasons_are_the_hardware_s() -> None:
    assert THERMAL == ["hardware thermal slowdown"]
    assert BRAKE == ["hardware slowdown", "hardware power brake"]
    assert IDLE == []


def test_one_throttled_sample_in_a_full_window_is_no_problem() -> None:
    w = ThrottleWindow(window=600.0, fraction=0.1)
    now = feed(w, 0.0, [[]] * 30 + [THERMAL] + [[]] * 29)  # 60 samples, 10 s apart
    assert w.findings(now) == {}


def test_a_tenth_of_the_samples_is_throttled() -> None:
    w = ThrottleWindow(window=600.0, fraction=0.1)
    now = feed(w, 0.0, ([THERMAL] + [[]] * 9) * 5 + [[]] * 4 + [BRAKE])
    (f,) = w.findings(now)[SLOT]
    assert (f.kind, f.severity, f.action) == ("throttled", WARNING, "check_host")
    assert f.message == (
        "clocks held down in 6 of 55 samples over the last 600 s: hardware slowdown, "
        "hardware thermal slowdown, hardware power brake"
    )
    assert Event.problem(f.kind).name == "PROBLEM_THROTTLED"


def test_it_ends_when_the_throttled_samples_leave_the_window() -> None:
    w = ThrottleWindow(window=600.0, fraction=0.1)
    now = feed(w, 0.0, [THERMAL] * 10)  # throttled for 100 s
    assert SLOT in w.findings(now)
    now = feed(w, now + 10.0, [[]] * 80)  # then 800 s without
    assert w.findings(now) == {}
    assert w.findings(now + 600.0) == {}
    assert w._buckets == {}  # forgotten without a sample in the window


def test_a_gpu_throttled_from_its_first_sample_is_reported_at_once() -> None:
    # The window is as long as the agent has sampled: 1 of 1 is all of it.
    w = ThrottleWindow()
    w.add(SLOT, 5.0, THERMAL)
    assert SLOT in w.findings(5.0)
    w.add("0000:2a:00.0", 5.0, [])
    assert "0000:2a:00.0" not in w.findings(5.0)


def test_a_fraction_of_one_needs_every_sample() -> None:
    w = ThrottleWindow(window=60.0, fraction=1.0)
    now = feed(w, 0.0, [THERMAL] * 5 + [[]])
    assert w.findings(now) == {}
    now = feed(w, now + 10.0, [THERMAL] * 6)
    assert SLOT in w.findings(now)


def test_memory_is_bounded_whatever_the_interval() -> None:
    w = ThrottleWindow(window=600.0)
    feed(w, 0.0, [THERMAL, []] * 50_000, step=0.1)  # 100,000 samples at interval 0.1
    assert len(w._buckets[SLOT]) <= 61
    (f,) = w.findings(10_000.0 - 0.1)[SLOT]
    # 6,000 samples in the window, give or take one bucket (a 60th of it: 100 samples).
    held, samples = (int(n) for n in f.message.split()[4:7:2])
    assert 6000 <= samples <= 6100 and held * 2 == samples
