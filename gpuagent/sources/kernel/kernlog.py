"""The kernel's records of this boot from the systemd journal, read without blocking.

On :meth:`KernelLog.poll`'s first call the journal is opened and read from this boot's first
kernel record (``_TRANSPORT=kernel``, ``_BOOT_ID`` of the running boot), so an agent restart
counts the same records again and nothing logged while it was down is missed; later calls
take only what was appended since, and return at once when nothing was.  Reading the system
journal takes membership of the ``systemd-journal`` group; ``/dev/kmsg`` is not used.

What it reads with them (the module loaders' records, root's clears) is
:mod:`.kernmatch`'s; "this boot" is :func:`~.journalboot.journal_boot`'s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuagent.sources.kernel.journalboot import (
    journal_boot,
    kernel_boot,
    last_is,
    open_reader,
    reason,
)
from gpuagent.sources.kernel.kernmatch import CLEARS, fields, match

__all__ = ["DAMAGE_HOLD", "START_CHUNK", "KernelLog"]

# Records read between two reopenings of the journal while the boot is read (see poll()).
START_CHUNK = 10_000

# How long a damaged journal file stays the agent's journal problem after it was last met (s):
# long enough to be seen, and it ends by itself once the damage is rotated and vacuumed away.
DAMAGE_HOLD = 3600.0

Sink = Callable[[float, str], None]
FieldSink = Callable[[float, dict[str, bytes]], None]


@dataclass(frozen=True)
class _Item:
    """One entry to hand on: to the sink at ``sink`` (0 kernel, 1 loaders, 2 clears), its
    realtime ``time`` (s) and its message (or, for a clear, its fields)."""

    sink: int
    time: float
    payload: Any


def _give(sinks: tuple[Sink, Sink | None, FieldSink | None], item: _Item) -> int:
    sink = sinks[item.sink]
    if sink is None:
        return 0
    sink(item.time, item.payload)
    return 1


class _NoFiles(Exception):
    """The journal opened, but without one file this process may read."""


class KernelLog:
    """This boot's kernel records from the journal in ``directory`` (``""``: the local system
    journal).

    :meth:`poll` never raises for a journal it cannot read: it hands over what it could and
    sets :attr:`error` to a one-line reason (``None`` while all is well); the next call tries
    again.  ``open_reader`` is injectable for tests; it returns a ``systemd.journal.Reader``.
    ``chunk`` is how many records the first read takes before it reopens the journal;
    ``clock`` (monotonic s) times a poll's ``budget``.
    """

    def __init__(
        self,
        directory: str = "",
        *,
        open_reader: Callable[[str], Any] = open_reader,
        chunk: int = START_CHUNK,
        also: Mapping[str, str] = CLEARS,
        kernel_boot: Callable[[], str] = kernel_boot,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self._clock = clock
        # Whether records are still to be read from the cursor on before the journal's end
        # (the boot, or what was logged while it could not be read), a budget at a time.
        self.reading = True
        # Records the reader open now has read since it was opened (see chunk).
        self._taken = 0
        # This boot's _BOOT_ID in the journal (journal_boot), found at the first open.
        self.boot: str | None = None
        self._kernel_boot = kernel_boot
        self.also = dict(also)
        self.chunk = chunk
        self.error: str | None = None
        self._open_reader = open_reader
        self._reader: Any = None
        # Where the last read stopped: a reopened journal goes on from there, not from the
        # boot's start, so no record is handed out twice.
        self._cursor: str | None = None
        # The reader's usage (bytes of the files it reads) when opened or last processed.
        self._usage = 0
        # The realtime stamp (us) of the entry at the cursor.
        self._last = -1
        # Until when (monotonic s) a damaged file is the journal's problem.
        self._damaged = -float("inf")

    @property
    def where(self) -> str:
        """The journal's name for messages: its directory, or ``the system journal``."""
        return self.directory or "the system journal"

    def _open(self, *, tail: bool = False) -> Any:
        """A reader matched and placed after what was read; with ``tail``, placed from the
        journal's end where the last entry is the one read last (no bisection to the cursor:
        it pages in entry arrays all over the files, about 1 MiB of RSS at 100,000 records)."""
        reader = self._open_reader(self.directory)
        # sd-journal skips the files it may not read: none left is how a missing group
        # membership (or a host without a journal) shows.
        if not reader.get_usage():
            reader.close()
            raise _NoFiles(
                "no journal file this process may read "
                "(is it in the systemd-journal group, and is systemd-journald running?)"
            )
        try:
            if self.boot is None:
                mine = self._kernel_boot()
                self.boot = journal_boot(reader, mine, system=not self.directory)
            match(reader, self.also, self.boot)
            # sd-journal watches the files only once its fd exists: ask for it before reading,
            # or what is appended while the boot is read could go unnoticed.
            reader.fileno()
            if self._cursor is None:
                reader.seek_head()
            elif not (tail and last_is(reader, self._cursor)):
                reader.seek_cursor(self._cursor)
        except BaseException:
            reader.close()
            raise
        return reader

    def poll(
        self,
        sink: Sink,
        loaders: Sink | None = None,
        other: FieldSink | None = None,
        budget: float | None = None,
    ) -> int:
        """Hand each kernel record logged since the last call (on the first: the whole boot)
        to ``sink(time, message)``: ``time`` is its ``__REALTIME_TIMESTAMP`` in s since the
        epoch, ``message`` its whole ``MESSAGE`` (newlines kept, bytes that are not UTF-8
        replaced).  The module loaders' records (:data:`LOADERS`) go to ``loaders`` the same
        way, never to ``sink``; without ``loaders`` they are skipped.  Each entry matching
        ``also`` (root's clears), in order among them, goes to ``other(time, fields)`` (the
        fields it has of :data:`~.kernmatch.FIELDS`, as bytes), never to
        the others.  Returns how many records it handed over (to any).

        With ``budget`` (s) it stops once that much time has passed, the clock read after each
        record; :attr:`reading` then says whether more is left before the journal's end, which
        the next call reads on from.  Without it, it reads to the end."""
        count = 0
        sinks = (sink, loaders, other)
        deadline = None if budget is None else self._clock() + budget
        try:
            if self._reader is None:
                self._reader, self._taken, self.reading = self._open(), 0, True
                self._usage = self._reader.get_usage()
            if self.reading:
                count = self._read_on(sinks, deadline)
            else:
                # Drains the inotify events (files rotated, appended to).  The read below is
                # cheap enough (< 1 us) to do even when nothing changed, which keeps journals
                # whose changes cannot be watched (network file systems) correct.
                self._reader.process()
                self._usage = self._reader.get_usage()
                count = self._drain(self._reader, sinks)[0]
                if self._lost_a_file(self._reader):
                    count += self._salvage(sinks)
        except (OSError, ValueError, RuntimeError, _NoFiles) as e:
            self.close()
            self.error = f"{self.where}: cannot read: {reason(e)}"
            return 0
        self.error = self.damage
        return count

    @property
    def damage(self) -> str | None:
        """While a damaged journal file was met in the last DAMAGE_HOLD s: what that means."""
        if self._clock() >= self._damaged:
            return None
        return (
            f"{self.where}: a journal file is damaged (journalctl --verify names it): the "
            "records after the damage were read from the journal's end, some before it may "
            "be missed"
        )

    def _read_on(
        self, sinks: tuple[Sink, Sink | None, FieldSink | None], deadline: float | None
    ) -> int:
        # Reading maps (and pages in) the journal as it goes, and sd-journal keeps what it
        # mapped: a long read a chunk at a time, each by a reader reopened at the cursor,
        # keeps the agent's RSS near what later polls need (the tail).
        count = 0
        while True:
            got, ended = self._drain(self._reader, sinks, self.chunk - self._taken, deadline)
            count += got
            self._taken += got
            if ended and self._lost_a_file(self._reader):
                count += self._salvage(sinks)
                self._taken, self.reading = 0, False
                return count
            if ended or self._taken >= self.chunk:
                self.close()
                # After the last chunk, from the tail: later polls read only there.
                self._reader, self._taken, self.reading = self._open(tail=ended), 0, not ended
                self._usage = self._reader.get_usage()
            if ended or (deadline is not None and self._clock() >= deadline):
                return count

    def _drain(
        self,
        reader: Any,
        sinks: tuple[Sink, Sink | None, FieldSink | None],
        limit: int | None = None,
        deadline: float | None = None,
    ) -> tuple[int, bool]:
        """Hand on records until ``limit`` were, the ``deadline`` (monotonic s) passed or
        the journal ended; returns how many, and whether it ended."""
        # The reader's private accessors fetch one field each; iterating it would decode every
        # field of every entry, several times the cost at start.
        count = 0
        moved = False
        try:
            while limit is None or count < limit:
                if deadline is not None and moved and self._clock() >= deadline:
                    return count, False
                if not reader._next():
                    return count, True
                if not moved:
                    moved = True
                    if self._cursor is not None and reader.test_cursor(self._cursor):
                        continue  # seek_cursor lands on the entry already read
                item = self._item(reader)
                if item is not None:
                    count += _give(sinks, item)
        finally:
            if moved:
                # Also after a failed read: what the sink got must not be handed out again.
                with contextlib.suppress(OSError, ValueError, RuntimeError):
                    self._cursor = reader._get_cursor()
                    self._last = reader._get_realtime()
        return count, False

    def _item(self, reader: Any) -> _Item | None:
        """The entry ``reader`` is on, as what to hand to which sink; ``None`` for one
        without the fields it needs."""
        # The match let in the kernel's records, the loaders' and root's clears; only the
        # kernel's transport is the driver's (a loader's record is stdout, syslog or
        # journal), and a clear is told by the fields journald set.
        try:
            transport = reader._get("_TRANSPORT")
            if transport != b"kernel" and self._is_also(reader):
                return _Item(2, reader._get_realtime() / 1e6, fields(reader))
            raw = reader._get("MESSAGE")
        except KeyError:
            return None
        message = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        return _Item(0 if transport == b"kernel" else 1, reader._get_realtime() / 1e6, message)

    def _lost_a_file(self, reader: Any) -> bool:
        # sd-journal drops a file it cannot read on (a damaged entry) from the reader and
        # goes on with the others, saying nothing: its usage falls while nothing rotated.
        return bool(reader.get_usage() < self._usage)

    def _salvage(self, sinks: tuple[Sink, Sink | None, FieldSink | None]) -> int:
        """After a file was lost to damage: the records logged after the last one read, taken
        from the journal's end backwards (the way past damage that sd-journal still reads; at
        most one chunk of them, the latest), then handed on in order.  The reader is left at
        the journal's end; the journal problem holds for DAMAGE_HOLD s."""
        self.close()
        reader = self._reader = self._open(tail=True)
        self._usage = reader.get_usage()
        reader.seek_tail()
        items: list[_Item] = []
        latest: tuple[str, int] | None = None
        while len(items) < self.chunk and reader._previous():
            # The entry last read is in the damaged file, whose part before the damage the
            # reader no longer has: older entries of other files were read already too.
            if reader._get_realtime() <= self._last or (
                self._cursor is not None and reader.test_cursor(self._cursor)
            ):
                break
            if latest is None:
                latest = (reader._get_cursor(), reader._get_realtime())
            item = self._item(reader)
            if item is not None:
                items.append(item)
        if latest is not None:
            self._cursor, self._last = latest
        self.close()
        self._reader = self._open(tail=True)
        self._usage = self._reader.get_usage()
        self._damaged = self._clock() + DAMAGE_HOLD
        return sum(_give(sinks, item) for item in reversed(items))

    def _is_also(self, reader: Any) -> bool:
        if not self.also:
            return False
        for name, want in self.also.items():
            try:
                value = reader._get(name)
            except KeyError:
                return False
            if (value if isinstance(value, bytes) else str(value).encode()) != want.encode():
                return False
        return True

    def fileno(self) -> int | None:
        """The journal's inotify descriptor (readable when it changed), or ``None`` while the
        journal is not open."""
        return None if self._reader is None else int(self._reader.fileno())

    def waitable(self) -> tuple[int | None, str | None]:
        """The descriptor to wait on for what is appended next (``None``: none now: the
        journal not open, or its boot still being read) and, where it is open and cannot be
        waited on, why; then :meth:`poll` at each tick is what reads it."""
        if self._reader is None or self.reading:
            return None, None
        try:
            fd = int(self._reader.fileno())
            reliable = bool(self._reader.reliable_fd())
        except (OSError, ValueError, RuntimeError) as e:
            return None, f"it has no descriptor to wait on: {reason(e)}"
        if not reliable:
            # sd-journal's word for files on a network file system: inotify sees only what
            # this host writes there, so a wait could miss another writer's records.
            return None, "its files are on a file system whose changes inotify does not see"
        return fd, None

    def close(self) -> None:
        """Close the journal; the next :meth:`poll` reopens it and goes on where it stopped."""
        if self._reader is not None:
            reader, self._reader = self._reader, None
            reader.close()
