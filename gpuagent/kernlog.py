"""The kernel's records of this boot from the systemd journal, read without blocking.

On :meth:`KernelLog.poll`'s first call the journal is opened and read from this boot's first
kernel record (``_TRANSPORT=kernel``, ``_BOOT_ID`` of the running boot; with them, in journal
order, the entries matching ``also``: root's ``gpuagent clear``), so an agent restart
counts the same records again and nothing logged while it was down is missed; later calls
take only what was appended since, and return at once when nothing was.  Reading the system
journal takes membership of the ``systemd-journal`` group; ``/dev/kmsg`` is not used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CLEARS", "KernelLog"]

# The agent's own entries read in order with the kernel's: `gpuagent clear` from root
# (logs.Event.OPERATOR_CLEAR; this module imports nothing of gpuagent's).
CLEARS = {"MESSAGE_ID": "9c49e6436dd14aaea07c537ddc3d294c", "_UID": "0"}
# The fields of such an entry handed to the other sink.
_FIELDS = ("MESSAGE_ID", "_UID", "PCI_SLOT", "KIND", "CLEARED_BY")

# Records read between two reopenings of the journal while the boot is read (see poll()).
START_CHUNK = 10_000


def _open_reader(directory: str) -> Any:
    from systemd import journal  # noqa: PLC0415 - only where the journal is read

    if directory:
        return journal.Reader(path=directory)
    return journal.Reader(flags=journal.LOCAL_ONLY | journal.SYSTEM_ONLY)


class _NoFiles(Exception):
    """The journal opened, but without one file this process may read."""


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[0].lower() + e.strerror[1:]
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _kernel(reader: Any) -> bool:
    """Whether the reader's entry is the kernel's (not one matching ``also``)."""
    try:
        return reader._get("_TRANSPORT") in (b"kernel", "kernel")
    except KeyError:
        return True


class KernelLog:
    """This boot's kernel records from the journal in ``directory`` (``""``: the local system
    journal).

    :meth:`poll` never raises for a journal it cannot read: it hands over what it could and
    sets :attr:`error` to a one-line reason (``None`` while all is well); the next call tries
    again.  ``open_reader`` is injectable for tests; it returns a ``systemd.journal.Reader``.
    ``chunk`` is how many records the first read takes before it reopens the journal.
    """

    def __init__(
        self,
        directory: str = "",
        *,
        open_reader: Callable[[str], Any] = _open_reader,
        chunk: int = START_CHUNK,
        also: Mapping[str, str] = CLEARS,
    ) -> None:
        self.directory = directory
        self.also = dict(also)
        self.chunk = chunk
        self.error: str | None = None
        self._open_reader = open_reader
        self._reader: Any = None
        # Where the last read stopped: a reopened journal goes on from there, not from the
        # boot's start, so no record is handed out twice.
        self._cursor: str | None = None
        self._other: Callable[[float, dict[str, bytes]], None] | None = None

    @property
    def where(self) -> str:
        """The journal's name for messages: its directory, or ``the system journal``."""
        return self.directory or "the system journal"

    def _open(self) -> Any:
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
            # This boot AND (the kernel's records OR the entries matching ``also``).
            reader.this_boot()
            reader.add_conjunction()
            reader.add_match(_TRANSPORT="kernel")
            if self.also:
                reader.add_disjunction()
                reader.add_match(**self.also)
            # sd-journal watches the files only once its fd exists: ask for it before reading,
            # or what is appended while the boot is read could go unnoticed.
            reader.fileno()
            if self._cursor is None:
                reader.seek_head()
            else:
                reader.seek_cursor(self._cursor)
        except BaseException:
            reader.close()
            raise
        return reader

    def poll(
        self,
        sink: Callable[[float, str], None],
        other: Callable[[float, dict[str, bytes]], None] | None = None,
    ) -> int:
        """Hand each kernel record logged since the last call (on the first: the whole boot)
        to ``sink(time, message)``: ``time`` is its ``__REALTIME_TIMESTAMP`` in s since the
        epoch, ``message`` its whole ``MESSAGE`` (newlines kept, bytes that are not UTF-8
        replaced); each entry matching ``also``, in order among them, to ``other(time,
        fields)`` (the fields it has of MESSAGE_ID, _UID, PCI_SLOT, KIND, CLEARED_BY, as
        bytes).  Returns how many it handed over."""
        self._other = other
        count = 0
        try:
            if self._reader is None:
                # Reading maps (and pages in) the journal as it goes, and sd-journal keeps what
                # it mapped: a long boot read a chunk at a time, each by a reader reopened at
                # the cursor, keeps the agent's RSS near what later polls need (the tail).
                self._reader = self._open()
                while got := self._drain(self._reader, sink, self.chunk):
                    count += got
                    self.close()
                    self._reader = self._open()
                    if got < self.chunk:
                        break
            else:
                # Drains the inotify events (files rotated, appended to).  The read below is
                # cheap enough (< 1 us) to do even when nothing changed, which keeps journals
                # whose changes cannot be watched (network file systems) correct.
                self._reader.process()
                count = self._drain(self._reader, sink)
        except (OSError, ValueError, RuntimeError, _NoFiles) as e:
            self.close()
            self.error = f"{self.where}: cannot read: {_reason(e)}"
            return 0
        self.error = None
        return count

    def _drain(
        self, reader: Any, sink: Callable[[float, str], None], limit: int | None = None
    ) -> int:
        # The reader's private accessors fetch one field each; iterating it would decode every
        # field of every entry, several times the cost at start.
        count = 0
        moved = False
        try:
            while (limit is None or count < limit) and reader._next():
                if not moved:
                    moved = True
                    if self._cursor is not None and reader.test_cursor(self._cursor):
                        continue  # seek_cursor lands on the entry already read
                if self.also and not _kernel(reader):
                    self._hand_other(reader)
                    count += 1
                    continue
                try:
                    raw = reader._get("MESSAGE")
                except KeyError:
                    continue
                message = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                sink(reader._get_realtime() / 1e6, message)
                count += 1
        finally:
            if moved:
                # Also after a failed read: what the sink got must not be handed out again.
                with contextlib.suppress(OSError, ValueError, RuntimeError):
                    self._cursor = reader._get_cursor()
        return count

    def _hand_other(self, reader: Any) -> None:
        if self._other is None:
            return
        got: dict[str, bytes] = {}
        for name in _FIELDS:
            with contextlib.suppress(KeyError):
                value = reader._get(name)
                got[name] = value if isinstance(value, bytes) else str(value).encode()
        self._other(reader._get_realtime() / 1e6, got)

    def fileno(self) -> int | None:
        """The journal's inotify descriptor (readable when it changed), or ``None`` while the
        journal is not open."""
        return None if self._reader is None else int(self._reader.fileno())

    def close(self) -> None:
        """Close the journal; the next :meth:`poll` reopens it and goes on where it stopped."""
        if self._reader is not None:
            reader, self._reader = self._reader, None
            reader.close()
