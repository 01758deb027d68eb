"""Kernel-reported GPU faults: Xid, SXid, "fallen off the bus" and RmInitAdapter (pure).

:func:`parse` turns one kernel record's whole ``MESSAGE`` (it may hold several lines) into
events, anchored on the driver's own line prefixes:

* ``NVRM: Xid (PCI:0000:3b:00): 79, pid=…, name=…, <words>``: an Xid.  ``PCI:`` is optional,
  the domain has 4 to 8 hex digits, ``GPU-I:nn``/``GPU-CI:nn`` name a MIG instance, and
  ``pid=``/``name=`` come and go with driver versions.  The slot lacks the PCI function.
* ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`` (the companion of Xid 79) and the
  probe-time ``NVRM: The NVIDIA GPU 0000:3b:00.0 … fallen off the bus …`` record, which has no
  Xid line at all: both are Xid 79.
* ``NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (…)``: the driver could not set the GPU up.
* ``nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, …``: an NVSwitch's Xid (not a GPU's).
* ``NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>``: the UUID of the GPU in that slot.

A line that merely mentions an Xid ("caused by previous Xid 149", "critical error 79") is not
one.  :class:`XidCounter` counts what the records of one boot say, per GPU and code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpuagent.health import CRITICAL, WARNING, Finding
from gpuagent.xidcatalog import NONE, RECOVERY_ACTIONS, Override, XidInfo, lookup, override

__all__ = [
    "First",
    "GpuUuid",
    "InitFailure",
    "SXid",
    "SXidCount",
    "Xid",
    "XidCount",
    "XidCounter",
    "assess",
    "parse",
]

_DEVICE = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
_SLOT = _DEVICE + r"\.[0-7]"
# Each pattern starts a line of the MESSAGE: the driver's prefix, never a word inside a line.
_XID = re.compile(
    r"^[ \t]*NVRM: Xid \((?:PCI:)?(?P<where>[^)\s]*)"
    r"(?: GPU-I:(?P<gi>\d{1,3}))?(?: GPU-CI:(?P<ci>\d{1,3}))?\): "
    r"(?P<code>\d{1,6})(?:,[ \t]*(?P<text>[^\n]*))?$",
    re.MULTILINE,
)
_COMPANION = re.compile(
    rf"^[ \t]*NVRM: GPU (?P<slot>{_SLOT}): GPU has fallen off the bus\.", re.MULTILINE
)
# One printk with embedded newlines; rsyslog and dmesg show it as three lines.
_PROBE = re.compile(
    rf"^[ \t]*NVRM: The NVIDIA GPU (?P<slot>{_SLOT})\s+(?:NVRM:\s+)?"
    r"\(PCI ID: [0-9a-fA-F]{4}:[0-9a-fA-F]{4}\) installed in this system has\s+(?:NVRM:\s+)?"
    r"fallen off the bus",
    re.MULTILINE,
)
_INIT = re.compile(
    rf"^[ \t]*NVRM: GPU (?P<slot>{_SLOT}): RmInitAdapter failed!(?: \((?P<detail>[^)\n]*)\))?",
    re.MULTILINE,
)
_SXID = re.compile(
    r"^[ \t]*nvidia-nvswitch(?P<switch>\d{1,4}): SXid \((?:PCI:)?(?P<where>[^)\s]*)\): "
    r"(?P<code>\d{1,6})(?:,[ \t]*(?P<text>[^\n]*))?$",
    re.MULTILINE,
)
_UUID = re.compile(
    rf"^[ \t]*NVRM: GPU at PCI:(?P<device>{_DEVICE}): (?P<uuid>GPU-[0-9a-fA-F-]{{36}})\s*$",
    re.MULTILINE,
)
_WHERE = re.compile(rf"(?P<device>{_DEVICE})(?:\.(?P<function>[0-7]))?")
_RECOVERY = re.compile(r"\bto 0x(?P<value>[0-9a-fA-F]{1,8})(?: \((?P<label>[^)\n]*)\))?")
_FATAL = re.compile(r"\bFatal\b")
_NONFATAL = re.compile(r"\bNon-?fatal\b", re.IGNORECASE)
_UNCONTAINED = re.compile(r"\bUncontained\b")
_CONTAINED = re.compile(r"\bContained\b")
_D_RST = re.compile(r"\bD-RST: Yes\b")
_RST = re.compile(r"(?<!-)\bRST: Yes\b")

XID_FELL_OFF = 79


@dataclass(frozen=True)
class Xid:
    """An Xid a record reports.  ``device`` is the GPU's PCI ``domain:bus:device``
    (``0000:3b:00``, lower case, domain of at least 4 digits) or ``None`` when the record names
    none; ``function`` is the PCI function where the record gives it; ``text`` is the driver's
    words after the code; ``origin`` is ``xid`` (an Xid line), ``companion`` (``GPU … has
    fallen off the bus.``) or ``probe`` (the probe-time fall-off record)."""

    device: str | None
    code: int
    text: str
    origin: str = "xid"
    function: int | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class SXid:
    """An NVSwitch's SXid: ``slot`` is the NVSwitch's full PCI slot (``0000:04:00.0``), or
    ``None`` when the record names none; ``switch`` the ``nvidia-nvswitchN`` index."""

    slot: str | None
    switch: int
    code: int
    text: str

    @property
    def fatal(self) -> bool | None:
        """Whether the line calls the error fatal (``None``: it does not say)."""
        if _NONFATAL.search(self.text):
            return False
        return True if _FATAL.search(self.text) else None


@dataclass(frozen=True)
class InitFailure:
    """``RmInitAdapter failed!`` for the GPU at ``slot``; ``detail`` is the driver's code
    triple (``0x62:0x65:1792``) or ``""``."""

    slot: str
    detail: str


@dataclass(frozen=True)
class GpuUuid:
    """The driver's ``GPU at PCI:…: GPU-<uuid>`` line, printed before a GPU's first Xid."""

    device: str
    uuid: str


Event = Xid | SXid | InitFailure | GpuUuid


def _device(text: str) -> tuple[str, int | None] | None:
    m = _WHERE.fullmatch(text)
    if m is None:
        return None
    domain, bus, dev = m.group("device").lower().split(":")
    function = m.group("function")
    return f"{int(domain, 16):04x}:{bus}:{dev}", None if function is None else int(function)


def _slot(text: str) -> str:
    device, function = _device(text) or (text.lower(), 0)
    return f"{device}.{function or 0}"


def _small(text: str | None) -> int | None:
    return None if text is None else int(text)


def parse(message: str) -> list[Event]:
    """The events in one kernel record's ``MESSAGE``, in the order of their kind."""
    if "NVRM" not in message and "SXid" not in message:
        return []
    events: list[Event] = []
    for m in _XID.finditer(message):
        where = _device(m.group("where"))
        events.append(
            Xid(
                where[0] if where else None,
                int(m.group("code")),
                m.group("text") or "",
                function=where[1] if where else None,
                gpu_instance=_small(m.group("gi")),
                compute_instance=_small(m.group("ci")),
            )
        )
    for pattern, origin in ((_COMPANION, "companion"), (_PROBE, "probe")):
        for m in pattern.finditer(message):
            device, function = _device(m.group("slot")) or ("", None)
            events.append(Xid(device, XID_FELL_OFF, "GPU has fallen off the bus", origin, function))
    for m in _INIT.finditer(message):
        events.append(InitFailure(_slot(m.group("slot")), m.group("detail") or ""))
    for m in _SXID.finditer(message):
        where = _device(m.group("where"))
        slot = f"{where[0]}.{where[1] or 0}" if where else None
        events.append(
            SXid(slot, int(m.group("switch")), int(m.group("code")), m.group("text") or "")
        )
    for m in _UUID.finditer(message):
        named = _device(m.group("device"))
        if named:
            # As nvidia-smi prints it, so that the two sources give one metric label.
            events.append(GpuUuid(named[0], "GPU-" + m.group("uuid")[4:].lower()))
    return events


