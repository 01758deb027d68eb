"""Fixed-grid tick arithmetic."""

from __future__ import annotations

from gpuagent.schedule import deadline, next_index


def test_on_time_tick_runs_the_next_grid_point() -> None:
    assert next_index(100.0, 10.0, 0, 100.3) == 1
    assert deadline(100.0, 10.0, 1) == 110.0


def test_a_late_wakeup_does_not_skip() -> None:
    # The tick at grid point 1 started late and finished before point 2.
    assert next_index(100.0, 10.0, 1, 119.9) == 2


def test_an_overrun_skips_the_points_it_missed() -> None:
    # Tick 1 ran from 110 to 135: points 2 (120) and 3 (130) are skipped, 4 (140) is next.
    assert next_index(100.0, 10.0, 1, 135.0) == 4


def test_grid_does_not_drift() -> None:
    start, interval, index = 5.0, 0.1, 0
    for _ in range(10_000):
        index = next_index(start, interval, index, deadline(start, interval, index) + 0.01)
    assert index == 10_000
    assert abs(deadline(start, interval, index) - (start + 1000.0)) < 1e-9
