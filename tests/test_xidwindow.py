"""Count-in-window escalation: the rule, its keeper, the counter with the corpus's records, and
the agent over a real journal of them (make-test-journal) on the fake host."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuagent.configkeys import MAX_XID_COUNT, Override
from gpuagent.logs import Event
from gpuagent.schema import State
from gpuagent.sources.kernel.xid import Xid, assess
from gpuagent.sources.kernel.xidcount import XidCounter
from gpuagent.sources.kernel.xidwindow import Bursts, burst, rules
from tests import xidcorpus
from tests.conftest import Host
from tests.journalfeed import this_boot
from tests.test_clear import clear_entry, entry
from tests.test_kernel import running_before
from tests.test_kernlog import append, corpus_text, export_entry, make

__all__ = ["make"]  # the fixture

# 3 within 10 minutes of an Xid 31 on one GPU (eks-node-monitoring-agent#272, NVSentinel#271).
ESCALATE = Override("critical", "reset_gpu", 3, 600.0)
TABLE = {31: ESCALATE}
DEVICE, OTHER = "0000:01:00", "0000:02:00"


@pytest.mark.parametrize(
    ("times", "count", "window", "end"),
    [
        ([], 3, 600.0, None),
        ([0.0, 10.0], 3, 600.0, None),  # count - 1 records
        ([0.0, 10.0, 600.0], 3, 600.0, 2),  # exactly count, spanning exactly the window
        ([0.0, 10.0, 600.001], 3, 600.0, None),  # count spread over more than the window
        ([0.0, 700.0, 800.0, 900.0], 3, 600.0, 3),  # the latest three make it
        ([0.0, 700.0, 800.0, 1400.0, 1500.0], 3, 600.0, None),  # every three span more
        ([0.0, 700.0, 800.0, 1300.0, 1500.0], 3, 600.0, 3),
        ([0.0, 5.0], 2, 5.0, 1),
        ([100.0, 50.0, 90.0], 3, 50.0, 2),  # a clock stepped back: the span is max - min
        ([100.0, 40.0, 90.0], 3, 50.0, None),
    ],
)
def test_burst(times: list[float], count: int, window: float, end: int | None) -> None:
    assert burst(times, count, window) == end


@given(
    st.lists(st.floats(0, 10_000), max_size=30),
    st.integers(2, 6),
    st.floats(1, 2_000),
)
def test_bursts_fed_one_by_one_agree_with_the_rule_on_them_all(
    times: list[float], count: int, window: float
) -> None:
    bursts = Bursts({31: Override("critical", repeats=count, window=window)})
    for at in times:
        bursts.add(DEVICE, 31, at)
    end = burst(times, count, window)
    assert bursts.reached(DEVICE, 31) == (None if end is None else times[end])


def test_only_one_gpus_records_of_one_code_count_together() -> None:
    bursts = Bursts({31: ESCALATE, 13: Override(action="reset_gpu")})
    for at, device, code in [
        (0.0, DEVICE, 31),
        (1.0, OTHER, 31),  # another GPU
        (2.0, DEVICE, 13),  # another code, and one without a count
        (3.0, DEVICE, 43),  # a code the table leaves alone
        (4.0, DEVICE, 31),
    ]:
        bursts.add(device, code, at)
    assert bursts.reached(DEVICE, 31) is None
    assert bursts.entry(TABLE, DEVICE, 31) is None
    assert bursts.entry({13: Override(action="reset_gpu")}, DEVICE, 13) == Override(
        action="reset_gpu"
    )  # an entry without a count applies from the first record
    bursts.add(DEVICE, 31, 5.0)
    assert bursts.reached(DEVICE, 31) == 5.0
    assert bursts.entry(TABLE, DEVICE, 31) == ESCALATE
    assert bursts.reached(OTHER, 31) is None
    # Reached, it stays so however long the records then stop.
    bursts.add(DEVICE, 31, 100_000.0)
    assert bursts.reached(DEVICE, 31) == 5.0


def feed(bursts: Bursts, *times: float, device: str = DEVICE) -> float | None:
    """Xid 31 records of ``device`` at ``times``; when it reached its count."""
    for at in times:
        bursts.add(device, 31, at)
    return bursts.reached(device, 31)


def test_a_clear_starts_the_gpus_counts_again() -> None:
    bursts = Bursts(TABLE)
    assert feed(bursts, 0.0, 1.0, 2.0) == feed(bursts, 0.0, 1.0, 2.0, device=OTHER) == 2.0
    bursts.clear(DEVICE)
    assert (bursts.reached(DEVICE, 31), bursts.reached(OTHER, 31)) == (None, 2.0)
    assert feed(bursts, 3.0, 4.0) is None  # the records before the clear do not count
    assert feed(bursts, 5.0) == 5.0


def test_a_reload_judges_a_changed_rule_on_the_records_held() -> None:
    bursts = Bursts(TABLE)
    assert feed(bursts, 0.0, 300.0, 700.0) is None
    bursts.reload({31: Override("critical", repeats=3, window=700.0)})
    assert bursts.reached(DEVICE, 31) == 700.0
    bursts.reload({31: Override("critical", repeats=4, window=700.0)})
    assert bursts.reached(DEVICE, 31) is None
    bursts.reload({31: Override("critical")})  # no count: nothing held any more
    assert rules({31: Override("critical")}) == {} and bursts.rules == {}
    bursts.reload(TABLE)
    assert feed(bursts, 800.0) is None  # counts from the reload on


def test_a_flood_holds_the_latest_records_only() -> None:
    bursts = Bursts({31: Override("critical", repeats=MAX_XID_COUNT, window=1.0)})
    for n in range(MAX_XID_COUNT * 3):
        bursts.add(DEVICE, 31, float(n))
    assert len(bursts._times[DEVICE, 31]) == MAX_XID_COUNT


def test_one_record_never_reaches_a_count() -> None:
    xid = Xid(DEVICE, 31, "Ch 00000013, engmask 00000101, intr 10000000")
    assert assess(xid, TABLE) == assess(xid)
    assert assess(xid, {31: Override("critical")}).severity == "critical"


# The corpus's three Xid 31 records of one GPU, 170.05, 170.07 and 391.16 s into the boot.
ENGMASK = "xid-31-driver352-engmask-no-pid"


def counter(table: dict[int, Override], records: int = 3) -> XidCounter:
    c = XidCounter(table)
    times = (170.053881, 170.074502, 391.163575)
    for at, message in list(zip(times, xidcorpus.messages(ENGMASK), strict=True))[:records]:
        c.add(at, message)
    return c


def severities(c: XidCounter) -> dict[str, list[tuple[str, str]]]:
    return {s: [(f.severity, f.action) for f in fs] for s, fs in c.findings([]).items()}


def test_the_corpus_records_escalate_at_the_count_within_the_window() -> None:
    assert severities(counter(TABLE)) == {"0000:01:00.0": [("critical", "reset_gpu")]}
    (found,) = counter(TABLE).findings([])["0000:01:00.0"]
    assert found.message.endswith("(3 within 600 s, as this site's [xid] table says)")
    assert counter(TABLE).counts([])["0000:01:00.0", 31].info.severity == "critical"
    # Two records, or three over more than the window: the catalog's meaning (counted only).
    assert severities(counter(TABLE, records=2)) == {}
    assert severities(counter({31: Override("critical", "reset_gpu", 3, 200.0)})) == {}
    assert counter(TABLE, records=2).counts([])["0000:01:00.0", 31].info.severity == "none"


def test_a_clear_of_the_gpus_xids_resets_its_count() -> None:
    c = counter(TABLE)
    c.clear("0000:01:00.0", ("xid",))
    assert severities(c) == {}
    assert c.counts([])["0000:01:00.0", 31].info.severity == "none"
    for at in (400.0, 401.0):
        c.add(at, xidcorpus.messages(ENGMASK)[0])
    assert severities(c) == {}
    c.add(402.0, xidcorpus.messages(ENGMASK)[0])
    assert severities(c) == {"0000:01:00.0": [("critical", "reset_gpu")]}


# The same records on the fake host's first GPU, in a real journal.
SLOT = "0000:18:00.0"
JOURNAL = corpus_text(ENGMASK).replace("0000:01:00", "0000:18:00")
LATER = 1_700_001_000  # s: after every record make-test-journal writes


def xid_31(at: float) -> bytes:
    """The corpus's first Xid 31 record again, from the kernel at ``at``."""
    message = xidcorpus.messages(ENGMASK)[0].replace("0000:01:00", "0000:18:00")
    return export_entry(
        [
            ("__REALTIME_TIMESTAMP", str(int(at * 1e6)).encode()),
            ("__MONOTONIC_TIMESTAMP", str(int((at - 1_699_990_000) * 1e6)).encode()),
            ("_BOOT_ID", this_boot().encode()),
            ("_TRANSPORT", b"kernel"),
            ("MESSAGE", message.encode()),
        ]
    )


