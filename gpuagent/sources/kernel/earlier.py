"""The earlier boots as a source of facts: read from the journal in slices, for recurrence.

At start the agent reads the kernel's records, its own problem lines and root's clears of the
boots before this one, within ``history_days``, a slice a tick (at most :data:`SLICE` s of
reading), into a :class:`~gpuagent.sources.kernel.recurrence.Recurrence`
(:class:`~gpuagent.sources.kernel.earlierfacts.BootFacts` takes each entry); it stops at this boot's
first entry.  Until the read is done nothing is escalated and the state's ``history`` says so; a
volatile journal has no earlier boots, ``this boot only``, a fact, not an error; a journal kept
across boots that has none yet (the host's first boot with it) says ``no earlier boot yet``.

Any user can make the kernel log (a failed tmpfs mount in a user namespace is a record at
``KERN_ERR``, ~900 a second), and journald has no match on a record's words: the read matches
(:func:`match`) only the kernel's records at the priorities the driver's lines take
(:func:`driver_levels`: its ``NVRM:`` lines carry no level of their own, so they are at the
kernel's default message level, warning unless the host changed it), the agent's own lines by
the MESSAGE_IDs it reads, and root's clears; sd-journal skips the rest through its indexes,
never handing them over.  A flood at the driver's priority still has to be read: what was read
is kept across restarts (:mod:`~gpuagent.sources.kernel.earlierfile`), so a restart goes on
where the last run stopped, and a read that will take longer than :data:`BOUND` slices says so
once (:attr:`EarlierBoots.left`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from gpuagent.logs import Event
from gpuagent.sources.kernel import timeline
from gpuagent.sources.kernel.earlierfacts import BootFacts
from gpuagent.sources.kernel.earlierfile import KeptFile
from gpuagent.sources.kernel.earlierpace import Pace
from gpuagent.sources.kernel.journalboot import booted_at, journal_boot, kernel_boot, open_reader
from gpuagent.sources.kernel.recurrence import Recurrence, recurring
from gpuagent.views import Finding

__all__ = ["BOUND", "SLICE", "EarlierBoots", "driver_levels", "entries", "match"]

SLICE = 0.010
# What a slice keeps of its budget for what follows its last look at the clock (the entry
# in hand, closing a reader): the read stops this much before the budget.
MARGIN = 0.001
# Entries read between two reopenings of the journal: sd-journal keeps what it mapped, and a
# reader reopened at its cursor keeps the agent's RSS near its budget (as kernlog does).
CHUNK = 10_000
# Slices a read may take before it says how long it will take (10 minutes at the default
# interval); the estimate needs earlierpace.MEASURED slices of its own first.
BOUND = 60
_CLEAR = {"MESSAGE_ID": "9c49e6436dd14aaea07c537ddc3d294c", "_UID": "0"}
# The agent's lines the read takes: problem starts, boards replaced, wear records.
_AGENT = sorted(timeline.STARTS | {Event.BOARD_REPLACED.value, Event.WEAR_RECORDED.value})
# The kernel's default message level (KERN_WARNING), which the driver's lines take.
_WARNING = "4"
_LEVELS = frozenset("01234567")
_PRINTK = "/proc/sys/kernel/printk"


# What the timeline reads of a kernel record; of the others, every field it reads.
_KERNEL = ("_BOOT_ID", "MESSAGE")
_OTHERS = tuple(f for f in timeline.FIELDS if f != "_TRANSPORT")


def driver_levels(path: str = _PRINTK) -> tuple[str, ...]:
    """The priorities of the driver's kernel records: the kernel's default message level as
    built (warning) and, where the host set another, the one ``path`` says now (its second
    field).  The driver prints with ``KERN_CONT`` and no level, so its records take the
    default; a boot run with another default than both is not read."""
    try:
        with open(path, encoding="ascii") as f:
            fields = f.read(64).split()
    except (OSError, ValueError):
        return (_WARNING,)
    now = fields[1] if len(fields) > 1 and fields[1] in _LEVELS else _WARNING
    return tuple(sorted({_WARNING, now}))


def match(reader: Any, levels: Iterable[str]) -> None:
    """Restrict ``reader`` to what the earlier boots' read takes: the kernel's records at the
    priorities ``levels``, the agent's lines by their MESSAGE_IDs, root's clears."""
    reader.add_match("_TRANSPORT=kernel", *(f"PRIORITY={p}" for p in levels))
    reader.add_disjunction()
    reader.add_match(f"_SYSTEMD_UNIT={timeline.UNIT}", *(f"MESSAGE_ID={m}" for m in _AGENT))
    reader.add_disjunction()
    reader.add_match(**_CLEAR)


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


class EarlierBoots:
    """The earlier boots of the journal in ``directory`` (``""``: the system journal); ``kept``
    keeps what was read across restarts (None: nothing is kept); ``levels`` are the kernel
    records' priorities read (:func:`driver_levels`); ``booted`` is when this boot began (s
    since the epoch), which the read's estimate (:attr:`left`) reads up to; ``lasts`` says
    whether the journal is kept across boots (its :attr:`summary` without earlier boots).
    What the entries say is :class:`~gpuagent.sources.kernel.earlierfacts.BootFacts`'; this
    class walks the journal."""

    def __init__(
        self,
        directory: str,
        days: int,
        needed: int,
        *,
        kept: KeptFile | None = None,
        levels: Iterable[str] | None = None,
        open_reader: Callable[[str], Any] = open_reader,
        this_boot: Callable[[], str] = kernel_boot,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        booted: Callable[[], float] = booted_at,
        lasts: Callable[[], bool] = lambda: False,
    ) -> None:
        self.done = False
        # Whether the journal is kept across boots: asked once, when the read is done (it reads
        # journald's config), and that answer kept (_finish).
        self._lasts = lasts
        self._directory = directory
        self._levels = tuple(driver_levels() if levels is None else levels)
        self._open_reader, self._this_boot, self._clock = open_reader, this_boot, clock
        self._reader: Any = None
        self._facts = BootFacts(directory, max(wall() - days * 86400, 0.0), needed, kept)
        self._read = 0
        # Where a reader closed after CHUNK entries stopped (or the last run did): its
        # successor is sought there, and its first entry (the last one read) skipped.
        self._resume: str | None = self._facts.kept.cursor
        # Whether an entry was taken since the kept cursor was last brought up to date.
        self._moved = False
        # The journal's size as the reader opened it: a file dropped at damage shrinks it.
        self._usage = 0
        self.damaged = 0
        # The slices this run has read and the entries' times: where to go on past damage,
        # and how long the read will take.
        self._pace = Pace(self._facts.kept.at, booted)

    @property
    def recurrence(self) -> Recurrence:
        """The earlier boots' hits as read so far."""
        return self._facts.recurrence

    @property
    def boots(self) -> frozenset[str]:
        """The earlier boots read so far."""
        return frozenset(self._facts.kept.boots)

    @property
    def taken(self) -> int:
        """The entries this run has taken from the journal (what was kept is not read again)."""
        return self._read

    @property
    def summary(self) -> str:
        """The state's ``history``: reading, this boot only (a volatile journal), no earlier
        boot yet (a journal kept across boots), or how many earlier boots, and a damaged
        journal file met on the way (the read went on past it)."""
        if not self.done:
            return "reading earlier boots"
        n = len(self._facts.kept.boots)
        if n:
            said = f"{n} earlier boot{'s' if n > 1 else ''}"
        else:
            said = "no earlier boot yet" if self._lasts() else "this boot only"
        if self.damaged:
            said += (
                "; a damaged journal file was met: the entries after it were read from the "
                "journal's end (journalctl --verify names it), some may be missing"
            )
        return said

    @property
    def left(self) -> int | None:
        """The slices the read will still take, estimated from the journal time its slices
        covered so far against what is left up to this boot's start; None while done or
        before ``MEASURED`` slices (:mod:`.earlierpace`)."""
        return None if self.done else self._pace.left()

    def step(self, budget: float = SLICE) -> None:
        """Read on for at most ``budget`` seconds, opening the journal included (nothing once
        done).  The clock is read after every entry; a reader that has read :data:`CHUNK`
        entries is closed at its cursor, what was read kept, and the next slice reopens it
        there."""
        if self.done:
            return
        self._pace.slices += 1
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
                self._pace.saw(self._reader._get_realtime())
                if not self._facts.take(self._pace.last_at / 1e6, _fields(self._reader)):
                    # The kept cursor is the last entry taken, not this boot's first.
                    if self._moved and self._reader._previous():
                        self._keep_cursor()
                    break
                self._moved = True
                self._read += 1
                if self._read % CHUNK == 0:
                    self._close_at_cursor()
                    return
            else:
                return  # the slice is spent
        except (OSError, ValueError, RuntimeError):
            # What was read counts; the journal's trouble is the kernel source's to say.
            self._finish(keep=False)
            return
        self._finish(keep=not self.damaged)

    def _read_past_damage(self) -> None:
        """At the reader's end, where sd-journal dropped a file at damage on the way (the
        journal's size fell, and it says nothing): the earlier boots' entries after the last
        one read, taken from the journal's end backwards (the way past damage that sd-journal
        still reads: at most :data:`CHUNK` of them, the latest), then read in order.  Once a
        read; the summary says so (and nothing of it is kept: the next start reads afresh)."""
        if self.damaged or self._reader.get_usage() >= self._usage:
            if self._moved:
                self._keep_cursor()  # the reader's last entry, the last one taken
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
            if at <= self._pace.last_at:
                break
            fields = _fields(self._reader)
            if fields.get("_BOOT_ID", b"").decode("ascii", "replace") != self._facts.this:
                items.append((at, fields))
        for at, fields in reversed(items):
            self._facts.take(at / 1e6, fields)

    def _keep_cursor(self) -> None:
        self._facts.kept.cursor = self._reader._get_cursor()
        self._facts.kept.at = self._reader._get_realtime()
        self._moved = False

    def _close_at_cursor(self) -> None:
        self._keep_cursor()
        self._resume = self._facts.kept.cursor
        self._reader.close()
        self._reader = None
        self._facts.save()

    def _start(self, *, tail: bool = False) -> None:
        """Open the reader: at the journal's end (``tail``), else where the last one (or the
        last run) closed, else ``history_days`` back.  At the first open, what was kept of
        boots the journal no longer has, of this boot, or from before ``history_days`` goes."""
        directory = self._directory
        reader = self._open_reader(directory)
        self._usage = reader.get_usage()
        if not self._facts.this:
            # The boot the kernel source reads as this one (journalboot.journal_boot).
            self._facts.this = journal_boot(reader, self._this_boot(), system=not directory)
            self._facts.prune({getattr(b, "hex", b) for b in reader.query_unique("_BOOT_ID")})
        match(reader, self._levels)
        self._reader = reader
        if tail:
            reader.seek_tail()
            return
        if self._resume is not None:
            try:
                reader.seek_cursor(self._resume)
            except (OSError, ValueError):
                # A cursor sd-journal does not take: what was kept cannot be gone on from.
                self._facts.restart()
                self._resume = None
            else:
                return
        reader.seek_realtime(self._facts.since)

    @property
    def wear(self) -> dict[str, tuple[Mapping[str, int], ...]] | None:
        """The earlier boots' wear records by board UUID (lower case), each boot's first,
        oldest first; None until the read is done."""
        return self._facts.wear() if self.done else None

    def _finish(self, *, keep: bool) -> None:
        """The read is done; with ``keep``, what it read is kept for the next start."""
        self.done = True
        kept_across = self._lasts()
        self._lasts = lambda: kept_across
        if self._reader is not None:
            with contextlib.suppress(OSError):
                self._reader.close()
            self._reader = None
        if not self._facts.this:
            self._facts.unchecked()
        elif keep:
            self._facts.save()

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
