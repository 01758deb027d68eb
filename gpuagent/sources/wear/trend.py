"""Wear across boots: a counter that grew in each of the last two boots (pure).

A board records its wear counters (:mod:`gpuagent.sources.wear.counters`) at its first
answer each boot.  Its last three records (two boots it was recorded in before this one, and
this one) make two boots' growth; a counter that grew in both by more than its figure
(:data:`SERIES`) is the warning ``wear_rising`` (action ``drain_and_rma``: plan the board's
replacement), with the trend in its message, before the hard limits fire
(``row_remap_failed``, 64 pages retired):

- rows remapped after correctable errors: more than :data:`REMAPS_A_BOOT` (8) a boot.  Each
  memory bank has a fixed few reserved rows, and a bank with none left can remap no more
  (NVML's ``nvmlRowRemapperHistogramValues_t``: "None means that there are no reserved rows
  available"): a board that needs this many every boot is spending them, where a healthy one
  remaps a row now and then;
- rows remapped after uncorrectable errors, pages retired (single-bit and double-bit
  together) and the lifetime uncorrected ECC errors: any growth, boot after boot (a healthy
  board's stay where they are for months).

The warning holds through the boot whose record shows it, and is judged again at the next
boot's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuagent.health import WARNING
from gpuagent.views import Finding

__all__ = ["REMAPS_A_BOOT", "SERIES", "rising"]

REMAPS_A_BOOT = 8
# A series for a person, the counters it adds up, and the growth a boot must exceed.
SERIES: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("rows remapped (correctable)", ("remapped_rows_correctable",), REMAPS_A_BOOT),
    ("rows remapped (uncorrectable)", ("remapped_rows_uncorrectable",), 0),
    ("pages retired", ("retired_pages_sbe", "retired_pages_dbe"), 0),
    ("uncorrected ECC errors (lifetime)", ("ecc_uncorrected_aggregate",), 0),
)


def _total(counts: Mapping[str, int], names: tuple[str, ...]) -> int | None:
    if not all(n in counts for n in names):
        return None
    return sum(counts[n] for n in names)


def rising(boots: Sequence[Mapping[str, int]]) -> Finding | None:
    """``wear_rising`` where a series grew in each of the last two boots, else None;
    ``boots`` are the board's records, one a boot it was recorded in (a boot without the
    agent, or with the board elsewhere, has none), oldest first, this boot's last (fewer
    than three: no trend yet)."""
    if len(boots) < 3:
        return None
    grew: list[str] = []
    for label, names, more_than in SERIES:
        values = [_total(b, names) for b in boots[-3:]]
        if None in values:
            continue
        a, b, c = (v or 0 for v in values)
        if b - a > more_than and c - b > more_than:
            grew.append(f"{label} {a} -> {b} -> {c}")
    if not grew:
        return None
    return Finding(
        "wear_rising",
        WARNING,
        "drain_and_rma",
        f"wear grew in each of the last two boots it was recorded in: {'; '.join(grew)}: its "
        "memory is wearing out, plan to replace the GPU before the hard limits fire",
        ends="at the next boot whose growth is within the figures, or a new board",
    )
