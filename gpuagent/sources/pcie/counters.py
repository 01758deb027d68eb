"""The AER counter files of the functions on the GPUs' paths (sysfs), read every tick.

Two small files a function (``aer_dev_fatal``, ``aer_dev_nonfatal``), raw ``os.read``; a
function without them (no AER capability, a kernel before 4.19, a VM) is not asked again
while it stays on a path.  A file is parsed only when its text changed, and one that cannot be
read or parsed is one line naming it (``SYSFS_PROBLEM``, once while it stays so); the rest of
the function's counts still count.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

from gpuagent.logs import Event, EventLog
from gpuagent.sources.pcie import aer

__all__ = ["CounterFiles", "Counters", "read_text"]

# Bytes of a counter file read: about 19 lines of at most ~30 characters.
_SIZE = 4096
# A function's counts by kind (``fatal``, ``nonfatal``), each by error type.
Counters = dict[str, dict[str, int]]


def read_text(path: str) -> str | None:
    """A sysfs file's text, or None where it does not exist; raises OSError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.read(fd, _SIZE).decode("ascii", "replace")
    finally:
        os.close(fd)


class CounterFiles:
    """The counter files of the functions under ``devices`` (``<sysfs>/bus/pci/devices``)
    that :meth:`arrange` names; ``read`` (:func:`read_text`) is injectable for tests."""

    def __init__(
        self, devices: str, log: EventLog, read: Callable[[str], str | None] = read_text
    ) -> None:
        self.devices = devices
        self.log = log
        self._read = read
        # Each function's files by kind; the functions without them.
        self._files: dict[str, tuple[tuple[str, str], ...]] = {}
        self._without: set[str] = set()
        # Each file's text as last read (None: not read), and the counts of its last text.
        self._texts: dict[str, str | None] = {}
        self._parsed: dict[str, tuple[str, dict[str, int] | None]] = {}
        # The files that could not be read or parsed, with the line that said so.
        self._bad: dict[str, str] = {}

    def arrange(self, functions: Iterable[str], new: Iterable[str] = ()) -> None:
        """Read the files of ``functions`` from now on; those of ``new`` (a path resolved
        afresh) are asked again even where they had none."""
        self._without.difference_update(new)
        self._files = {
            d: self._files.get(d)
            or tuple((kind, os.path.join(self.devices, d, name)) for kind, name in aer.FILES)
            for d in dict.fromkeys(functions)
        }

    def read(self) -> dict[str, tuple[str | None, ...]]:
        """Read every function's files: their texts by function (what a tick compares with
        the last one's; a function without files: none)."""
        return {d: self._read_function(d, files) for d, files in self._files.items()}

    def counts(self, functions: Iterable[str]) -> dict[str, Counters]:
        """The counts of ``functions`` (of :meth:`arrange`'s) as last read."""
        return {d: self._counts(self._files[d]) for d in functions}

    def _read_function(
        self, device: str, files: tuple[tuple[str, str], ...]
    ) -> tuple[str | None, ...]:
        if device in self._without:
            return ()
        out: list[str | None] = []
        for _, where in files:
            try:
                text = self._read(where)
            except OSError as e:
                self._problem(where, e)
                text = None
            else:
                if text is None:
                    self._without.add(device)
                    for _, gone in files:
                        self._texts.pop(gone, None)
                    return ()
            self._texts[where] = text
            out.append(text)
        return tuple(out)

    def _counts(self, files: tuple[tuple[str, str], ...]) -> Counters:
        out: Counters = {}
        for kind, where in files:
            text = self._texts.get(where)
            if text is None:
                continue
            last = self._parsed.get(where)
            if last is None or last[0] != text:
                try:
                    last = (text, aer.counters(text))
                    self._bad.pop(where, None)
                except ValueError as e:
                    self._problem(where, e)
                    last = (text, None)
                self._parsed[where] = last
            if last[1] is not None:
                out[kind] = last[1]
        return out

    def _problem(self, where: str, e: Exception) -> None:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        line = f"{where}: {why}; this device's PCIe errors are not counted"
        if self._bad.get(where) != line:
            self._bad[where] = line
            self.log(logging.ERROR, Event.SYSFS_PROBLEM, line)
