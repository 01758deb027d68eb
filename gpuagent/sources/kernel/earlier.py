"""The earlier boots as a source of facts: read from the journal in slices, for recurrence.

At start the agent reads the kernel's records, its own problem lines and root's clears of the
boots before this one, within ``history_days``, a slice a tick (at most :data:`SLICE` s of
reading), into a :class:`~gpuagent.sources.kernel.recurrence.Recurrence`; it stops at this boot's
first entry.  Until the read is done nothing is escalated and the state's ``history`` says so; a
journal without earlier boots (a volatile one) is ``this boot only``, a fact, not an error.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gpuagent.health import CRITICAL
from gpuagent.sources.kernel import timeline
from gpuagent.sources.kernel.kernlog import journal_boot
from gpuagent.sources.kernel.recurrence import Hit, Recurrence, recurring
from gpuagent.views import Finding

__all__ = ["SLICE", "EarlierBoots", "entries"]

SLICE = 0.010
# What a slice keeps of its budget for what follows its last look at the clock (the entry
# in hand, closing a reader): the read stops this much before the budget.
MARGIN = 0.001
# Entries read between two reopenings of the journal: sd-journal keeps what it mapped, and a
# reader reopened at its cursor keeps the agent's RSS near its budget (as kernlog does).
CHUNK = 10_000
_CLEAR = {"MESSAGE_ID": "9c49e6436dd14aaea07c537ddc3d294c", "_UID": "0"}


# What the timeline reads of a kernel record; of the others, every field it reads.
_KERNEL = ("_BOOT_ID", "MESSAGE")
_OTHERS = tuple(f for f in timeline.FIELDS if f != "_TRANSPORT")


def entries(reader: Any) -> Iterator[tuple[float, dict[str, bytes]]]:
    """The reader's next entries as ``(time, fields)`` (the fields the timeline reads)."""
    while reader._next():
        yield reader._get_realtime() / 1e6, _fields(reader)


def _fields(reader: Any) -> dict[str, bytes]:
    # One fetch a field, and only those the timeline reads of the entry's kind: a kernel
    # record (nearly every entry) is three fetches, not thirteen (docs/performance.md).
    got: dict[str, bytes] = {}
    for name in ("_TRANSPORT", *_KERNEL):
        try:
            value = reader._get(name)
        except KeyError:
            continue
        got[name] = value if isinstance(value, bytes) else str(value).encode()
        if name == "_TRANSPORT" and got[name] != b"kernel":
            return _more(reader, got)
    return got


def _more(reader: Any, got: dict[str, bytes]) -> dict[str, bytes]:
    for name in _OTHERS:
        try:
            value = reader._get(name)
        except KeyError:
            continue
        got[name] = value if isinstance(value, bytes) else str(value).encode()
    return got


def _open(directory: str) -> Any:
    from systemd import journal  # noqa: PLC0415

    if directory:
        return journal.Reader(path=directory)
    return journal.Reader(flags=journal.LOCAL_ONLY | journal.SYSTEM_ONLY)


def _this_boot() -> str:
    from systemd import id128  # noqa: PLC0415

    return str(id128.get_boot().hex)


