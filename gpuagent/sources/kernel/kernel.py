"""The kernel driver as a source of facts: this boot's Xid, SXid and RmInitAdapter records.

Glue between the journal (:class:`~gpuagent.sources.kernel.kernlog.KernelLog`), the counter
(:class:`~gpuagent.sources.kernel.xidcount.XidCounter`) and the agent: each tick, whatever the
probe's gates
say, :meth:`KernelRecords.poll` takes what the journal has that is new and returns each GPU's
problems of kind ``xid`` and ``init_failed`` for the health tracker, and gathers what the
kernel's records and the module loaders' (modprobe, systemd-modules-load: only why the
module is absent) say about the driver.  It logs what the health model does not: a journal
that cannot be read (once, and once when it can again) and the first application Xid or SXid
of each (GPU or NVSwitch, code) this boot.  The first Xid that makes a GPU unhealthy is
logged by the health model, as that problem's start.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from gpuagent.condition import Condition, Edge
from gpuagent.configkeys import Override
from gpuagent.edges.users import user_name
from gpuagent.health import WARNING
from gpuagent.logs import Event, EventLog
from gpuagent.sources.bus.pciaddr import device_of
from gpuagent.sources.driver.driver import absence_reason, api_mismatch, loader_reason
from gpuagent.sources.kernel import aerrecord, clears
from gpuagent.sources.kernel.drivercatalog import Causes
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.sources.kernel.xidcount import MAX_STRAYS, First, Source, XidCounter
from gpuagent.sources.processes.owners import source_words
from gpuagent.views import (
    ApiMismatch,
    BusView,
    Clear,
    DriverRecords,
    Finding,
    KernelView,
    Seen,
    XidCount,
    XidInfo,
)

__all__ = ["SLICE", "KernelRecords"]

# Xids' sources named so far this boot, by (GPU, code, PID): more is a flood, named afresh.
_MAX_SOURCES = 4096
# How long one poll reads the journal (s): a long boot read goes on over several, so that a
# flood of records delays neither READY=1 nor the watchdog nor SIGTERM.
SLICE = 0.1
# Lines a boot logs for Xids of addresses that are no GPU, one each; the rest are one line.
_STRAY_LINES = 8
# Addresses that are no GPU whose Xids are host problems of their own; the rest are one.
_STRAY_FINDINGS = 5


class KernelRecords:
    """This boot's kernel records from the journal in ``directory`` (``""``: the system
    journal), counted.  ``open_log`` makes the :class:`KernelLog` (injectable for tests);
    ``overrides`` is the site's ``[xid]`` table, ``hold`` (s) how long a warning Xid holds
    after its last record (``None``: until the next boot), on the ``monotonic`` clock: the
    ``wall`` clock, the records' own, only dates a record that the boot's first read finds
    (stepping it back or on does not bring back or end a warning).  ``told`` are the lines of
    counted Xids and SXids (slot, kind, code) the agent before a restart logged this boot:
    the boot read again does not log them again."""

    def __init__(
        self,
        directory: str,
        log: EventLog,
        *,
        open_log: Callable[[str], KernelLog] = KernelLog,
        overrides: Mapping[int, Override] | None = None,
        hold: float | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        told: Iterable[tuple[str, str, int]] = (),
        names: clears.Names = user_name,
    ) -> None:
        self.log = log
        self._open_log = open_log
        # The user names of the clears' login uids: the person behind a `sudo gpuagent clear`.
        self._names = names
        self.journal = open_log(directory)
        # The devices of the GPUs the agent knows of (the bus's, nvidia-smi's): never strays.
        self._gpus: set[str] = set()
        self.xids = XidCounter(overrides, gpu=self._gpus.__contains__)
        # The AER records read with the rest, for the PCIe source and an Xid 79's path; the
        # GPUs' paths (poll's ``path``), each kept once it names bridges.
        self.aer = aerrecord.Heard()
        # The driver's own words on why it could not take each GPU (its init failures').
        self.causes = Causes()
        self._path_of: Callable[[str], tuple[str, ...]] = lambda slot: ()
        # The AER counters' last rise of each function, as the PCIe source saw it.
        self.rose: Mapping[str, tuple[float, str]] = {}
        self._paths: dict[str, tuple[str, ...]] = {}
        self.hold = hold
        self.wall = wall
        self.monotonic = monotonic
        # Each (GPU device, Xid code)'s record count and when its last record was read, on
        # the monotonic clock; when the journal was last read.
        self._heard: dict[tuple[str, int], tuple[int, float]] = {}
        self._polled: float | None = None
        # Whether records of the boot's backlog were read since the last poll (their wall
        # stamps date them, as at the first poll).
        self._backlog = False
        # Each GPU's last clear by root (`gpuagent clear`), read in order with the records.
        self.cleared: dict[str, Clear] = {}
        self._forgotten: list[str] = []
        self._trouble: Condition[str] = Condition()
        self._reasons: list[str] = []
        self._mismatch: ApiMismatch | None = None
        # Addresses Xids named that are no GPU (not on the bus, never seen, never sampled),
        # in the order of their first records.
        self._strays: dict[str, None] = {}
        # This boot's lines for them so far, and whether the line for the rest was logged.
        self._stray_lines = 0
        self._summarised = False
        # Records read since the journal was opened (what the state says while reading).
        self._read = 0
        # Whether the line that the journal cannot be waited on was logged.
        self._unwaited = False
        # Each Xid's process named once, where it was seen then: a PID the kernel gives to
        # another job later must not rename an earlier Xid's source.
        self._sources: dict[tuple[str, int, int], Source] = {}
        # The counted Xids' and SXids' lines logged this boot (slot, kind, code), restarts
        # included: replaced, not changed, so that the view can hand it on as it is.
        self.told: frozenset[tuple[str, str, int]] = frozenset(told)

    def _count_afresh(self, overrides: Mapping[int, Override] | None) -> None:
        self.xids = XidCounter(overrides, gpu=self._gpus.__contains__)
        self.aer = aerrecord.Heard()
        self.causes = Causes()
        self._strays, self._stray_lines, self._summarised, self._read = {}, 0, False, 0

    @property
    def error(self) -> str | None:
        """Why the journal cannot be read, while it cannot, or that this boot's records are
        still being read (what is not read yet is in no count): the state's
        ``problems["journal"]``."""
        if self._trouble.value is None and self.journal.reading:
            return (
                f"reading this boot's kernel records ({self._read} so far); "
                "those not read yet are not counted"
            )
        return self._trouble.value

    @property
    def reading(self) -> bool:
        """Whether this boot's records are still being read (and the journal can be)."""
        return self.journal.reading and self.journal.error is None

    def waits_on(self) -> int | None:
        """The journal's descriptor to wait on between ticks (``None``: none now); says once
        at info where the journal cannot be waited on, and is then read at each tick."""
        fd, why = self.journal.waitable()
        if why is not None and not self._unwaited:
            self._unwaited = True
            self.log(
                logging.INFO,
                None,
                f"{self.journal.where} cannot be waited on ({why}): the kernel's records are "
                "read at each tick",
                journal_directory=self.journal.directory or None,
            )
        return fd

    def news(self) -> bool:
        """Read what came since (the journal's descriptor was readable); whether a record
        came or the journal failed: then an event step says so."""
        before = self._read
        self._take(SLICE)
        return self._read != before or self.journal.error is not None

    def read(self, budget: float = SLICE) -> None:
        """Read on for at most ``budget`` s (between ticks, while :attr:`reading`); the next
        :meth:`poll` says what the records made."""
        self._take(budget)

    def configure(
        self,
        directory: str,
        overrides: Mapping[int, Override] | None = None,
        hold: float | None = None,
    ) -> None:
        """Read the journal in ``directory`` from now on (a new one is counted from its boot's
        start, so the old counts go), with the site's ``[xid]`` table and the warning hold."""
        self.hold = hold
        self.xids.overrides = dict(overrides or {})
        if directory != self.journal.directory:
            self.journal.close()
            self.journal = self._open_log(directory)
            self._count_afresh(overrides)
            self.told = frozenset()
            self._mismatch = None
            self.cleared = {}
            self._heard, self._polled, self._backlog = {}, None, False

    def poll(
        self,
        bus: BusView,
        named: Iterable[str] = (),
        describe: Callable[[str], str] = lambda slot: "nothing",
        who: Callable[[int], Seen | None] = lambda pid: None,
        path: Callable[[str], tuple[str, ...]] = lambda slot: (),
    ) -> dict[str, list[Finding]]:
        """Read what is new (on the first call: the whole boot).  Returns every GPU's Xid and
        init-failure problems, by slot, and under ``""`` the Xids of addresses that are no
        GPU: neither on ``bus`` now nor ever seen on it, never ``named`` by nvidia-smi, nor
        by the driver (a UUID or init-failure line); ``describe`` says what sysfs has there;
        ``who`` where a PID an Xid names was last seen on a GPU (its unit); ``path`` a GPU's
        PCIe path, root port first (:func:`gpuagent.sources.bus.pci.path_of`), which an Xid 79
        after AER errors above the GPU blames (:func:`.aerrecord.fallen_off`)."""
        slots = bus.slots

        def attribute(slot: str, count: XidCount) -> Source | None:
            if count.pid is None:
                return None
            key = (slot, count.code, count.pid)
            if key not in self._sources:
                if len(self._sources) >= _MAX_SOURCES:
                    self._sources.clear()
                self._sources[key] = source_words(count.pid, count.process, who(count.pid))
            return self._sources[key]

        self._path_of = path
        blame = self._blame
        self._gpus.update(device_of(s) for s in (*bus.seen, *named))
        self._take(SLICE)
        counts = self.xids.counts(slots)
        gpus = {*bus.seen, *named, *self.xids.uuids(slots), *self.xids.init_failures(slots)}
        self._strays = dict.fromkeys(s for s, _ in counts if s not in gpus)
        self._tell(self.xids.take_new(slots, attribute, blame), counts, describe)
        lapsed = self._lapsed(counts)
        found: dict[str, list[Finding]] = {}
        made = self.xids.findings(
            slots, hold=self.hold, attribute=attribute, blame=blame, causes=self.causes.by_slot
        )
        for s, fs in made.items():
            held = [f for f in fs if f.kind != "xid" or (device_of(s), _code(f)) not in lapsed]
            if held:
                found[s] = held
        out = {s: fs for s, fs in found.items() if s not in self._strays}
        sick = [s for s in self._strays if s in found]
        host = [_stray(f, s, describe(s)) for s in sorted(sick[:_STRAY_FINDINGS]) for f in found[s]]
        if len(sick) > _STRAY_FINDINGS or self.xids.overflow:
            host.append(_others(len(sick) - _STRAY_FINDINGS, self.xids.overflow))
        if host:
            out[""] = host
        return out

    def _tell(
        self,
        firsts: Iterable[First],
        counts: Mapping[tuple[str, int], XidCount],
        describe: Callable[[str], str],
    ) -> None:
        """Log the first record of each (GPU or NVSwitch, code) this boot that no problem's
        start line says: counted Xids, SXids, the Xids of addresses that are no GPU."""
        untold = 0
        for first in firsts:
            stray = first.slot in self._strays
            if first.finding is not None and not stray:
                continue  # the health model's start line says it
            told = (first.slot, first.kind, first.code)
            if told in self.told:
                continue  # logged before a restart: its record is no new one
            if stray and self._stray_lines >= _STRAY_LINES:
                untold += 1
                continue
            fields: dict[str, int | str]
            if first.kind == "sxid":
                level, event, fields = logging.WARNING, Event.SXID, {"sxid": first.code}
            else:
                count = counts[first.slot, first.code]
                level, event = logging.INFO, Event.XID_COUNTED
                fields = {"xid": first.code, "action": count.info.action}
                fields |= _process_fields(count, first.unit)
            self.told |= {told}
            if stray:
                self._stray_lines += 1
                line = f"Xid {first.code} names PCI {first.slot}: {describe(first.slot)}, no GPU"
                self.log(level, event, line, address=first.slot, **fields)
            else:
                self.log(level, event, first.message, pci_slot=first.slot, **fields)
        if untold:
            self._summarise()

    def _summarise(self) -> None:
        if not self._summarised:
            self._summarised = True
            self.log(
                logging.WARNING,
                Event.XID_COUNTED,
                f"Xids name more PCI addresses that are no GPU: past {_STRAY_LINES} such lines "
                "this boot they are not logged one by one, but counted in the state's host "
                "problems; check the host",
            )

    def _lapsed(self, counts: Mapping[tuple[str, int], XidCount]) -> set[tuple[str, int]]:
        """The (device, code) pairs whose warning Xid has had no record for ``hold`` s on the
        monotonic clock.  A record read after the first poll was logged since the poll
        before (its wall stamp is trusted no further back than that); one the first poll
        reads is as old as its wall stamp says, and so is one read while the boot's records
        were still being read (the read went on in slices)."""
        mono, wall = self.monotonic(), self.wall()
        backlog, self._backlog = self._backlog, False
        since = math.inf if self._polled is None or backlog else max(mono - self._polled, 0.0)
        self._polled = mono
        lapsed: set[tuple[str, int]] = set()
        for (slot, code), count in counts.items():
            key = (device_of(slot), code)
            seen = self._heard.get(key)
            if seen is None or seen[0] != count.count:
                seen = (count.count, mono - min(max(wall - count.last, 0.0), since))
                self._heard[key] = seen
            held = self.hold is None or mono - seen[1] < self.hold
            if count.info.severity == WARNING and not held:
                lapsed.add(key)
        return lapsed

    def _take(self, budget: float) -> None:
        self._backlog = self._backlog or self.journal.reading
        self._read += self.journal.poll(
            self._record, self._loader_record, self._clear, budget=budget
        )
        self._note(self.journal.error)

    def _record(self, time: float, message: str) -> None:
        self.xids.add(time, message)
        self.aer.add(time, message)
        self.causes.add(message)
        reason = absence_reason(message)
        if reason is not None:
            self._reasons.append(reason)
        mismatch = api_mismatch(message)
        if mismatch is not None:
            self._mismatch = mismatch

    def _loader_record(self, time: float, message: str) -> None:
        # modprobe's and systemd-modules-load's words: why the module is not there, and
        # nothing else (never an Xid: only the kernel's records are the driver's).
        reason = loader_reason(message)
        if reason is not None:
            self._reasons.append(reason)

    def driver_records(self) -> DriverRecords:
        """What the records read since the last call said about the driver (for
        :class:`~gpuagent.sources.driver.driverstate.DriverState`): the absence reasons, and the
        boot's latest API-mismatch record."""
        reasons, self._reasons = self._reasons, []
        return DriverRecords(tuple(reasons), self._mismatch)

    def _clear(self, at: float, fields: dict[str, bytes]) -> None:
        if fields.get("MESSAGE_ID") != Event.OPERATOR_CLEAR.value.encode():
            return
        clear = clears.parse(fields, at, self._names)
        if clear is None:
            return  # not root's, or not a clear the agent honours
        self.xids.clear(clear.slot, clears.LATCHING if clear.kind == clears.ALL else (clear.kind,))
        self.cleared[clear.slot] = clear
        if clear.kind == clears.GONE:
            self._forgotten.append(clear.slot)

    def take_forgotten(self) -> list[str]:
        """The GPUs root said left for good (``gone_from_bus`` cleared) since the last call."""
        gone, self._forgotten = self._forgotten, []
        return gone

    def _note(self, error: str | None) -> None:
        edge = self._trouble.update(error)
        if edge is Edge.STARTED:
            self.log(
                logging.WARNING,
                Event.JOURNAL_UNREADABLE,
                f"{error}; sampling goes on"
                if error == self.journal.damage
                else f"{error}; the NVIDIA driver's Xid, SXid and fallen-off-the-bus records are "
                "not seen until it can be read; sampling goes on",
                journal_directory=self.journal.directory or None,
            )
        elif edge is Edge.ENDED:
            self.log(
                logging.INFO,
                Event.JOURNAL_READABLE,
                f"{self.journal.where} can be read again; reading the kernel's records",
                journal_directory=self.journal.directory or None,
            )

    def _blame(self, slot: str, count: XidCount) -> XidInfo | None:
        """An Xid 79 on ``slot`` blamed on its PCIe path (:func:`.aerrecord.fallen_off`), or
        None (as where the site's ``[xid]`` table sets its action).  A path of bridges, once
        resolved, is the slot's for the boot: a GPU fallen off the bus may leave sysfs after
        its record."""
        recent = self.aer.view.recent
        site = self.xids.overrides.get(count.code)
        if (
            count.code != aerrecord.FALLEN_OFF
            or not (recent or self.rose)
            or (site and site.action)
        ):
            return None  # the site's action has the last word
        path = self._paths.get(slot)
        if path is None:
            path = self._path_of(slot)
            if len(path) > 1:
                self._paths[slot] = path
        return aerrecord.fallen_off(count.info, path, recent, count.first, self.rose)

    def view(self, slots: list[str]) -> KernelView:
        """This boot's counts as the report needs them (an Xid 79 as its path has it); ``slots``
        are the GPUs on the bus.  The addresses that are no GPU (:meth:`poll`) have no GPU
        entry: their Xids are the host's problem."""
        xids: dict[tuple[str, int], XidCount] = {}
        for (slot, code), c in self.xids.counts(slots).items():
            if slot not in self._strays:
                info = self._blame(slot, c)
                xids[slot, code] = c if info is None else replace(c, info=info)
        return KernelView(
            xids,
            self.xids.sxid_counts(),
            self.xids.uuids(slots),
            dict(self.cleared),
            told=self.told,
            aer=self.aer.view,
            causes=dict(self.causes.by_slot),
        )


