"""The tick-counted backoff, against exact probed-tick sequences."""

from __future__ import annotations

import itertools

import pytest

from gpuagent.edges.backoff import Backoff, cap_ticks


def probed_ticks(backoff: Backoff, ticks: int, ok: set[int] | None = None) -> list[int]:
    """Drive ``ticks`` ticks; a probe fails unless its tick is in ``ok``."""
    probed = []
    for tick in range(ticks):
        if backoff.due():
            probed.append(tick)
            if ok and tick in ok:
                backoff.success()
            else:
                backoff.failure()
    return probed


def test_forty_failing_ticks_at_ten_seconds() -> None:
    backoff = Backoff(3, cap_ticks(10, 60))
    assert probed_ticks(backoff, 40) == [0, 1, 2, 4, 8, 14, 20, 26, 32, 38]


@pytest.mark.parametrize(
    ("interval", "retry_max", "cap"),
    [
        (10, 60, 6),
        (7, 60, 9),
        (0.5, 60, 120),
        (60, 60, 2),
        (120, 60, 2),
        (1000, 60, 2),
        (30, 60, 2),
    ],
)
def test_cap_is_at_least_two_ticks(interval: float, retry_max: float, cap: int) -> None:
    assert cap_ticks(interval, retry_max) == cap


def test_threshold_probes_every_tick() -> None:
    backoff = Backoff(5, 6)
    assert probed_ticks(backoff, 8) == [0, 1, 2, 3, 4, 6]


def test_gaps_double_then_stay_at_the_cap() -> None:
    backoff = Backoff(1, 16)
    probed = probed_ticks(backoff, 200)
    gaps = [b - a for a, b in itertools.pairwise(probed)]
    assert gaps[:6] == [2, 4, 8, 16, 16, 16]
    assert set(gaps[3:]) == {16}


def test_interval_above_the_cap_still_waits_two_ticks() -> None:
    backoff = Backoff(3, cap_ticks(120, 60))
    assert probed_ticks(backoff, 12) == [0, 1, 2, 4, 6, 8, 10]


def test_success_resets_the_count_and_the_gap() -> None:
    backoff = Backoff(3, 6)
    assert probed_ticks(backoff, 15, ok={8}) == [0, 1, 2, 4, 8, 9, 10, 11, 13]
    assert backoff.failures == 4


def test_next_in_ticks_counts_from_the_last_tick() -> None:
    backoff = Backoff(3, 6)
    for _ in range(3):
        assert backoff.due()
        backoff.failure()
    assert backoff.next_in_ticks == 2
    assert not backoff.due()
    assert backoff.next_in_ticks == 1
    assert backoff.due()


def test_expedite_makes_the_next_tick_probe() -> None:
    backoff = Backoff(1, 64)
    for _ in range(5):
        for _ in range(64):  # the longest gap is the cap
            if backoff.due():
                break
        else:
            pytest.fail("no probe due within the cap")
        backoff.failure()
    assert backoff.next_in_ticks > 1
    backoff.expedite()
    assert backoff.due()


def test_a_very_long_outage_stays_at_the_cap() -> None:
    backoff = Backoff(3, 6)
    backoff.failures = 10**6
    backoff.failure()
    assert backoff.next_in_ticks == 6


@pytest.mark.parametrize(("after", "cap"), [(0, 6), (3, 1)])
def test_rejects_nonsense(after: int, cap: int) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(after, cap)
