"""nvidia-smi's loop output cut into samples (pure).

In loop mode nvidia-smi prints, every interval, one line per GPU: the GPU's row, or the line
saying why it could not answer for it (``Unable to determine the device handle for GPU
0000:3B:00.0: GPU is lost ...``), with no line between two samples.  A line that names a
GPU the sample under way already named begins the next sample; a sample is complete once
the next begins, or once it names as many GPUs as the last complete one did (a sample is not
held back one interval while the host is steady).  A line naming a GPU that a sample so
completed did not name, before any line of the next, is a GPU more than the last sample had
(one that came back): it is dropped, and the samples from then on are one GPU longer.  A
warning belongs to the sample it comes in; any other line that names no GPU ends it (the
parse refuses it).
"""

from __future__ import annotations

import csv

from gpuagent.sources.bus.pciaddr import is_bus_id, sysfs_slot
from gpuagent.sources.probe.smi import gpu_error_slot

__all__ = ["Blocks", "named"]


def named(line: str, bus_column: int | None) -> str | None:
    """The sysfs slot a loop line is about: its row's ``pci.bus_id`` (cell ``bus_column``),
    or the GPU of its error line; ``None`` for any other line."""
    slot = gpu_error_slot(line)
    if slot is not None or bus_column is None:
        return slot
    try:
        cells = next(csv.reader([line], skipinitialspace=True))
    except (csv.Error, StopIteration):
        return None
    if len(cells) <= bus_column:
        return None
    cell = cells[bus_column].strip().lower()
    return sysfs_slot(cell) if is_bus_id(cell) else None


class Blocks:
    """Cuts lines into samples; ``bus_column`` is the place of ``pci.bus_id`` in the query
    (``None``: not asked, then every line is one sample), ``expected`` the GPUs a sample names
    (the last answer's: rows and error lines)."""

    def __init__(self, bus_column: int | None, expected: int) -> None:
        self.bus_column = bus_column
        self.expected = expected
        self._lines: list[str] = []
        self._slots: list[str] = []
        # The GPUs of the last sample completed by its count (empty: the next began).
        self._counted: frozenset[str] = frozenset()

    @property
    def pending(self) -> tuple[str, ...]:
        """The lines of the sample under way (all a loop printed before it exited)."""
        return tuple(self._lines)

    def feed(self, lines: list[str]) -> list[list[str]]:
        """Take the next ``lines``; returns the samples they complete, oldest first."""
        done: list[list[str]] = []
        for line in lines:
            if not line.strip():
                continue
            slot = named(line, self.bus_column)
            if slot is not None:
                counted, self._counted = self._counted, frozenset()
                if not self._slots and counted and slot not in counted:
                    self.expected += 1
                    self._counted = counted | {slot}
                    continue
            if slot is not None and slot in self._slots:
                self.expected = len(self._slots)
                done.append(self._lines)
                self._lines, self._slots = [], []
            self._lines.append(line)
            if slot is not None:
                self._slots.append(slot)
            # A line that names no GPU and is no warning is what the parse will refuse: the
            # sample ends with it (a loop printing garbage fails now, not at its stall).
            garbage = slot is None and not line.startswith("WARNING")
            if self.bus_column is None or garbage or len(self._slots) >= self.expected:
                done.append(self._lines)
                self._counted = frozenset(self._slots)
                self._lines, self._slots = [], []
        return done
