"""One boot's kernel records counted: Xids per (GPU, code), SXids per (NVSwitch, code) and
``RmInitAdapter failed!`` per GPU (pure).

Records are parsed by :mod:`gpuagent.sources.kernel.xid`; :class:`XidCounter` is fed every
kernel record of the boot in order, tallies them by device
(:class:`~gpuagent.sources.kernel.xidtally.Tally`) and answers by the PCI slots the agent
scanned, with the site's ``[xid]`` table.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from gpuagent.configkeys import Override
from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.bus.pciaddr import device_of
from gpuagent.sources.kernel.drivercatalog import Cause
from gpuagent.sources.kernel.xid import Xid, assess, cause_of
from gpuagent.sources.kernel.xidcatalog import NONE, advice, override
from gpuagent.sources.kernel.xidtally import Caps, InitCount, Tally
from gpuagent.sources.kernel.xidwindow import Bursts
from gpuagent.views import Finding, SXidCount, XidCount, XidHeard, XidInfo

__all__ = ["MAX_CODES", "MAX_STRAYS", "Attribute", "First", "XidCounter", "finding"]

# What one boot may hold, however many records a flood brings: the devices (and NVSwitches)
# that are no GPU the agent knows of, and the codes of any one device.  Past either, a
# record naming something new is only counted (XidCounter.overflow).
MAX_STRAYS = 64
MAX_CODES = 256
# Xid records held for the victims between two steps (a flood keeps the latest).
HEARD_MAX = 256
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
        self._tally = Tally(Caps(gpu, MAX_STRAYS, MAX_CODES), on_xid=self._took)
        # The Xid records taken since take_heard last ran (the victims'), the latest kept.
        self._heard: deque[tuple[float, Xid, str]] = deque(maxlen=HEARD_MAX)
        # The slots the queries were last asked with, and their devices (see _slotter).
        self._slotted: tuple[list[str], dict[str, str]] = ([], {})
        # The per-slot answers for those slots, and the record they were worked out after.
        self._answered: _Answers | None = None

    @property
    def overrides(self) -> Mapping[int, Override]:
        """The site's ``[xid]`` table the answers follow."""
        return self._overrides

    @overrides.setter
    def overrides(self, table: Mapping[int, Override]) -> None:
        self._overrides = table
        self._bursts.reload(table)
        self._answered = None

    @property
    def overflow(self) -> int:
        """Records not held for the caps (:data:`MAX_STRAYS`, :data:`MAX_CODES`)."""
        return self._tally.caps.overflow

    @property
    def unattributed(self) -> dict[int, int]:
        """Xids whose record named no readable slot (a redacted ``PCI:...``), by code."""
        return self._tally.unattributed

    @property
    def records(self) -> int:
        """Records that told of any driver event (an Xid, an SXid, a UUID line …)."""
        return self._tally.records

    def add(self, time: float, message: str) -> None:
        """Count one kernel record logged at ``time`` (s since the epoch)."""
        self._tally.add(time, message)

    def _took(self, time: float, xid: Xid) -> None:
        device = xid.device or ""
        self._bursts.add(device, xid.code, time)
        if xid.origin == "xid":
            site = self._bursts.entry(self.overrides, device, xid.code)
            info = assess(xid)
            self._heard.append(
                (time, xid, (info if site is None else override(info, site)).severity)
            )

    def take_heard(self, slots: list[str]) -> list[XidHeard]:
        """The Xid records taken since the last call (the latest :data:`HEARD_MAX`), each on
        its GPU's slot among ``slots``, with its severity as the site judges it."""
        by_device = self._slotter(slots)
        heard, self._heard = list(self._heard), deque(maxlen=HEARD_MAX)
        return [
            XidHeard(
                self._slot(x.device or "", by_device),
                x.code,
                time,
                x.pid,
                x.process,
                cause_of(x.text),
                severity,
            )
            for time, x, severity in heard
        ]

    def clear(self, slot: str, kinds: tuple[str, ...]) -> None:
        """An operator cleared ``kinds`` on the GPU in ``slot`` here, in journal order: the
        records before this no longer make problems; a later one does again."""
        self._tally.clear(slot, kinds)
        if "xid" in kinds:
            self._bursts.clear(device_of(slot))
            self._answered = None

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
        return f"{device}.{self._tally.functions.get(device, 0)}"

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
        if done is not None and done.seq == self._tally.seq and done.slots == slots:
            return done
        by_device = self._slotter(slots)
        slot, tally = self._slot, self._tally
        done = self._answered = _Answers(
            list(slots),
            tally.seq,
            {(slot(d, by_device), code): self._site(c, d) for (d, code), c in tally.xids.items()},
            {slot(d, by_device): uuid for d, uuid in tally.uuids.items()},
            {slot(d, by_device): c for d, c in tally.init.items()},
        )
        return done

    def counts(self, slots: list[str]) -> dict[tuple[str, int], XidCount]:
        """Every (GPU slot, Xid code) seen this boot; ``slots`` are the scanned PCI slots.
        Read-only (as :meth:`init_failures` and :meth:`uuids`): the same mapping is handed
        out until the counts change."""
        return self._answers(slots).counts

    def sxid_counts(self) -> dict[tuple[str, int], SXidCount]:
        """Every (NVSwitch slot, SXid code) seen this boot (``nvswitchN`` where no slot)."""
        return dict(self._tally.sxids)

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
        tally = self._tally
        out: dict[str, list[Finding]] = {}
        for (device, code), count in sorted(tally.xids.items()):
            slot = self._slot(device, by_device)
            source = attribute(slot, count) if attribute is not None else None
            found = finding(self._site(count, device, slot, blame), now, hold, source, slot)
            if found is not None and tally.holds("xid", device, code):
                out.setdefault(slot, []).append(found)
        for device, failure in sorted(tally.init.items()):
            if tally.holds("init_failed", device, 0):
                slot = self._slot(device, by_device)
                out.setdefault(slot, []).append(failure.finding((causes or {}).get(slot)))
        return out

    def take_new(
        self, slots: list[str], attribute: Attribute | None = None, blame: Blame | None = None
    ) -> list[First]:
        """The (GPU or NVSwitch, code) pairs first seen since the last call, oldest first;
        ``attribute`` names the process an Xid's record names, ``blame`` as :meth:`findings`."""
        by_device = self._slotter(slots)
        tally = self._tally
        new, tally.new = tally.new, []
        out: list[First] = []
        for kind, where, code in new:
            if kind == "xid":
                slot = self._slot(where, by_device)
                c = self._site(tally.xids[where, code], where, slot, blame)
                source = attribute(slot, c) if attribute is not None else None
                words, unit = source or ("", None)
                message = (
                    f"Xid {code} on GPU {slot}{words}: {c.info.name}; {advice(c.info, slot)}"
                    f" (action: {c.info.action})"
                )
                made = finding(c, source=source, slot=slot)
                out.append(First(slot, kind, code, c.first, message, made, unit))
            elif kind == "sxid":
                s = tally.sxids[where, code]
                fatal = "fatal " if s.fatal else ""
                message = f"SXid {code} on NVSwitch {where}: {fatal}NVSwitch error"
                out.append(First(where, kind, code, s.first, message, None))
            else:
                f = tally.init[where]
                slot = self._slot(where, by_device)
                found = f.finding()
                out.append(First(slot, kind, 0, f.first, f"GPU {slot}: {found.message}", found))
        return out