def _process_fields(count: XidCount, unit: str | None) -> dict[str, int | str]:
    """The journal fields naming an Xid's process: ``UNIT``, ``PROCESS_PID``, ``PROCESS_COMM``
    (not ``PROCESS_NAME``: python-systemd's handler sets that field itself, to Python's
    process name, and refuses a record that has it)."""
    out: dict[str, int | str] = {}
    if unit is not None:
        out["unit"] = unit
    if count.pid is not None:
        out["process_pid"] = count.pid
    if count.process is not None:
        out["process_comm"] = count.process
    return out


def _code(f: Finding) -> int | str | None:
    return dict(f.extra).get("xid")


def _others(addresses: int, overflow: int) -> Finding:
    """The Xids of the addresses that are no GPU past those that are problems of their own
    (``addresses`` of them), and the ``overflow`` records of those past the boot's cap
    (:data:`~gpuagent.sources.kernel.xidcount.MAX_STRAYS`, counted but not kept), as one host
    problem."""
    words = [f"Xids name {addresses} more PCI addresses that are no GPU"] if addresses > 0 else []
    if overflow:
        words.append(
            f"{overflow} records named PCI addresses that are no GPU past the {MAX_STRAYS} "
            "a boot keeps (counted, not kept)"
        )
    return Finding(
        "xid",
        WARNING,
        "check_host",
        f"{'; '.join(words)}: check the host",
        (("address", "others"),),
        ends="at the next boot",
    )


def _stray(f: Finding, slot: str, what: str) -> Finding:
    """An Xid of an address that is no GPU, as the host's problem: a warning to look at the
    host (nothing there to reset or drain), naming the address and what sysfs has there."""
    return Finding(
        f.kind,
        WARNING,
        "check_host",
        f"{f.message}; logged for PCI {slot}, which is no GPU (sysfs: {what}): check the host",
        (*f.extra, ("address", slot)),
        ends=f.ends,
    )
