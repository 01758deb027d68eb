"""One boot's kernel records counted: Xids per (GPU, code), SXids per (NVSwitch, code) and
``RmInitAdapter failed!`` per GPU (pure).

Records are parsed by :mod:`gpuagent.sources.kernel.xid`; :class:`XidCounter` is fed every kernel
record of the boot in order and answers by the PCI slots the agent scanned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from gpuagent.configkeys import Override
from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.bus.pciaddr import device_of
from gpuagent.sources.kernel.drivercatalog import DEFAULT_FIX, Cause, explain
from gpuagent.sources.kernel.xid import GpuUuid, InitFailure, SXid, Xid, assess, parse
from gpuagent.sources.kernel.xidcatalog import NONE, advice, override
from gpuagent.sources.kernel.xidwindow import Bursts
from gpuagent.views import Finding, SXidCount, XidCount, XidInfo

__all__ = [
    "MAX_CODES",
    "MAX_STRAYS",
    "Attribute",
    "First",
    "InitCount",
    "XidCounter",
    "finding",
]

_RANK = {NONE: 0, WARNING: 1, CRITICAL: 2}
# What one boot may hold, however many records a flood brings: the devices (and NVSwitches)
# that are no GPU the agent knows of, and the codes of any one device.  Past either, a
# record naming something new is only counted (XidCounter.overflow).
MAX_STRAYS = 64
MAX_CODES = 256
# Who caused an Xid: words for its line (" from train@3.service (pid 48213 python3)") and the
# unit (None: not known).
Source = tuple[str, str | None]


def finding(
    count: XidCount,
    now: float | None = None,
    hold: float | None = None,
    source: Source | None = None,
    slot: str = "SLOT",
) -> Finding | None:
    """The GPU's problem of kind ``xid`` that ``count`` makes, or ``None`` (counted only);
    ``source`` names the process that caused it (its words, its unit); ``slot`` the GPU's,
    which a reset advice names.

    A warning no longer holds once ``hold`` seconds (``Config.xid_warning_hold``) have passed
    since the code's last record without a recurrence: ``now`` is wall time in seconds since
    the epoch, the clock of ``count.last``.  Without ``now`` and ``hold`` it holds until the
    next boot; a critical one always does."""
    info = count.info
    if info.severity == NONE:
        return None
    if (
        info.severity == WARNING
        and now is not None
        and hold is not None
        and now - count.last >= hold
    ):
        return None
    words, unit = source or ("", None)
    lapses = info.severity == WARNING and bool(hold)
    return Finding(
        "xid",
        info.severity,
        info.action,
        f"Xid {count.code} ({info.name}){words}: {advice(info, slot)}",
        (("xid", count.code),),
        # A warning that lapsed and came back starts again at its latest record.
        at=count.first if info.severity == CRITICAL else count.last,
        unit=unit,
        # A warning lapses (the rule that ends it says so, its end line too); a critical Xid
        # holds until a clear or the next boot.
        ends=f"{hold:g} s after its last record" if lapses else "",
        lapse=f"no record for {hold:g} s (xid_warning_hold)" if lapses else "",
    )


@dataclass
class InitCount:
    """``RmInitAdapter failed!`` records for one GPU this boot and the last one's detail."""

    count: int
    first: float
    last: float
    detail: str

    def finding(self, cause: Cause | None = None) -> Finding:
        """The GPU's problem of kind ``init_failed``; ``cause`` what the driver's own records
        of the GPU this boot said before (:mod:`gpuagent.sources.kernel.drivercatalog`): its
        meaning, action and fix, where a reboot would load the same module."""
        detail = f" ({self.detail})" if self.detail else ""
        failed = f"the driver could not initialise the GPU (RmInitAdapter failed{detail})"
        action, said = explain(cause, "reboot", f"; {DEFAULT_FIX}")
        return Finding("init_failed", CRITICAL, action, failed + said, at=self.first)


@dataclass(frozen=True)
class _Answers:
    """The counter's answers for ``slots`` after record number ``seq``."""

    slots: list[str]
    seq: int
    counts: dict[tuple[str, int], XidCount]
    uuids: dict[str, str]
    init_failures: dict[str, InitCount]


# Who caused a GPU's count (its slot, the count), where its records name a process.
Attribute = Callable[[str, XidCount], Source | None]
# What a GPU's Xid means where its own record is not the whole story (an Xid 79 after errors
# on its PCIe path), by slot; None: what the catalog and the site say.
Blame = Callable[[str, XidCount], XidInfo | None]