def problems(state: State) -> list[tuple[str, str, int]]:
    return [(p["severity"], p["action"], p.get("xid", 0)) for p in entry(state, SLOT)["problems"]]


def test_count_in_window_on_a_real_journal(host: Host, make: Any) -> None:
    journal = make(JOURNAL)
    host.make_agent(journal_directory=journal, xid=TABLE)
    st = host.tick().state
    assert problems(st) == [("critical", "reset_gpu", 31)]
    (problem,) = entry(st, SLOT)["problems"]
    assert "3 within 600 s" in problem["message"]
    # Over more than the window, or one record short: the catalog's (counted only).
    host.make_agent(journal_directory=journal, xid={31: ESCALATE._replace(window=200.0)})
    assert problems(host.tick().state) == []
    short = make("\n".join(JOURNAL.splitlines()[:2]) + "\n", "short")
    host.make_agent(journal_directory=short, xid=TABLE)
    st = host.tick().state
    assert problems(st) == [] and entry(st, SLOT)["xids"][0]["count"] == 2


def test_a_clear_in_the_journal_resets_the_count(host: Host, make: Any) -> None:
    journal = make(JOURNAL)
    host.make_agent(journal_directory=journal, xid=TABLE)
    assert problems(host.tick().state) == [("critical", "reset_gpu", 31)]
    append(journal, clear_entry("0", LATER, slot=SLOT))
    append(journal, xid_31(LATER + 10))
    append(journal, xid_31(LATER + 20))
    assert problems(host.tick().state) == []
    append(journal, xid_31(LATER + 30))
    assert problems(host.tick().state) == [("critical", "reset_gpu", 31)]


def test_the_record_that_reaches_the_count_starts_the_problem_at_err(host: Host, make: Any) -> None:
    # Two of the corpus's records (170 s into the boot), then a third at 300 s, as it comes.
    journal = make("\n".join(JOURNAL.splitlines()[:2]) + "\n")
    running_before(host.make_agent(journal_directory=journal, xid=TABLE))
    assert problems(host.tick().state) == []
    (counted,) = host.events(Event.XID_COUNTED)
    assert counted.getMessage().endswith("(action: restart_app)")  # the catalog's, below it
    append(journal, xid_31(1_700_000_300))
    assert problems(host.tick().state) == [("critical", "reset_gpu", 31)]
    (line,) = host.events(Event.XID_PROBLEM)
    assert line.levelname == "ERROR"
    assert line.getMessage().startswith(f"GPU {SLOT}: critical xid: Xid 31 (GPU memory page fault)")
    assert (
        "(3 within 600 s, as this site's [xid] table says); action: reset_gpu" in line.getMessage()
    )