def assess(xid: Xid, overrides: Mapping[int, Override] | None = None) -> XidInfo:
    """What ``xid`` means for its GPU: the catalog's entry, with the severity or action the
    line itself states for 94/95 (containment, ``RST:``/``D-RST:``), 144-150 (``Fatal`` /
    ``Nonfatal``; a Nonfatal 145 is the job's to restart, as NVIDIA's workflow says where no
    Xid 154 asks for more) and 154 (the new recovery action).  ``overrides``, the site's
    ``[xid]`` table by code (``Config.xid``), has the last word."""
    if overrides and xid.code in overrides:
        return override(assess(xid), overrides[xid.code])
    info = lookup(xid.code)
    text = xid.text
    if xid.code in (94, 95):
        if _UNCONTAINED.search(text):
            return replace(lookup(95), severity=CRITICAL, action="reset_gpu")
        if _D_RST.search(text):
            return replace(info, severity=CRITICAL, action="drain_and_reset")
        if _RST.search(text):
            return replace(info, severity=CRITICAL, action="reset_gpu")
        if _CONTAINED.search(text):
            return lookup(94)
        return info
    if 144 <= xid.code <= 150:
        if _NONFATAL.search(text):
            link = "restart_app" if xid.code == 145 else "none"
            return replace(info, severity=WARNING, action=link, advice="a non-fatal link error")
        if _FATAL.search(text):
            return replace(info, severity=CRITICAL, action="reset_gpu", advice="a fatal link error")
        return info
    if xid.code == 154:
        m = _RECOVERY.search(text)
        action = RECOVERY_ACTIONS.get(int(m.group("value"), 16)) if m else None
        if m is None or action is None:
            return info
        label = m.group("label") or f"0x{m.group('value')}"
        if action == "none":
            return replace(info, severity=NONE, action=action, advice=f"now {label}")
        return replace(info, action=action, advice=f"the driver says: {label}")
    return info