@dataclass(frozen=True)
class First:
    """The first record this boot of a (GPU or NVSwitch, code): ``kind`` is ``xid``,
    ``sxid`` or ``init_failed``; ``code`` is 0 for ``init_failed``; ``finding`` is the health
    problem it starts (``None``: counted only, or an NVSwitch); ``message`` is one line for the
    journal.  Where ``finding`` is set, the health problem's start line should be this line.
    ``unit`` is the systemd unit of the process the record names, where known."""

    slot: str
    kind: str
    code: int
    time: float
    message: str
    finding: Finding | None
    unit: str | None = None


class XidCounter:
    """Counts one boot's kernel records by (GPU, code), (NVSwitch, SXid) and init failures.

    Feed it every kernel record of the boot in order with :meth:`add`.  One record counts once
    per (GPU, code) it names; a GPU falling off the bus counts as one Xid 79 however many
    records tell of it (the Xid line, its companion, the probe-time record).

    Xid lines give a GPU's ``domain:bus:device`` only; the queries take the PCI slots the
    agent scanned (``0000:3b:00.0``) and report each GPU under its own slot (``.0`` where the
    GPU is not on the bus any more and no record named its function).

    ``overrides`` is the site's ``[xid]`` table (``Config.xid``): it has the last word on each
    code's severity and action (:func:`gpuagent.sources.kernel.xid.assess`), in every answer; a
    reload may replace it, and the boot's counts are then answered with the new table.  An
    entry with a count applies once the GPU's code reached it within its window
    (:mod:`gpuagent.sources.kernel.xidwindow`).

    A flood is bounded: at most :data:`MAX_STRAYS` devices that are not ``gpu`` and
    :data:`MAX_CODES` codes a device are held; a record naming something new past them is
    counted in :attr:`overflow` only.  Each record costs the same however many came before.
    """

    def __init__(
        self,
        overrides: Mapping[int, Override] | None = None,
        gpu: Callable[[str], bool] = lambda device: False,
    ) -> None:
        self._overrides: Mapping[int, Override] = dict(overrides or {})
        self._bursts = Bursts(self._overrides)
        # Whether a device (``0000:3b:00``) is a GPU the agent knows of: those are held
        # whatever the cap (MAX_STRAYS) says; the kernel source sets it as it learns.
        self.gpu = gpu
        self._xids: dict[tuple[str, int], XidCount] = {}
        self._sxids: dict[tuple[str, int], SXidCount] = {}
        self._init: dict[str, InitCount] = {}
        self._functions: dict[str, int] = {}
        self._uuids: dict[str, str] = {}
        self._new: list[tuple[str, str, int]] = []
        # Xids whose record named no readable slot (a redacted "PCI:..."), by code.
        self.unattributed: dict[int, int] = {}
        # Records that told of any driver event (an Xid, an SXid, a UUID line …).
        self.records = 0
        # Each device (or NVSwitch slot) held, and its codes: bounded (MAX_STRAYS, MAX_CODES).
        self._held: dict[str, set[int]] = {}
        self._strays = 0
        # Records not held for the caps: they named a new device past MAX_STRAYS or a new
        # code past MAX_CODES.
        self.overflow = 0
        # The slots the queries were last asked with, and their devices (see _slotter).
        self._slotted: tuple[list[str], dict[str, str]] = ([], {})
        # The per-slot answers for those slots, and the record they were worked out after.
        self._answered: _Answers | None = None
        # Journal order: every record's number, each (kind, device, code)'s last one, and
        # each (kind, device)'s operator's clear (see clear()).
        self._seq = 0
        self._latest: dict[tuple[str, str, int], int] = {}
        self._cleared: dict[tuple[str, str], int] = {}

    @property
    def overrides(self) -> Mapping[int, Override]:
        """The site's ``[xid]`` table the answers follow."""
        return self._overrides

    @overrides.setter
    def overrides(self, table: Mapping[int, Override]) -> None:
        self._overrides = table
        self._bursts.reload(table)
        self._answered = None

    def add(self, time: float, message: str) -> None:
        """Count one kernel record logged at ``time`` (s since the epoch)."""
        self._seq += 1
        events = parse(message)
        if not events:
            return
        self.records += 1
        seen: set[tuple[str, str, int]] = set()
        for event in events:
            if isinstance(event, Xid):
                self._add_xid(time, event, seen)
            elif isinstance(event, SXid):
                self._add_sxid(time, event, seen)
            elif isinstance(event, InitFailure):
                self._add_init(time, event)
            elif isinstance(event, GpuUuid) and self._admit(event.device, -2):
                self._uuids[event.device] = event.uuid

    def _admit(self, device: str, code: int) -> bool:
        """Whether the boot may hold ``device``'s ``code``: always what it holds already;
        something new within the caps (a GPU's device is never a stray).  Counts the rest.
        ``code`` is an Xid's; the other records' are kept apart from those: an SXid's
        ``-3 - code``, an init failure's -1, a UUID line's -2."""
        codes = self._held.get(device)
        if codes is None:
            stray = not self.gpu(device)
            if stray and self._strays >= MAX_STRAYS:
                self.overflow += 1
                return False
            self._strays += stray
            codes = self._held[device] = set()
        if code not in codes:
            if len(codes) >= MAX_CODES:
                self.overflow += 1
                return False
            codes.add(code)
        return True

    def _add_xid(self, time: float, xid: Xid, seen: set[tuple[str, str, int]]) -> None:
        if xid.device is None:
            if xid.code in self.unattributed or self._admit("", xid.code):
                self.unattributed[xid.code] = self.unattributed.get(xid.code, 0) + 1
            return
        if not self._admit(xid.device, xid.code):
            return
        if xid.function is not None:
            self._functions.setdefault(xid.device, xid.function)
        key = (xid.device, xid.code)
        if ("xid", *key) in seen:
            return
        seen.add(("xid", *key))
        if xid.origin != "xid" and key in self._xids:
            return  # the fall-off is already counted (its Xid line or another telling of it)
        info = assess(xid)
        self._bursts.add(*key, time)
        self._latest["xid", *key] = self._seq
        old = self._xids.get(key)
        if old is None:
            self._xids[key] = XidCount(
                xid.code, 1, time, time, info, xid.text, xid.pid, xid.process
            )
            self._new.append(("xid", xid.device, xid.code))
            return
        if xid.code != 154 and _RANK[info.severity] < _RANK[old.info.severity]:
            info = old.info
        named = xid.origin == "xid"
        self._xids[key] = XidCount(
            old.code,
            old.count + 1,
            old.first,
            max(old.last, time),
            info,
            xid.text,
            xid.pid if named else old.pid,
            xid.process if named else old.process,
        )

    def _add_sxid(self, time: float, sxid: SXid, seen: set[tuple[str, str, int]]) -> None:
        slot = sxid.slot or f"nvswitch{sxid.switch}"
        if not self._admit(slot, -3 - sxid.code):
            return
        fatal = sxid.fatal is True
        if ("sxid", slot, sxid.code) in seen:
            return
        seen.add(("sxid", slot, sxid.code))
        old = self._sxids.get((slot, sxid.code))
        if old is None:
            self._sxids[slot, sxid.code] = SXidCount(sxid.code, 1, time, time, fatal)
            self._new.append(("sxid", slot, sxid.code))
            return
        self._sxids[slot, sxid.code] = SXidCount(
            old.code, old.count + 1, old.first, max(old.last, time), old.fatal or fatal
        )

    def _add_init(self, time: float, failure: InitFailure) -> None:
        device = device_of(failure.slot)
        if not self._admit(device, -1):
            return
        self._latest["init_failed", device, 0] = self._seq
        self._functions.setdefault(device, int(failure.slot.rpartition(".")[2]))
        old = self._init.get(device)
        if old is None:
            self._init[device] = InitCount(1, time, time, failure.detail)
            self._new.append(("init_failed", device, 0))
            return
        old.count += 1
        old.last = max(old.last, time)
        old.detail = failure.detail

    def clear(self, slot: str, kinds: tuple[str, ...]) -> None:
        """An operator cleared ``kinds`` on the GPU in ``slot`` here, in journal order: the
        records before this no longer make problems; a later one does again."""
        for kind in kinds:
            self._cleared[kind, device_of(slot)] = self._seq
        if "xid" in kinds:
            self._bursts.clear(device_of(slot))
            self._answered = None

    def _holds(self, kind: str, device: str, code: int) -> bool:
        cleared = self._cleared.get((kind, device))
        return cleared is None or self._latest.get((kind, device, code), 0) > cleared

    def _slotter(self, slots: list[str]) -> dict[str, str]:
        # Asked with the same slots tick after tick: worked out once for them.
        if slots == self._slotted[0]:
            return self._slotted[1]
        by_device: dict[str, str] = {}
        for slot in sorted(slots):
            by_device.setdefault(device_of(slot), slot)
        self._slotted = (list(slots), by_device)
        return by_device

    def _slot(self, device: str, by_device: dict[str, str]) -> str:
        slot = by_device.get(device)
        if slot is not None:
            return slot
        return f"{device}.{self._functions.get(device, 0)}"

    def _site(
        self, count: XidCount, device: str, slot: str = "", blame: Blame | None = None
    ) -> XidCount:
        """``count`` of ``device`` as the site's ``[xid]`` table has it
        (:func:`gpuagent.sources.kernel.xid.assess`), and as ``blame`` has it on ``slot``."""
        site = self._bursts.entry(self.overrides, device, count.code)
        count = count if site is None else replace(count, info=override(count.info, site))
        info = blame(slot, count) if blame is not None else None
        return count if info is None else replace(count, info=info)

    def _answers(self, slots: list[str]) -> _Answers:
        """The per-slot answers for ``slots``: asked several times a tick (the kernel's view,
        the GPUs' UUIDs for the known GPUs and the earlier boots), worked out once until a
        record is read or the table changes."""
        done = self._answered
        if done is not None and done.seq == self._seq and done.slots == slots:
            return done
        by_device = self._slotter(slots)
        slot = self._slot
        done = self._answered = _Answers(
            list(slots),
            self._seq,
            {(slot(d, by_device), code): self._site(c, d) for (d, code), c in self._xids.items()},
            {slot(d, by_device): uuid for d, uuid in self._uuids.items()},
            {slot(d, by_device): c for d, c in self._init.items()},
        )
        return done

    def counts(self, slots: list[str]) -> dict[tuple[str, int], XidCount]:
        """Every (GPU slot, Xid code) seen this boot; ``slots`` are the scanned PCI slots.
        Read-only (as :meth:`init_failures` and :meth:`uuids`): the same mapping is handed
        out until the counts change."""
        return self._answers(slots).counts

    def sxid_counts(self) -> dict[tuple[str, int], SXidCount]:
        """Every (NVSwitch slot, SXid code) seen this boot (``nvswitchN`` where no slot)."""
        return dict(self._sxids)

    def init_failures(self, slots: list[str]) -> dict[str, InitCount]:
        """``RmInitAdapter failed!`` records this boot, by GPU slot."""
        return self._answers(slots).init_failures

    def uuids(self, slots: list[str]) -> dict[str, str]:
        """GPU UUIDs the driver printed (``GPU-`` and lower-case hex, as nvidia-smi prints
        them), by GPU slot."""
        return self._answers(slots).uuids

    def findings(
        self,
        slots: list[str],
        now: float | None = None,
        hold: float | None = None,
        attribute: Attribute | None = None,
        blame: Blame | None = None,
        *,
        causes: Mapping[str, Cause] | None = None,
    ) -> dict[str, list[Finding]]:
        """Each GPU's problems of kind ``xid`` and ``init_failed``, by slot, ordered by code;
        a warning Xid ends ``hold`` s after its last record at wall time ``now``
        (:func:`finding`); ``attribute`` names the process that caused each, ``blame`` says
        what an Xid means beyond its record, ``causes`` why the driver failed a GPU, by slot
        (its init failure's cause)."""
        by_device = self._slotter(slots)
        out: dict[str, list[Finding]] = {}
        for (device, code), count in sorted(self._xids.items()):
            slot = self._slot(device, by_device)
            source = attribute(slot, count) if attribute is not None else None
            found = finding(self._site(count, device, slot, blame), now, hold, source, slot)
            if found is not None and self._holds("xid", device, code):
                out.setdefault(slot, []).append(found)
        for device, failure in sorted(self._init.items()):
            if self._holds("init_failed", device, 0):
                slot = self._slot(device, by_device)
                out.setdefault(slot, []).append(failure.finding((causes or {}).get(slot)))
        return out

    def take_new(
        self, slots: list[str], attribute: Attribute | None = None, blame: Blame | None = None
    ) -> list[First]:
        """The (GPU or NVSwitch, code) pairs first seen since the last call, oldest first;
        ``attribute`` names the process an Xid's record names, ``blame`` as :meth:`findings`."""
        by_device = self._slotter(slots)
        new, self._new = self._new, []
        out: list[First] = []
        for kind, where, code in new:
            if kind == "xid":
                slot = self._slot(where, by_device)
                c = self._site(self._xids[where, code], where, slot, blame)
                source = attribute(slot, c) if attribute is not None else None
                words, unit = source or ("", None)
                message = (
                    f"Xid {code} on GPU {slot}{words}: {c.info.name}; {advice(c.info, slot)}"
                    f" (action: {c.info.action})"
                )
                made = finding(c, source=source, slot=slot)
                out.append(First(slot, kind, code, c.first, message, made, unit))
            elif kind == "sxid":
                s = self._sxids[where, code]
                fatal = "fatal " if s.fatal else ""
                message = f"SXid {code} on NVSwitch {where}: {fatal}NVSwitch error"
                out.append(First(where, kind, code, s.first, message, None))
            else:
                f = self._init[where]
                slot = self._slot(where, by_device)
                found = f.finding()
                out.append(First(slot, kind, 0, f.first, f"GPU {slot}: {found.message}", found))
        return out
