"""Retired memory pages: the limit and a fast rise (pure).

GPUs before Ampere (Kepler to Volta and Turing, V100 the common one in fleets) retire a page
of frame-buffer memory once it has had one double-bit ECC error or two single-bit ones on the
same address (NVIDIA, "Dynamic Page Retirement",
docs.nvidia.com/deploy/dynamic-page-retirement).  nvidia-smi counts them in
``retired_pages.single_bit_ecc.count`` and ``retired_pages.double_bit.count``; they live in the
infoROM, so they only ever grow on one board.  Ampere and later remap rows instead and read
``[N/A]`` there: their remap rules (``row_remap_*``) apply, these never do.

- ``retired_pages_limit`` (critical, ``drain_and_rma``): :data:`LIMIT` pages retired, both
  causes together, NVIDIA's maximum ("a maximum of 64 page retirements", its memory-error
  documentation): the next bad cell cannot be retired.  The driver saying a retirement failed
  is Xid 64 ("Dynamic Page Retirement: Fatal error, unable to retire page", the same doc),
  critical and ``drain_and_rma`` in the Xid catalog already.
- ``retired_pages_rising`` (warning, ``drain_and_rma``): more than :data:`RISE_PAGES` new
  retirements within :data:`RISE_WINDOW` (30 days) seen by this agent.  NVIDIA's page names no
  rate; the figure is the check Azure's HPC images run on their V100 and A100 fleets
  (Azure/azurehpc#752, ``RETIRED_PAGES_30D_THRESHOLD = 5`` over ``RP_DAYS = 30``): a board
  that retires pages this fast reaches the limit within months, so its replacement is planned
  before it fails a job.  A count already there when the agent first reads the GPU is no rise
  (an old board with 40 pages retired over years is not sick now); the agent keeps the rise in
  memory, so a restart starts it over.
"""

from __future__ import annotations

from collections import deque

from gpuagent.health import CRITICAL, WARNING
from gpuagent.views import Finding, Row

__all__ = ["FIELDS", "LIMIT", "RISE_PAGES", "RISE_WINDOW", "PageRetirements", "retired"]

# The query's fields, in nvidia-smi's names: dropped like every field a driver lacks.
FIELDS = ("retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count")
LIMIT = 64
RISE_PAGES = 5
RISE_WINDOW = 30 * 24 * 3600.0


def retired(row: Row) -> tuple[int, int] | None:
    """The single-bit and double-bit retired page counts of ``row``; ``None`` where the GPU
    does not count them (``[N/A]`` on row-remapping GPUs, a driver without the fields)."""
    sbe, dbe = (row.get(f) for f in FIELDS)
    if not isinstance(sbe, int) or not isinstance(dbe, int):
        return None
    return sbe, dbe


def _limit(sbe: int, dbe: int) -> Finding | None:
    if sbe + dbe < LIMIT:
        return None
    return Finding(
        "retired_pages_limit",
        CRITICAL,
        "drain_and_rma",
        f"{sbe + dbe} memory pages retired ({sbe} single-bit, {dbe} double-bit), NVIDIA's "
        f"limit of {LIMIT}: no further page can be retired",
        ends="when nvidia-smi counts fewer retired pages (a new GPU)",
    )


class PageRetirements:
    """Each GPU's retired page count over the last :data:`RISE_WINDOW` seconds.

    Feed :meth:`add` with each row of each probe (its slot and the monotonic time), then
    :meth:`findings` gives ``retired_pages_limit`` and ``retired_pages_rising`` by slot.  Only
    the times the count changed are kept (and at most one before the window), so a GPU costs
    a few entries however long the agent runs.  A count that drops is another board in the
    slot: its history starts over.
    """

    def __init__(self, window: float = RISE_WINDOW, pages: int = RISE_PAGES) -> None:
        self.window = window
        self.pages = pages
        # By slot: (monotonic time, total) at first sight and at each change, oldest first.
        self._seen: dict[str, deque[tuple[float, int]]] = {}
        self._found: dict[str, list[Finding]] = {}

    def add(self, slot: str, now: float, row: Row) -> None:
        """One sample of the GPU in ``slot`` at monotonic time ``now`` (s)."""
        counts = retired(row)
        if counts is None:
            self._seen.pop(slot, None)
            self._found.pop(slot, None)
            return
        total = sum(counts)
        seen = self._seen.setdefault(slot, deque())
        if seen and total < seen[-1][1]:
            seen.clear()
        if not seen or total != seen[-1][1]:
            seen.append((now, total))
        # Keep the newest change at or before the window's start: the count the window
        # starts from.
        while len(seen) > 1 and seen[1][0] <= now - self.window:
            seen.popleft()
        found = [f for f in (_limit(*counts), self._rise(seen, total)) if f is not None]
        self._found[slot] = found

    def findings(self, slots: set[str]) -> dict[str, list[Finding]]:
        """The findings of each GPU of ``slots`` (those this answer reported); the others
        are forgotten."""
        for gone in set(self._seen) - slots:
            del self._seen[gone]
            self._found.pop(gone, None)
        return {slot: list(found) for slot, found in self._found.items() if found}

    def forget(self) -> None:
        """nvidia-smi cannot be asked: what it said no longer holds."""
        self._seen.clear()
        self._found.clear()

    def _rise(self, seen: deque[tuple[float, int]], total: int) -> Finding | None:
        if total >= LIMIT:
            return None  # the limit says more
        rise = total - seen[0][1]
        if rise <= self.pages:
            return None
        days = self.window / 86400
        return Finding(
            "retired_pages_rising",
            WARNING,
            "drain_and_rma",
            f"{rise} memory pages retired within {days:g} days ({total} of NVIDIA's limit of "
            f"{LIMIT}): plan to replace the GPU",
            ends=f"when no more than {self.pages} pages were retired in the last {days:g} days",
        )
