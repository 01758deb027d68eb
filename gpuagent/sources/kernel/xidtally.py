"""One boot's kernel records tallied in journal order: each (GPU device, Xid code)'s count,
each (NVSwitch, SXid)'s, each GPU's ``RmInitAdapter failed!`` records, the driver's UUID lines,
and root's clears among them (pure).

:class:`Tally` is what :class:`~gpuagent.sources.kernel.xidcount.XidCounter` counts into; it
knows devices, not slots, nor the site's ``[xid]`` table: the counter answers with those.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.bus.pciaddr import device_of
from gpuagent.sources.kernel.drivercatalog import DEFAULT_FIX, Cause, explain
from gpuagent.sources.kernel.xid import GpuUuid, InitFailure, SXid, Xid, assess, parse
from gpuagent.sources.kernel.xidcatalog import NONE
from gpuagent.views import Finding, SXidCount, XidCount

__all__ = ["Caps", "InitCount", "Tally"]

_RANK = {NONE: 0, WARNING: 1, CRITICAL: 2}


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


class Caps:
    """What one boot may hold, however many records a flood brings: ``strays`` devices (and
    NVSwitches) that are not ``gpu`` (a GPU's device is never a stray), and ``codes`` codes of
    any one device.  Past either, a record naming something new is only counted
    (:attr:`overflow`)."""

    def __init__(self, gpu: Callable[[str], bool], strays: int, codes: int) -> None:
        # Whether a device (``0000:3b:00``) is a GPU the agent knows of: those are held
        # whatever the cap says; the kernel source sets it as it learns.
        self.gpu = gpu
        self._limits = (strays, codes)
        # Each device (or NVSwitch slot) held, and its codes.
        self._held: dict[str, set[int]] = {}
        self._strays = 0
        # Records not held for the caps: they named a new device past the strays' cap or a
        # new code past the codes'.
        self.overflow = 0

    def admit(self, device: str, code: int) -> bool:
        """Whether the boot may hold ``device``'s ``code``: always what it holds already;
        something new within the caps (a GPU's device is never a stray).  Counts the rest.
        ``code`` is an Xid's; the other records' are kept apart from those: an SXid's
        ``-3 - code``, an init failure's -1, a UUID line's -2."""
        max_strays, max_codes = self._limits
        codes = self._held.get(device)
        if codes is None:
            stray = not self.gpu(device)
            if stray and self._strays >= max_strays:
                self.overflow += 1
                return False
            self._strays += stray
            codes = self._held[device] = set()
        if code not in codes:
            if len(codes) >= max_codes:
                self.overflow += 1
                return False
            codes.add(code)
        return True


class Tally:
    """Fed every kernel record of the boot in order (:meth:`add`); holds what ``caps``
    admits.  One record counts once per (GPU, code) it names; a GPU falling off the bus counts
    as one Xid 79 however many records tell of it (the Xid line, its companion, the
    probe-time record)."""

    def __init__(self, caps: Caps, on_xid: Callable[[float, Xid], None] | None = None) -> None:
        self.caps = caps
        # Told each Xid record held, at its time (the counter's count-in-window and victims).
        self.on_xid = on_xid
        self.xids: dict[tuple[str, int], XidCount] = {}
        self.sxids: dict[tuple[str, int], SXidCount] = {}
        self.init: dict[str, InitCount] = {}
        # Each device's function, as a record named it (a GPU no longer on the bus).
        self.functions: dict[str, int] = {}
        self.uuids: dict[str, str] = {}
        # The (kind, device or NVSwitch, code) first seen since the counter last took them.
        self.new: list[tuple[str, str, int]] = []
        # Xids whose record named no readable slot (a redacted "PCI:..."), by code.
        self.unattributed: dict[int, int] = {}
        # Records that told of any driver event (an Xid, an SXid, a UUID line …).
        self.records = 0
        # Journal order: every record's number, each (kind, device, code)'s last one, and
        # each (kind, device)'s operator's clear (see clear()).
        self.seq = 0
        self._latest: dict[tuple[str, str, int], int] = {}
        self._cleared: dict[tuple[str, str], int] = {}

    def add(self, time: float, message: str) -> None:
        """Count one kernel record logged at ``time`` (s since the epoch)."""
        self.seq += 1
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
            elif isinstance(event, GpuUuid) and self.caps.admit(event.device, -2):
                self.uuids[event.device] = event.uuid

    def _add_xid(self, time: float, xid: Xid, seen: set[tuple[str, str, int]]) -> None:
        if xid.device is None:
            if xid.code in self.unattributed or self.caps.admit("", xid.code):
                self.unattributed[xid.code] = self.unattributed.get(xid.code, 0) + 1
            return
        if not self.caps.admit(xid.device, xid.code):
            return
        if xid.function is not None:
            self.functions.setdefault(xid.device, xid.function)
        key = (xid.device, xid.code)
        if ("xid", *key) in seen:
            return
        seen.add(("xid", *key))
        if xid.origin != "xid" and key in self.xids:
            return  # the fall-off is already counted (its Xid line or another telling of it)
        info = assess(xid)
        if self.on_xid is not None:
            self.on_xid(time, xid)
        self._latest[("xid", key[0], key[1])] = self.seq
        old = self.xids.get(key)
        if old is None:
            self.xids[key] = XidCount(xid.code, 1, time, time, info, xid.text, xid.pid, xid.process)
            self.new.append(("xid", xid.device, xid.code))
            return
        if xid.code != 154 and _RANK[info.severity] < _RANK[old.info.severity]:
            info = old.info
        named = xid.origin == "xid"
        self.xids[key] = XidCount(
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
        if not self.caps.admit(slot, -3 - sxid.code):
            return
        fatal = sxid.fatal is True
        if ("sxid", slot, sxid.code) in seen:
            return
        seen.add(("sxid", slot, sxid.code))
        old = self.sxids.get((slot, sxid.code))
        if old is None:
            self.sxids[slot, sxid.code] = SXidCount(sxid.code, 1, time, time, fatal)
            self.new.append(("sxid", slot, sxid.code))
            return
        self.sxids[slot, sxid.code] = SXidCount(
            old.code, old.count + 1, old.first, max(old.last, time), old.fatal or fatal
        )

    def _add_init(self, time: float, failure: InitFailure) -> None:
        device = device_of(failure.slot)
        if not self.caps.admit(device, -1):
            return
        self._latest["init_failed", device, 0] = self.seq
        self.functions.setdefault(device, int(failure.slot.rpartition(".")[2]))
        old = self.init.get(device)
        if old is None:
            self.init[device] = InitCount(1, time, time, failure.detail)
            self.new.append(("init_failed", device, 0))
            return
        old.count += 1
        old.last = max(old.last, time)
        old.detail = failure.detail

    def clear(self, slot: str, kinds: tuple[str, ...]) -> None:
        """An operator cleared ``kinds`` on the GPU in ``slot`` here, in journal order: the
        records before this no longer make problems; a later one does again."""
        for kind in kinds:
            self._cleared[kind, device_of(slot)] = self.seq

    def holds(self, kind: str, device: str, code: int) -> bool:
        """Whether ``device``'s records of ``kind`` and ``code`` still make a problem: no clear
        of the kind, or a record of the code after the last one."""
        cleared = self._cleared.get((kind, device))
        return cleared is None or self._latest.get((kind, device, code), 0) > cleared
