"""A board's wear counters from nvidia-smi (pure): what only grows over its life.

``nvidia-smi --query-gpu=pci.bus_id,FIELD,... --format=csv,noheader,nounits``, one line a
GPU: ``00000000:18:00.0, 3, 0, [N/A], [N/A], 0``.  The fields (:data:`FIELDS`) live in the
board's infoROM, so they count over its life, not this boot: ``remapped_rows.correctable``
and ``remapped_rows.uncorrectable``, the rows remapped after correctable and uncorrectable
errors (Ampere and later; ``[N/A]`` before, and in MIG mode), the retired pages
``retired_pages.single_bit_ecc.count`` and ``retired_pages.double_bit.count`` (before Ampere;
``[N/A]`` after) and ``ecc.errors.uncorrected.aggregate.total`` (boards with ECC).  A count
a board does not offer is left out; a driver that rejects a field is asked without it
(:data:`FIELDS` order: the rest still count).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuagent.sources.bus.pciaddr import is_bus_id, sysfs_slot
from gpuagent.sources.probe.smi import beside_rows

__all__ = ["ANSWERS", "FIELDS", "LABELS", "Counters", "args", "count", "parse", "said"]

# nvidia-smi's field: the counter's name, a field of its own in the wear record (upper case).
FIELDS: dict[str, str] = {
    "remapped_rows.correctable": "remapped_rows_correctable",
    "remapped_rows.uncorrectable": "remapped_rows_uncorrectable",
    "retired_pages.single_bit_ecc.count": "retired_pages_sbe",
    "retired_pages.double_bit.count": "retired_pages_dbe",
    "ecc.errors.uncorrected.aggregate.total": "ecc_uncorrected_aggregate",
}
# Each counter for a person, in FIELDS order.
LABELS: dict[str, str] = {
    "remapped_rows_correctable": "rows remapped (correctable)",
    "remapped_rows_uncorrectable": "rows remapped (uncorrectable)",
    "retired_pages_sbe": "pages retired (single-bit)",
    "retired_pages_dbe": "pages retired (double-bit)",
    "ecc_uncorrected_aggregate": "uncorrected ECC errors (lifetime)",
}
# As the probe takes them: 14, the infoROM warning beside the rows; 15 and 255, one GPU's
# error beside the others' rows.
ANSWERS = frozenset({0, 14, 15, 255})
# A board's counters by name (:data:`FIELDS`' values), those it offers.
Counters = dict[str, int]
# A cell that is no count of the board's: none offered, or nvidia-smi's word for one it could
# not read this time (``[N/A]``, ``[Unknown Error]``, ``[GPU requires reset]`` …).
_MISSING = frozenset({"", "N/A", "Not Supported", "ERR!"})
# More digits than a 64-bit counter has is not nvidia-smi's.
_DIGITS = 20


def args(fields: Sequence[str]) -> tuple[str, ...]:
    """The command line's arguments asking for ``fields`` (of :data:`FIELDS`)."""
    return (f"--query-gpu=pci.bus_id,{','.join(fields)}", "--format=csv,noheader,nounits")


def parse(text: str, fields: Sequence[str]) -> dict[str, Counters]:
    """Each GPU's counters by PCI slot (sysfs form) from the answer to :func:`args`
    (``fields``); what nvidia-smi prints beside the rows is skipped, and a cell it could not
    read leaves that counter out.  Raises ValueError naming the first line that is not
    ``BUS_ID`` and one cell a field, or a GPU's cell that is no count, or for an answer
    without one row."""
    out: dict[str, Counters] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or beside_rows(line):
            continue
        bus_id, *cells = (c.strip() for c in line.split(","))
        if not is_bus_id(bus_id.lower()) or len(cells) != len(fields):
            raise ValueError(f"line {n} is not 'BUS_ID, {', '.join(fields)}': {line[:60]!r}")
        counts: Counters = {}
        for name, cell in zip(fields, cells, strict=True):
            if cell in _MISSING or cell.startswith("["):
                continue
            if (got := count(cell)) is None:
                raise ValueError(f"line {n} ({bus_id}): {name} is not a count: {cell[:20]!r}")
            counts[FIELDS[name]] = got
        out[sysfs_slot(bus_id)] = counts
    if not out:
        raise ValueError("no GPU's row in the answer")
    return out


def count(text: str) -> int | None:
    """``text`` as a counter's value (decimal digits), None where it is none."""
    if text.isascii() and text.isdigit() and len(text) <= _DIGITS:
        return int(text)
    return None


def said(counts: Counters) -> str:
    """The counters for a person: ``rows remapped (correctable) 3, ...``."""
    return ", ".join(f"{label} {counts[n]}" for n, label in LABELS.items() if n in counts)