_RANK = {NONE: 0, WARNING: 1, CRITICAL: 2}


@dataclass
class XidCount:
    """One (GPU, Xid code) of this boot: ``count`` records, the ``first`` and ``last`` one's
    time (s since the epoch), what it means (``info``: the worst seen; for 154 the latest)
    and the last record's words (``text``)."""

    code: int
    count: int
    first: float
    last: float
    info: XidInfo
    text: str

    def finding(self, now: float | None = None, hold: float | None = None) -> Finding | None:
        """The GPU's problem of kind ``xid`` this code makes, or ``None`` (counted only).

        A warning no longer holds once ``hold`` seconds (``Config.xid_warning_hold``) have
        passed since the code's last record without a recurrence: ``now`` is wall time in
        seconds since the epoch, the clock of :attr:`last`.  Without ``now`` and ``hold`` it
        holds until the next boot; a critical one always does."""
        if self.info.severity == NONE:
            return None
        if (
            self.info.severity == WARNING
            and now is not None
            and hold is not None
            and now - self.last >= hold
        ):
            return None
        return Finding(
            "xid",
            self.info.severity,
            self.info.action,
            f"Xid {self.code} ({self.info.name}): {self.info.advice}",
            (("xid", self.code),),
        )


@dataclass
class SXidCount:
    """One (NVSwitch, SXid code) of this boot: records, first and last time (s since the
    epoch), and whether any of its lines called it fatal."""

    code: int
    count: int
    first: float
    last: float
    fatal: bool = False


@dataclass
class InitCount:
    """``RmInitAdapter failed!`` records for one GPU this boot and the last one's detail."""

    count: int
    first: float
    last: float
    detail: str

    def finding(self) -> Finding:
        """The GPU's problem of kind ``init_failed``."""
        detail = f" ({self.detail})" if self.detail else ""
        return Finding(
            "init_failed",
            CRITICAL,
            "reboot",
            f"the driver could not initialise the GPU (RmInitAdapter failed{detail}); "
            "reboot the host, and if it repeats check the GPU's power and seating",
        )


@dataclass(frozen=True)
class First:
    """The first record this boot of a (GPU or NVSwitch, code): ``kind`` is ``xid``,
    ``sxid`` or ``init_failed``; ``code`` is 0 for ``init_failed``; ``finding`` is the health
    problem it starts (``None``: counted only, or an NVSwitch); ``message`` is one line for the
    journal.  Where ``finding`` is set, the health problem's start line should be this line."""

    slot: str
    kind: str
    code: int
    time: float
    message: str
    finding: Finding | None


