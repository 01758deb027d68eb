"""gpuagent.edges.cadence: the ticks a cadenced read runs on, its backoff counted in reads,
and its one outage, against exact tick sequences."""

from __future__ import annotations

from collections.abc import Set

import pytest

from gpuagent.edges.cadence import Cadence, every_ticks


def reads(
    cadence: Cadence,
    ticks: int,
    ok: Set[int] = frozenset(),
    gated: Set[int] = frozenset(),
    starts: list[int] | None = None,
) -> list[int]:
    """The ticks a read ran on, of ``ticks``: it answers on the ticks in ``ok`` and fails on
    the others; its own gates are closed on those in ``gated``.  ``starts`` gets the ticks
    whose failure started the outage."""
    ran = []
    for tick in range(ticks):
        if not cadence.due() or tick in gated or not cadence.start():
            continue
        ran.append(tick)
        if tick in ok:
            cadence.succeeded()
        elif cadence.failed() and starts is not None:
            starts.append(tick)
    return ran


@pytest.mark.parametrize(
    ("seconds", "interval", "ticks"),
    [
        (60, 10, 6),
        (61, 10, 7),
        (10, 10, 1),
        (5, 10, 1),  # less than a tick (a run --interval override): every tick
        (0.3, 0.1, 3),
        (0.7, 0.1, 7),
        (1.0, 0.3, 4),
        (600, 0.1, 6000),
        (86400, 0.1, 864000),
    ],
)
def test_every_ticks(seconds: float, interval: float, ticks: int) -> None:
    assert every_ticks(seconds, interval) == ticks


def test_the_probe_every_tick_backs_off_in_ticks() -> None:
    # interval 10 s, backoff_after 3, retry_max 60 s: gaps of 2, 4, then 6 ticks (the cap).
    cadence = Cadence(10, 10, 3, 60)
    assert reads(cadence, 40) == [0, 1, 2, 4, 8, 14, 20, 26, 32, 38]
    assert (cadence.failures, cadence.cap, cadence.next_in_ticks) == (10, 6, 5)


def test_a_longer_period_reads_every_n_ticks_and_backs_off_in_reads() -> None:
    # Every 3 ticks; the backoff counts reads: 2 reads apart (the cap, retry_max / period).
    assert reads(Cadence(30, 10, 3, 60), 30, ok=set(range(30))) == list(range(0, 30, 3))
    cadence = Cadence(30, 10, 3, 60)
    assert reads(cadence, 25) == [0, 3, 6, 12, 18, 24]
    assert cadence.next_in_ticks == 6


def test_next_in_ticks_counts_down_the_period_and_the_gap() -> None:
    cadence = Cadence(30, 10, 1, 120)  # every 3 ticks, backing off from the first failure
    assert cadence.due() and cadence.start()
    cadence.failed()  # a gap of 2 reads: 6 ticks
    left = []
    for _ in range(5):
        left.append(cadence.next_in_ticks)
        assert not (cadence.due() and cadence.start())
    assert left == [6, 5, 4, 3, 2]
    assert cadence.next_in_ticks == 1
    assert cadence.due() and cadence.start()


def test_a_due_read_stays_due_while_its_gates_are_closed() -> None:
    # Due at tick 3; its gates closed on ticks 3 and 4: it runs on tick 5, and the period
    # counts from there.
    assert reads(Cadence(30, 10, 3, 60), 12, ok=set(range(12)), gated={3, 4}) == [0, 5, 8, 11]


def test_an_interrupted_read_counts_nothing() -> None:
    cadence = Cadence(10, 10, 1, 60)
    assert cadence.due() and cadence.start()  # and the read was interrupted: no verdict
    assert (cadence.failures, cadence.next_in_ticks) == (0, 1)
    assert cadence.due() and cadence.start()


def test_one_outage_starts_at_the_threshold_and_ends_on_the_next_success() -> None:
    cadence = Cadence(10, 10, 3, 60)
    starts: list[int] = []
    reads(cadence, 10, starts=starts)
    assert starts == [2]  # the third failure in a row, and no other
    assert cadence.outage
    assert cadence.succeeded()
    assert not cadence.outage and cadence.failures == 0
    assert not cadence.succeeded()  # one line when it clears, not one per success


def test_a_blip_below_the_threshold_is_no_outage() -> None:
    cadence = Cadence(10, 10, 3, 60)
    assert not cadence.failed() and not cadence.failed()
    assert not cadence.outage
    assert not cadence.succeeded()
    assert not any(cadence.failed() for _ in range(2))  # counted from zero again


def test_a_reload_lowering_the_threshold_starts_the_outage_on_the_next_failure() -> None:
    cadence = Cadence(10, 10, 10, 60)
    starts: list[int] = []
    assert reads(cadence, 5, starts=starts) == [0, 1, 2, 3, 4]
    cadence.configure(10, 10, 3, 60)
    # The sixth failure is past the new threshold: ">=", not "==", starts the outage.
    assert reads(cadence, 14, starts=starts) == [0, 6, 12]
    assert starts == [0]


def test_a_reload_raising_the_threshold_mid_outage_does_not_start_another() -> None:
    cadence = Cadence(10, 10, 2, 60)
    starts: list[int] = []
    assert reads(cadence, 4, starts=starts) == [0, 1, 3]
    cadence.configure(10, 10, 6, 60)
    cadence.expedite()
    # Failures 4 and 5 are under the new threshold: the next tick each; then the backoff.
    assert reads(cadence, 10, starts=starts) == [0, 1, 2, 4, 8]
    assert starts == [1] and cadence.outage


def test_a_reload_cuts_the_gap_to_the_new_cap_and_the_period() -> None:
    cadence = Cadence(10, 10, 3, 60)
    reads(cadence, 9)  # failures at 0, 1, 2, 4 and 8: the gap is now 6 ticks
    assert (cadence.failures, cadence.next_in_ticks) == (5, 6)
    cadence.configure(10, 10, 3, 20)  # cap 2 ticks
    assert cadence.next_in_ticks == 2
    slow = Cadence(60, 10, 3, 600)
    assert slow.due() and slow.start()
    assert slow.next_in_ticks == 6
    slow.configure(20, 10, 3, 600)  # every 2 ticks now
    assert slow.next_in_ticks == 2


def test_expedite_reads_on_the_next_tick_whatever_was_counted() -> None:
    cadence = Cadence(60, 10, 1, 600)
    assert cadence.due() and cadence.start()
    cadence.failed()
    assert cadence.next_in_ticks == 12  # 2 reads of 6 ticks
    cadence.expedite()
    assert cadence.next_in_ticks == 1
    assert cadence.due() and cadence.start()
    assert cadence.outage and cadence.failures == 1  # the outage survives a "look now"


@pytest.mark.parametrize("after", [0, -1])
def test_a_threshold_below_one_failure_is_refused(after: int) -> None:
    with pytest.raises(ValueError, match="backoff needs after >= 1"):
        Cadence(10, 10, after, 60)
    with pytest.raises(ValueError, match="backoff needs after >= 1"):
        Cadence(10, 10, 3, 60).configure(10, 10, after, 60)