class EarlierBoots:
    """The earlier boots of the journal in ``directory`` (``""``: the system journal)."""

    def __init__(
        self,
        directory: str,
        days: int,
        needed: int,
        *,
        open_reader: Callable[[str], Any] = _open,
        this_boot: Callable[[], str] = _this_boot,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.recurrence = Recurrence(needed)
        # Each board's wear records by UUID (lower case): each boot's first, in journal order.
        self._wear: dict[str, dict[str, Mapping[str, int]]] = {}
        self._wore: dict[str, tuple[Mapping[str, int], ...]] | None = None
        self.boots: set[str] = set()
        self.done = False
        self._args = (directory, days)
        self._open_reader, self._this_boot, self._clock, self._wall = (
            open_reader,
            this_boot,
            clock,
            wall,
        )
        self._reader: Any = None
        self._this = ""
        self._boot = ""
        self._uuids: dict[str, str] = {}
        self._told: set[tuple[str, str, int]] = set()
        self._read = 0
        # Where a reader closed after CHUNK entries stopped: its successor is sought there,
        # and its first entry (the last one read) skipped.
        self._resume: str | None = None
        # The journal's size as the reader opened it, and the time (realtime us) of the last
        # entry read: a file dropped at damage shrinks the one, the other is where to go on.
        self._usage = 0
        self._last_at = 0
        self.damaged = 0

    @property
    def summary(self) -> str:
        """The state's ``history``: reading, this boot only, or how many earlier boots, and
        a damaged journal file met on the way (the read went on past it)."""
        if not self.done:
            return "reading earlier boots"
        n = len(self.boots)
        said = "this boot only" if n == 0 else f"{n} earlier boot{'s' if n > 1 else ''}"
        if self.damaged:
            said += (
                "; a damaged journal file was met: the entries after it were read from the "
                "journal's end (journalctl --verify names it), some may be missing"
            )
        return said

    def step(self, budget: float = SLICE) -> None:
        """Read on for at most ``budget`` seconds, opening the journal included (nothing once
        done).  The clock is read after every entry; a reader that has read :data:`CHUNK`
        entries is closed at its cursor, and the next slice reopens it there."""
        if self.done:
            return
        deadline = self._clock() + budget - MARGIN
        try:
            if self._reader is None:
                self._start()
            while self._clock() < deadline:
                if not self._reader._next():
                    self._read_past_damage()
                    break
                if self._resume is not None:
                    cursor, self._resume = self._resume, None
                    if self._reader.test_cursor(cursor):
                        continue  # seek_cursor lands on the entry already read
                self._last_at = self._reader._get_realtime()
                if not self._take(self._last_at / 1e6, _fields(self._reader)):
                    break
                self._read += 1
                if self._read % CHUNK == 0:
                    self._close_at_cursor()
                    return
            else:
                return  # the slice is spent
        except (OSError, ValueError, RuntimeError):
            pass  # what was read counts; the journal's trouble is the kernel source's to say
        self._finish()

    def _read_past_damage(self) -> None:
        """At the reader's end, where sd-journal dropped a file at damage on the way (the
        journal's size fell, and it says nothing): the earlier boots' entries after the last
        one read, taken from the journal's end backwards (the way past damage that sd-journal
        still reads: at most :data:`CHUNK` of them, the latest), then read in order.  Once a
        read; the summary says so."""
        if self.damaged or self._reader.get_usage() >= self._usage:
            return
        self.damaged = 1
        self._reader.close()
        self._reader = None
        self._start(tail=True)
        items: list[tuple[int, dict[str, bytes]]] = []
        steps = 0
        while len(items) < CHUNK and steps < 10 * CHUNK and self._reader._previous():
            steps += 1
            at = self._reader._get_realtime()
            if at <= self._last_at:
                break
            fields = _fields(self._reader)
            if fields.get("_BOOT_ID", b"").decode("ascii", "replace") != self._this:
                items.append((at, fields))
        for at, fields in reversed(items):
            self._take(at / 1e6, fields)

    def _close_at_cursor(self) -> None:
        self._resume = self._reader._get_cursor()
        self._reader.close()
        self._reader = None

    def _start(self, *, tail: bool = False) -> None:
        """Open the reader: at the journal's end (``tail``), else where the last one
        closed, else ``history_days`` back."""
        directory, days = self._args
        reader = self._open_reader(directory)
        self._usage = reader.get_usage()
        if not self._this:
            # The boot the kernel source reads as this one (kernlog.journal_boot).
            self._this = journal_boot(reader, self._this_boot(), system=not directory)
        reader.add_match(_TRANSPORT="kernel")
        reader.add_disjunction()
        reader.add_match(_SYSTEMD_UNIT=timeline.UNIT)
        reader.add_disjunction()
        reader.add_match(**_CLEAR)
        self._reader = reader
        if tail:
            reader.seek_tail()
        elif self._resume is not None:
            reader.seek_cursor(self._resume)
        else:
            reader.seek_realtime(max(self._wall() - days * 86400, 0.0))

    def _take(self, at: float, entry: Mapping[str, bytes]) -> bool:
        boot = entry.get("_BOOT_ID", b"").decode("ascii", "replace")
        if boot == self._this:
            return False  # this boot is the kernel source's
        if boot != self._boot:
            self._boot, self._uuids = boot, {}
        for s in timeline.steps(boot, at, entry, self._uuids, self._told):
            if s.event == "clear" and s.pci_slot and s.kind:
                self.recurrence.clear(at, s.pci_slot, s.kind)
            elif s.event == "board_replaced" and s.pci_slot:
                self.recurrence.swap(at, s.pci_slot)
            elif s.event == "wear" and s.uuid and s.wear:
                self._wear.setdefault(s.uuid.lower(), {}).setdefault(boot, s.wear)
            elif s.severity == CRITICAL and s.pci_slot and s.kind:
                if s.event == "problem_start" and s.kind == "xid":
                    continue  # counted from the kernel's own records
                self.recurrence.add(Hit(boot, at, s.pci_slot, s.uuid, s.kind, s.xid or 0))
        self.boots.add(boot)
        return True

    @property
    def wear(self) -> dict[str, tuple[Mapping[str, int], ...]] | None:
        """The earlier boots' wear records by board UUID (lower case), each boot's first,
        oldest first; None until the read is done."""
        if not self.done:
            return None
        if self._wore is None:
            self._wore = {u: tuple(by_boot.values()) for u, by_boot in self._wear.items()}
        return self._wore

    def _finish(self) -> None:
        self.done = True
        if self._reader is not None:
            with contextlib.suppress(OSError):
                self._reader.close()
            self._reader = None

    def escalate(
        self,
        findings: dict[str, list[Finding]],
        uuids: Mapping[str, str],
        cleared: Mapping[str, Any],
        swapped: Mapping[str, float] | None = None,
    ) -> dict[str, list[Finding]]:
        """Read on a slice, then this boot's ``findings`` (by slot) with the recurring ones
        escalated; ``cleared`` is this boot's clears by slot (they restart the count),
        ``swapped`` its board replacements (:func:`~.recurrence.swaps`)."""
        self.step()
        for slot, c in cleared.items():
            self.recurrence.clear(c.at, slot, c.kind)
        return recurring(findings, self.recurrence if self.done else None, uuids, swapped)