class XidCounter:
    """Counts one boot's kernel records by (GPU, code), (NVSwitch, SXid) and init failures.

    Feed it every kernel record of the boot in order with :meth:`add`.  One record counts once
    per (GPU, code) it names; a GPU falling off the bus counts as one Xid 79 however many
    records tell of it (the Xid line, its companion, the probe-time record).

    Xid lines give a GPU's ``domain:bus:device`` only; the queries take the PCI slots the
    agent scanned (``0000:3b:00.0``) and report each GPU under its own slot (``.0`` where the
    GPU is not on the bus any more and no record named its function).
    """

    def __init__(self) -> None:
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

    def add(self, time: float, message: str) -> None:
        """Count one kernel record logged at ``time`` (s since the epoch)."""
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
            else:
                self._uuids[event.device] = event.uuid

    def _add_xid(self, time: float, xid: Xid, seen: set[tuple[str, str, int]]) -> None:
        if xid.device is None:
            self.unattributed[xid.code] = self.unattributed.get(xid.code, 0) + 1
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
        old = self._xids.get(key)
        if old is None:
            self._xids[key] = XidCount(xid.code, 1, time, time, info, xid.text)
            self._new.append(("xid", xid.device, xid.code))
            return
        old.count += 1
        old.last = max(old.last, time)
        old.text = xid.text
        if xid.code == 154 or _RANK[info.severity] >= _RANK[old.info.severity]:
            old.info = info

    def _add_sxid(self, time: float, sxid: SXid, seen: set[tuple[str, str, int]]) -> None:
        slot = sxid.slot or f"nvswitch{sxid.switch}"
        fatal = sxid.fatal is True
        if ("sxid", slot, sxid.code) in seen:
            return
        seen.add(("sxid", slot, sxid.code))
        old = self._sxids.get((slot, sxid.code))
        if old is None:
            self._sxids[slot, sxid.code] = SXidCount(sxid.code, 1, time, time, fatal)
            self._new.append(("sxid", slot, sxid.code))
            return
        old.count += 1
        old.last = max(old.last, time)
        old.fatal = old.fatal or fatal

    def _add_init(self, time: float, failure: InitFailure) -> None:
        device, _, function = failure.slot.rpartition(".")
        self._functions.setdefault(device, int(function))
        old = self._init.get(device)
        if old is None:
            self._init[device] = InitCount(1, time, time, failure.detail)
            self._new.append(("init_failed", device, 0))
            return
        old.count += 1
        old.last = max(old.last, time)
        old.detail = failure.detail

    def _slotter(self, slots: list[str]) -> dict[str, str]:
        by_device: dict[str, str] = {}
        for slot in sorted(slots):
            by_device.setdefault(slot.rpartition(".")[0], slot)
        return by_device

    def _slot(self, device: str, by_device: dict[str, str]) -> str:
        slot = by_device.get(device)
        if slot is not None:
            return slot
        return f"{device}.{self._functions.get(device, 0)}"

    def counts(self, slots: list[str]) -> dict[tuple[str, int], XidCount]:
        """Every (GPU slot, Xid code) seen this boot; ``slots`` are the scanned PCI slots."""
        by_device = self._slotter(slots)
        return {(self._slot(d, by_device), code): c for (d, code), c in self._xids.items()}

    def sxid_counts(self) -> dict[tuple[str, int], SXidCount]:
        """Every (NVSwitch slot, SXid code) seen this boot (``nvswitchN`` where no slot)."""
        return dict(self._sxids)

    def init_failures(self, slots: list[str]) -> dict[str, InitCount]:
        """``RmInitAdapter failed!`` records this boot, by GPU slot."""
        by_device = self._slotter(slots)
        return {self._slot(d, by_device): c for d, c in self._init.items()}

    def uuids(self, slots: list[str]) -> dict[str, str]:
        """GPU UUIDs the driver printed (``GPU-`` and lower-case hex, as nvidia-smi prints
        them), by GPU slot."""
        by_device = self._slotter(slots)
        return {self._slot(d, by_device): uuid for d, uuid in self._uuids.items()}

    def findings(self, slots: list[str]) -> dict[str, list[Finding]]:
        """Each GPU's problems of kind ``xid`` and ``init_failed``, by slot, ordered by code."""
        by_device = self._slotter(slots)
        out: dict[str, list[Finding]] = {}
        for (device, _), count in sorted(self._xids.items()):
            finding = count.finding()
            if finding is not None:
                out.setdefault(self._slot(device, by_device), []).append(finding)
        for device, failure in sorted(self._init.items()):
            out.setdefault(self._slot(device, by_device), []).append(failure.finding())
        return out

    def take_new(self, slots: list[str]) -> list[First]:
        """The (GPU or NVSwitch, code) pairs first seen since the last call, oldest first."""
        by_device = self._slotter(slots)
        new, self._new = self._new, []
        out: list[First] = []
        for kind, where, code in new:
            if kind == "xid":
                c = self._xids[where, code]
                slot = self._slot(where, by_device)
                finding = c.finding()
                message = (
                    f"Xid {code} on GPU {slot}: {c.info.name}; {c.info.advice}"
                    f" (action: {c.info.action})"
                )
                out.append(First(slot, kind, code, c.first, message, finding))
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
