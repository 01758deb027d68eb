"""Retired memory pages (gpuagent.sources.probe.pages): NVIDIA's limit and a fast rise, on real
captures' rows.

The sick GPU is the one of google/cadvisor#2035 and Azure/azurehpc#752 that the issue reports:
a V100 with 3 single-bit and 61 double-bit retired pages, 64 in all.  No byte capture of its
answer is public; its counts are put into a real capture's row as nvidia-smi prints them (the
per-GPU override the fake nvidia-smi uses), the rest of the row as captured.
"""

from __future__ import annotations

import os

import pytest

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.probe import pages
from gpuagent.sources.probe.pages import LIMIT, RISE_PAGES, RISE_WINDOW, PageRetirements
from gpuagent.sources.probe.smi import FIELDS, parse
from gpuagent.views import Row
from tests import replay

# The newest capture of a GPU with page retirement (Turing: no row remapping), retired pages
# [N/A] there as on every GeForce: the V100's counts go into its row.
TURING = "rtx2080super-linux-driver465.27-query-gpu-115fields.csv"
SLOT = "0000:3b:00.0"
DAY = 86400.0


def row(name: str = TURING, **cells: str) -> Row:
    """The capture's first row, with ``cells`` (field: cell as nvidia-smi prints it)."""
    cap = replay.load(name)
    fields = tuple(f for f in FIELDS if replay.canonical(f) in cap.fields)
    stdout, _ = replay.answer(cap, list(fields), "csv,noheader,nounits", [SLOT], {SLOT: cells})
    (parsed,) = parse(stdout, fields)
    return parsed


def counts(sbe: int, dbe: int) -> Row:
    sbe_field, dbe_field = pages.FIELDS
    return row(**{sbe_field: str(sbe), dbe_field: str(dbe)})


def judge(window: PageRetirements, *samples: tuple[float, Row]) -> list[tuple[str, str, str]]:
    for now, r in samples:
        window.add(SLOT, now, r)
    return [(f.kind, f.severity, f.action) for f in window.findings({SLOT}).get(SLOT, [])]


def healthy_captures() -> list[str]:
    folder = os.path.join(replay.CORPUS, "csv")
    names = sorted(n for n in os.listdir(folder) if n.endswith("-all-fields.csv"))
    return [*names, TURING]


@pytest.mark.parametrize("name", healthy_captures())
def test_no_healthy_capture_says_anything(name: str) -> None:
    """Every capture of the corpus reads [N/A] for the counts (row remapping, GeForce): no
    count, no finding, whatever time passes."""
    r = row(name)
    assert pages.retired(r) is None
    assert judge(PageRetirements(), (0.0, r), (RISE_WINDOW, r)) == []


def test_the_v100_at_nvidias_limit_is_critical_drain_and_rma() -> None:
    window = PageRetirements()
    assert judge(window, (0.0, counts(3, 61))) == [
        ("retired_pages_limit", CRITICAL, "drain_and_rma")
    ]
    (f,) = window.findings({SLOT})[SLOT]
    assert f.message == (
        "64 memory pages retired (3 single-bit, 61 double-bit), NVIDIA's limit of 64: no "
        "further page can be retired"
    )
    assert f.ends == "when nvidia-smi counts fewer retired pages (a new GPU)"


def test_one_page_below_the_limit_is_no_problem_at_first_sight() -> None:
    assert judge(PageRetirements(), (0.0, counts(3, LIMIT - 4))) == []


def test_a_count_there_at_start_is_no_rise() -> None:
    window = PageRetirements()
    assert judge(window, (0.0, counts(0, 40)), (DAY, counts(0, 40))) == []


def test_many_new_retirements_within_30_days_warn_before_the_limit() -> None:
    window = PageRetirements()
    assert judge(window, (0.0, counts(1, 2)), (DAY, counts(2, 2 + RISE_PAGES - 1))) == []
    assert judge(window, (2 * DAY, counts(2, 2 + RISE_PAGES))) == [
        ("retired_pages_rising", WARNING, "drain_and_rma")
    ]
    (f,) = window.findings({SLOT})[SLOT]
    assert f.message == (
        "6 memory pages retired within 30 days (9 of NVIDIA's limit of 64): plan to replace the GPU"
    )
    # The limit says more than the rise: one problem, the critical one.
    assert judge(window, (3 * DAY, counts(3, 61))) == [
        ("retired_pages_limit", CRITICAL, "drain_and_rma")
    ]


def test_the_rise_ends_when_the_window_has_passed_it() -> None:
    window = PageRetirements()
    judge(window, (0.0, counts(0, 0)), (DAY, counts(0, 6)))
    assert judge(window, (DAY + RISE_WINDOW - 1, counts(0, 6))) != []
    assert judge(window, (DAY + RISE_WINDOW, counts(0, 6))) == []


def test_the_same_rise_spread_over_more_than_30_days_is_none() -> None:
    window = PageRetirements()
    samples = [(i * 7 * DAY, counts(0, i)) for i in range(10)]
    assert judge(window, *samples) == []


def test_a_lower_count_is_another_board_and_starts_over() -> None:
    window = PageRetirements()
    judge(window, (0.0, counts(0, 0)), (DAY, counts(0, 10)))
    assert judge(window, (2 * DAY, counts(0, 1))) == []
    assert judge(window, (3 * DAY, counts(0, 6))) == []


def test_a_gpu_no_longer_answered_for_and_an_outage_are_forgotten() -> None:
    window = PageRetirements()
    judge(window, (0.0, counts(3, 61)))
    assert window.findings(set()) == {}
    judge(window, (1.0, counts(3, 61)))
    window.forget()
    assert window.findings({SLOT}) == {}


def test_a_row_remapping_gpu_keeps_its_remap_rules_only() -> None:
    """An H100 reads [N/A] for retired pages: its remap failure is the remap rule's."""
    from gpuagent.sources.probe import rules  # noqa: PLC0415

    r = row("h100-80gb-hbm3-linux-driver590.48.01-load-query-gpu-all-fields.csv")
    assert judge(PageRetirements(), (0.0, r)) == []
    r["remapped_rows.failure"] = "Yes"
    assert [f.kind for f in rules.row_findings(r)] == ["row_remap_failed"]


def test_the_query_asks_for_the_counts() -> None:
    assert set(pages.FIELDS) <= set(FIELDS)
