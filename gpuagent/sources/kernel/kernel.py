"""The kernel driver as a source of facts: this boot's Xid, SXid and RmInitAdapter records.

Glue between the journal (:class:`~gpuagent.sources.kernel.kernlog.KernelLog`), the counter
(:class:`~gpuagent.sources.kernel.xidcount.XidCounter`) and the agent: each tick, whatever the
probe's gates say, :meth:`KernelRecords.poll` takes what the journal has that is new and
returns each GPU's problems of kind ``xid`` and ``init_failed`` for the health tracker, and
gathers what the kernel's records and the module loaders' (modprobe, systemd-modules-load:
only why the module is absent) say about the driver
(:class:`~gpuagent.sources.kernel.driversaid.DriverSaid`).  It logs what the health model does
not: a journal that cannot be read, once, and once when it can again
(:class:`~gpuagent.sources.kernel.journaltrouble.JournalTrouble`), and the first application Xid
or SXid of each (GPU or NVSwitch, code) this boot
(:class:`~gpuagent.sources.kernel.firstlines.FirstLines`).  The first Xid that makes a GPU
unhealthy is logged by the health model, as that problem's start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from gpuagent.configkeys import Override
from gpuagent.edges.users import user_name
from gpuagent.logs import EventLog
from gpuagent.sources.bus.pciaddr import device_of
from gpuagent.sources.kernel import clears
from gpuagent.sources.kernel.cleared import Cleared
from gpuagent.sources.kernel.driversaid import DriverSaid
from gpuagent.sources.kernel.firstlines import FirstLines
from gpuagent.sources.kernel.journaltrouble import JournalTrouble
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.sources.kernel.pathblame import PathBlame
from gpuagent.sources.kernel.warninghold import WarningHold
from gpuagent.sources.kernel.xidcount import Source, XidCounter
from gpuagent.sources.processes.owners import source_words
from gpuagent.views import (
    BusView,
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


class KernelRecords:
    """This boot's kernel records from the journal in ``directory`` (``""``: the system
    journal), counted.  ``open_log`` makes the :class:`KernelLog` (injectable for tests);
    ``overrides`` is the site's ``[xid]`` table, ``hold`` (s) how long a warning Xid holds
    after its last record (:class:`~.warninghold.WarningHold`, on the ``wall`` and
    ``monotonic`` clocks).  ``told`` are the lines of counted Xids and SXids (slot, kind,
    code) the agent before a restart logged this boot (:class:`~.firstlines.FirstLines`);
    ``names`` gives the user names of root's clears' login uids (:class:`~.cleared.Cleared`).

    Each group of what the records make has its object: the counts (:attr:`xids`), the
    warnings' hold, the first records' lines and the strays, the driver's words, an Xid 79's
    PCIe path, root's clears and the journal's trouble."""

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
        self._open_log = open_log
        self.journal = open_log(directory)
        # The devices of the GPUs the agent knows of (the bus's, nvidia-smi's): never strays.
        self._gpus: set[str] = set()
        self.xids = XidCounter(overrides, gpu=self._gpus.__contains__)
        self._held = WarningHold(hold, wall, monotonic)
        self._firsts = FirstLines(log, told)
        self._driver = DriverSaid()
        self._paths = PathBlame()
        self.clears = Cleared(names)
        self._trouble = JournalTrouble(log)
        # Records read since the journal was opened (what the state says while reading).
        self._read = 0
        # Each Xid's process named once, where it was seen then: a PID the kernel gives to
        # another job later must not rename an earlier Xid's source.
        self._sources: dict[tuple[str, int, int], Source] = {}

    @property
    def error(self) -> str | None:
        """Why the journal cannot be read, while it cannot, or that this boot's records are
        still being read (what is not read yet is in no count): the state's
        ``problems["journal"]``."""
        if self._trouble.error is None and self.journal.reading:
            return (
                f"reading this boot's kernel records ({self._read} so far); "
                "those not read yet are not counted"
            )
        return self._trouble.error

    @property
    def reading(self) -> bool:
        """Whether this boot's records are still being read (and the journal can be)."""
        return self.journal.reading and self.journal.error is None

    def waits_on(self) -> int | None:
        """The journal's descriptor to wait on between ticks (``None``: none now); says once
        at info where the journal cannot be waited on, and is then read at each tick."""
        fd, why = self.journal.waitable()
        if why is not None:
            self._trouble.unwaitable(self.journal, why)
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
        self._held.hold = hold
        self.xids.overrides = dict(overrides or {})
        if directory != self.journal.directory:
            self.journal.close()
            self.journal = self._open_log(directory)
            self.xids = XidCounter(overrides, gpu=self._gpus.__contains__)
            self._paths.afresh()
            self._driver.afresh()
            self._firsts.afresh()
            self._read = 0
            self.clears.forget()
            self._held.forget()

    def poll(
        self,
        bus: BusView,
        named: Iterable[str] = (),
        describe: Callable[[str], str] = lambda slot: "nothing",
        who: Callable[[int], Seen | None] = lambda pid: None,
        path: Callable[[str], tuple[str, ...]] = lambda slot: (),
        *,
        rose: Mapping[str, tuple[float, str]] | None = None,
    ) -> dict[str, list[Finding]]:
        """Read what is new (on the first call: the whole boot).  Returns every GPU's Xid and
        init-failure problems, by slot, and under ``""`` the Xids of addresses that are no
        GPU: neither on ``bus`` now nor ever seen on it, never ``named`` by nvidia-smi, nor
        by the driver (a UUID or init-failure line); ``describe`` says what sysfs has there;
        ``who`` where a PID an Xid names was last seen on a GPU (its unit); ``path`` a GPU's
        PCIe path, root port first (:func:`gpuagent.sources.bus.pci.path_of`), which an Xid 79
        after AER errors above the GPU, or a rise of the AER counters above it (``rose``: each
        function's last, wall s and kind, as the PCIe source saw it), blames
        (:func:`.aerrecord.fallen_off`)."""
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

        self._paths.path_of = path
        self._paths.rose = rose or {}
        blame = self._blame
        self._gpus.update(device_of(s) for s in (*bus.seen, *named))
        self._take(SLICE)
        counts = self.xids.counts(slots)
        gpus = {*bus.seen, *named, *self.xids.uuids(slots), *self.xids.init_failures(slots)}
        self._firsts.strays = dict.fromkeys(s for s, _ in counts if s not in gpus)
        self._firsts.tell(self.xids.take_new(slots, attribute, blame), counts, describe)
        lapsed = self._held.lapsed(counts)
        found: dict[str, list[Finding]] = {}
        made = self.xids.findings(
            slots,
            hold=self._held.hold,
            attribute=attribute,
            blame=blame,
            causes=self._driver.by_slot,
        )
        for s, fs in made.items():
            held = [f for f in fs if f.kind != "xid" or (device_of(s), _code(f)) not in lapsed]
            if held:
                found[s] = held
        return self._firsts.apart(found, describe, self.xids.overflow)

    def _take(self, budget: float) -> None:
        self._held.backlog(self.journal.reading)
        self._read += self.journal.poll(
            self._record, self._loader_record, self._clear, budget=budget
        )
        self._trouble.note(self.journal)

    def _record(self, time: float, message: str) -> None:
        self.xids.add(time, message)
        self._paths.add(time, message)
        self._driver.add(message)

    def _loader_record(self, time: float, message: str) -> None:
        self._driver.loader(message)

    def driver_records(self) -> DriverRecords:
        """What the records read since the last call said about the driver
        (:meth:`.driversaid.DriverSaid.records`)."""
        return self._driver.records()

    def _clear(self, at: float, fields: dict[str, bytes]) -> None:
        clear = self.clears.take(at, fields)
        if clear is not None:
            kinds = clears.LATCHING if clear.kind == clears.ALL else (clear.kind,)
            self.xids.clear(clear.slot, kinds)

    def take_forgotten(self) -> list[str]:
        """The GPUs root said left for good (``gone_from_bus`` cleared) since the last call."""
        return self.clears.take_forgotten()

    def _blame(self, slot: str, count: XidCount) -> XidInfo | None:
        """An Xid 79 on ``slot`` blamed on its PCIe path (:meth:`.pathblame.PathBlame.blame`),
        or None (as where the site's ``[xid]`` table sets its action)."""
        return self._paths.blame(slot, count, self.xids.overrides.get(count.code))

    def view(self, slots: list[str]) -> KernelView:
        """This boot's counts as the report needs them (an Xid 79 as its path has it); ``slots``
        are the GPUs on the bus.  The addresses that are no GPU (:meth:`poll`) have no GPU
        entry: their Xids are the host's problem."""
        xids: dict[tuple[str, int], XidCount] = {}
        for (slot, code), c in self.xids.counts(slots).items():
            if slot not in self._firsts.strays:
                info = self._blame(slot, c)
                xids[slot, code] = c if info is None else replace(c, info=info)
        return KernelView(
            xids,
            self.xids.sxid_counts(),
            self.xids.uuids(slots),
            dict(self.clears.cleared),
            told=self._firsts.told,
            aer=self._paths.heard,
            causes=dict(self._driver.by_slot),
        )


def _code(f: Finding) -> int | str | None:
    return dict(f.extra).get("xid")
