"""One GPU's identity and memory health as ``nvidia-smi -q -i SLOT`` prints them (pure).

``-q`` is a tree of ``Key : Value`` lines, each section a line of its own with its keys
indented under it (real captures: tests/data/corpus/nvlink/query-q-*; the column of the
colons differs between drivers).  Read here, under the ``GPU 00000000:18:00.0`` line:

- the board: ``Product Name``, ``Serial Number``, ``GPU UUID``, ``VBIOS Version``, ``Board
  Part Number``;
- ``Remapped Rows`` (Ampere and later): ``Correctable Error``, ``Uncorrectable Error``,
  ``Pending``, ``Remapping Failure Occurred`` and the ``Bank Remap Availability Histogram``
  (``Max`` … ``None : 0 bank(s)``: how many banks have all, some or none of their spare
  rows left);
- ``Retired Pages`` (before Ampere): ``Single Bit ECC``, ``Double Bit ECC`` and ``Pending
  Page Blacklist`` (``Pending`` in older drivers); ``N/A`` on a GPU that remaps rows;
- ``SRAM Threshold Exceeded`` (under ``ECC Errors``/``Aggregate`` since driver 535), or
  any key of ``ECC Errors`` that names an SRAM threshold.

``N/A`` and a key the driver does not print are None: not reported, never "no".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuagent.sources.probe.qtext import gpu_lines
from gpuagent.untrusted import capped, whole

__all__ = ["HISTOGRAM", "Board", "parse"]

# The histogram's buckets, most spare rows left first.
HISTOGRAM = ("Max", "High", "Partial", "Low", "None")
_IDENTITY = {
    "Product Name": "name",
    "Serial Number": "serial",
    "GPU UUID": "uuid",
    "VBIOS Version": "vbios",
    "Board Part Number": "board_part_number",
}
_REMAPS = "Remapped Rows"
_PAGES = "Retired Pages"
_ECC = "ECC Errors"


@dataclass(frozen=True)
class Board:
    """What ``-q`` says of one GPU (None: not reported).  ``identity`` by
    :data:`_IDENTITY`'s names (``name``, ``serial``, ``uuid``, ``vbios``,
    ``board_part_number``); ``remaps_correctable`` and ``remaps_uncorrectable`` rows remapped;
    ``banks`` the histogram's banks by bucket (:data:`HISTOGRAM`); ``pages_sbe`` and
    ``pages_dbe`` pages retired; ``sram_threshold_exceeded`` the driver's flag."""

    slot: str
    identity: dict[str, str] = field(default_factory=dict)
    remaps_correctable: int | None = None
    remaps_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    banks: dict[str, int] = field(default_factory=dict)
    pages_sbe: int | None = None
    pages_dbe: int | None = None
    pages_pending: bool | None = None
    sram_threshold_exceeded: bool | None = None


def parse(text: str) -> Board:
    """The first GPU of ``-q`` output ``text``.  Raises ValueError where the text names no
    GPU (``GPU 00000000:18:00.0``) or a count or flag read is not one (naming the key)."""
    values: dict[tuple[str, ...], str] = {}
    slot: str | None = None
    stack: list[tuple[int, str]] = []
    for under, indent, stripped in gpu_lines(text):
        if not under:
            continue  # the header before the first GPU
        if slot not in (None, under):
            break  # the next GPU's: asked for one, read one
        slot = under
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key, colon, value = stripped.partition(":")
        if not colon or not value.strip():
            stack.append((indent, stripped))  # a section's line ("Remapped Rows")
            continue
        path = (*(name for _, name in stack), key.strip())
        values[path] = value.strip()
    if slot is None:
        raise ValueError("no GPU in the answer (no 'GPU 00000000:18:00.0' line)")
    return _board(slot, values)


def _board(slot: str, values: dict[tuple[str, ...], str]) -> Board:
    identity = {name: capped(v) for key, name in _IDENTITY.items() if (v := _given(values, (key,)))}
    banks: dict[str, int] = {}
    for bucket in HISTOGRAM:
        got = _count(values, (_REMAPS, "Bank Remap Availability Histogram", bucket), "bank(s)")
        if got is not None:
            banks[bucket] = got
    pending = _flag(values, (_PAGES, "Pending Page Blacklist"))
    return Board(
        slot,
        identity,
        remaps_correctable=_count(values, (_REMAPS, "Correctable Error")),
        remaps_uncorrectable=_count(values, (_REMAPS, "Uncorrectable Error")),
        remap_pending=_flag(values, (_REMAPS, "Pending")),
        remap_failure=_flag(values, (_REMAPS, "Remapping Failure Occurred")),
        banks=banks,
        pages_sbe=_count(values, (_PAGES, "Single Bit ECC")),
        pages_dbe=_count(values, (_PAGES, "Double Bit ECC")),
        pages_pending=pending if pending is not None else _flag(values, (_PAGES, "Pending")),
        sram_threshold_exceeded=_sram(values),
    )


def _given(values: dict[tuple[str, ...], str], path: tuple[str, ...]) -> str | None:
    """The value at ``path``; None where absent or ``N/A`` (or another bracketed word)."""
    value = values.get(path)
    if value is None or value in ("N/A", "Not Supported", "Unknown") or value.startswith("["):
        return None
    return value


def _count(values: dict[tuple[str, ...], str], path: tuple[str, ...], unit: str = "") -> int | None:
    value = _given(values, path)
    if value is None:
        return None
    digits = value.removesuffix(unit).strip() if unit else value
    got = whole(digits, 10)
    if got is None:
        raise ValueError(f"{' / '.join(path)}: not a count: {capped(value, 40)!r}")
    return got


def _flag(values: dict[tuple[str, ...], str], path: tuple[str, ...]) -> bool | None:
    value = _given(values, path)
    if value is None:
        return None
    if value not in ("Yes", "No"):
        raise ValueError(f"{' / '.join(path)}: not Yes or No: {capped(value, 40)!r}")
    return value == "Yes"


def _sram(values: dict[tuple[str, ...], str]) -> bool | None:
    """The SRAM threshold flag: ``ECC Errors / Aggregate / SRAM Threshold Exceeded``, or
    another key under ``ECC Errors`` that names an SRAM threshold (a driver's other layout)."""
    for path in sorted(values):
        key = path[-1].lower()
        if path[0] == _ECC and key.startswith("sram") and "threshold" in key:
            return _flag(values, path)
    return None
