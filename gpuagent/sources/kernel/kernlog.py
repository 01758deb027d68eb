"""The kernel's records of this boot from the systemd journal, read without blocking.

On :meth:`KernelLog.poll`'s first call the journal is opened and read from this boot's first
kernel record (``_TRANSPORT=kernel``, ``_BOOT_ID`` of the running boot), so an agent restart
counts the same records again and nothing logged while it was down is missed; later calls
take only what was appended since, and return at once when nothing was.  Reading the system
journal takes membership of the ``systemd-journal`` group; ``/dev/kmsg`` is not used.

The same read also takes the module loaders' records (:data:`LOADERS`: root's ``modprobe``'s
stderr, ``systemd-modules-load``'s own lines), whose words say why the nvidia module is not
there ("Module nvidia not found", "Key was rejected by service").  They are told apart by
the fields journald sets itself (``_TRANSPORT``, ``_COMM``, ``_SYSTEMD_UNIT``, ``_UID``),
which no program can forge through ``logger`` or ``sd_journal_send``; ``_COMM`` is the name a
process gives itself, so only root's count.  They are handed to their own sink:
never to the one that counts Xids.  One match with OR-ed terms (``sd_journal_add_disjunction``)
reads both in one pass.

With them, in journal order, come root's ``gpuagent clear`` entries (:data:`CLEARS`:
``MESSAGE_ID`` and ``_UID=0``, which journald sets), handed to a third sink with their fields.

"This boot" is the ``_BOOT_ID`` journald stamps (:func:`journal_boot`): the kernel's boot id
as this process sees it, unless the system journal has no entry of it and journald stamps
another, as in a container whose manager gives it a boot id of its own (systemd-nspawn) that
a sandboxed service's fresh ``/proc`` (``ProtectProc=``) does not show.  Then the boot of the
journal's latest entry is this one, so that root's clears, stamped by journald, are read.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CLEARS", "LOADERS", "LOADER_UID", "KernelLog", "booted_at", "journal_boot"]

# The agent's own entries read in order with the kernel's: `gpuagent clear` from root
# (logs.Event.OPERATOR_CLEAR; this module imports nothing of gpuagent's).
CLEARS = {"MESSAGE_ID": "9c49e6436dd14aaea07c537ddc3d294c", "_UID": "0"}
# The fields of such an entry handed to the clears' sink.
_FIELDS = ("MESSAGE_ID", "_UID", "_AUDIT_LOGINUID", "PCI_SLOT", "KIND", "CLEARED_BY", "SUDO_USER")

# Records read between two reopenings of the journal while the boot is read (see poll()).
START_CHUNK = 10_000

# The module loaders' records, by the fields journald itself sets: the command name of the
# process that logged (``_COMM``: modprobe run by a unit or udev, whose stderr is the
# journal's; systemd-modules-load), or the unit it ran in; each only from root (``_UID``,
# LOADER_UID), since any user may run a program named modprobe (systemd-cat modprobe …).
LOADERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("_COMM", ("modprobe", "systemd-modules-load")),
    ("_SYSTEMD_UNIT", ("systemd-modules-load.service",)),
)
LOADER_UID = "0"

# How long a damaged journal file stays the agent's journal problem after it was last met (s):
# long enough to be seen, and it ends by itself once the damage is rotated and vacuumed away.
DAMAGE_HOLD = 3600.0

Sink = Callable[[float, str], None]
FieldSink = Callable[[float, dict[str, bytes]], None]


def _open_reader(directory: str) -> Any:
    from systemd import journal  # noqa: PLC0415 - only where the journal is read

    if directory:
        return journal.Reader(path=directory)
    return journal.Reader(flags=journal.LOCAL_ONLY | journal.SYSTEM_ONLY)


def _kernel_boot() -> str:
    from systemd import id128  # noqa: PLC0415 - only where the journal is read

    return str(id128.get_boot().hex)


def booted_at() -> float:
    """When the kernel booted, in s since the epoch (no ``/proc`` needed)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def journal_boot(reader: Any, mine: str, *, system: bool = True, since: float | None = None) -> str:
    """This boot's ``_BOOT_ID`` in the journal ``reader`` reads (no match added yet):
    ``mine``, the kernel's boot id as this process sees it, if the journal has entries of it
    or is not the ``system`` journal (a directory, copied or made for a test); else the boot
    of the system journal's latest entry (journald's, where its boot id is not the one this
    process sees), if that entry was logged since the kernel booted (``since``, s since the
    epoch; :func:`booted_at` by default): a journal that holds only earlier boots (journald
    writing nowhere now) says nothing of this one.  ``mine`` for an empty journal.  Leaves
    the reader's position anywhere."""
    if not system or mine in {getattr(b, "hex", b) for b in reader.query_unique("_BOOT_ID")}:
        return mine
    reader.seek_tail()
    try:
        boot = reader._get("_BOOT_ID") if reader._previous() else None
        logged = reader._get_realtime() / 1e6 if boot is not None else 0.0
    except KeyError:
        boot = None
    if isinstance(boot, bytes):
        boot = boot.decode("ascii", "replace")
    if not isinstance(boot, str) or not boot:
        return mine
    return boot if logged >= (booted_at() if since is None else since) else mine


def match(reader: Any, also: Mapping[str, str] = CLEARS, boot: str | None = None) -> None:
    """Restrict ``reader`` to what :class:`KernelLog` reads: (the kernel's records, or a
    module loader's, or the entries matching all of ``also``) of this boot (``boot``, or
    the kernel's id as this process sees it)."""
    reader.add_match(_TRANSPORT="kernel")
    for field, values in LOADERS:
        reader.add_disjunction()
        # Terms of one field are OR-ed, of two fields AND-ed: (any of the values) and root's.
        reader.add_match(*(f"{field}={v}" for v in values), f"_UID={LOADER_UID}")
    if also:
        reader.add_disjunction()
        reader.add_match(**also)
    reader.add_conjunction()
    reader.this_boot(boot)


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


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[0].lower() + e.strerror[1:]
    return str(e).splitlines()[0] if str(e) else type(e).__name__


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
        open_reader: Callable[[str], Any] = _open_reader,
        chunk: int = START_CHUNK,
        also: Mapping[str, str] = CLEARS,
        kernel_boot: Callable[[], str] = _kernel_boot,
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
            elif not (tail and _last_is(reader, self._cursor)):
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
        fields it has of :data:`_FIELDS`, as bytes), never to
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
            self.error = f"{self.where}: cannot read: {_reason(e)}"
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
                return _Item(2, reader._get_realtime() / 1e6, _fields(reader))
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

    def close(self) -> None:
        """Close the journal; the next :meth:`poll` reopens it and goes on where it stopped."""
        if self._reader is not None:
            reader, self._reader = self._reader, None
            reader.close()


def _last_is(reader: Any, cursor: str) -> bool:
    """Place ``reader`` on its last entry; whether that is the one at ``cursor`` (then the
    next read takes what comes after it, as from the cursor)."""
    reader.seek_tail()
    return bool(reader._previous()) and bool(reader.test_cursor(cursor))


def _fields(reader: Any) -> dict[str, bytes]:
    got: dict[str, bytes] = {}
    for name in _FIELDS:
        with contextlib.suppress(KeyError):
            value = reader._get(name)
            got[name] = value if isinstance(value, bytes) else str(value).encode()
    return got
