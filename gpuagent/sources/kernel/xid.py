"""Kernel-reported GPU faults: Xid, SXid, "fallen off the bus" and RmInitAdapter (pure).

:func:`parse` turns one kernel record's whole ``MESSAGE`` into its event, read at the start of
a record the driver wrote whole (:mod:`gpuagent.sources.kernel.driverrecord`: every line with the
driver's prefix); the same words inside another subsystem's record (a tmpfs mount option any user
chooses) or on a later line of the driver's (a client's string) are no event:

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
one.  :mod:`gpuagent.sources.kernel.xidcount` counts what the records of one boot say, per GPU and
code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpuagent.configkeys import Override
from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.bus.pciaddr import DEVICE, SLOT, parse_device, slot_of
from gpuagent.sources.kernel import driverrecord
from gpuagent.sources.kernel.xidcatalog import NONE, RECOVERY_ACTIONS, lookup, override
from gpuagent.views import XidInfo

__all__ = [
    "XID_FELL_OFF",
    "Event",
    "GpuUuid",
    "InitFailure",
    "SXid",
    "Xid",
    "assess",
    "cause_of",
    "parse",
    "words",
]

# Each pattern is matched at the start of the driver's record (driverrecord.lines): its first
# line, or for the probe-time record the whole printk; never at a line further down.
_XID = re.compile(
    r"[ \t]*NVRM: Xid \((?:PCI:)?(?P<where>[^)\s]*)"
    r"(?: GPU-I:(?P<gi>\d{1,3}))?(?: GPU-CI:(?P<ci>\d{1,3}))?\): "
    r"(?P<code>\d{1,6})(?:,[ \t]*(?P<text>.*))?"
)
_COMPANION = re.compile(rf"[ \t]*NVRM: GPU (?P<slot>{SLOT}): GPU has fallen off the bus\.")
# One printk with embedded newlines, each line with its NVRM: (osapi.c); rsyslog and dmesg
# show it as three lines.
_PROBE = re.compile(
    rf"[ \t]*NVRM: The NVIDIA GPU (?P<slot>{SLOT})\s+(?:NVRM:\s+)?"
    r"\(PCI ID: [0-9a-fA-F]{4}:[0-9a-fA-F]{4}\) installed in this system has\s+(?:NVRM:\s+)?"
    r"fallen off the bus"
)
_INIT = re.compile(
    rf"[ \t]*NVRM: GPU (?P<slot>{SLOT}): RmInitAdapter failed!(?: \((?P<detail>[^)]*)\))?"
)
_SXID = re.compile(
    r"[ \t]*nvidia-nvswitch(?P<switch>\d{1,4}): SXid \((?:PCI:)?(?P<where>[^)\s]*)\): "
    r"(?P<code>\d{1,6})(?:,[ \t]*(?P<text>.*))?"
)
_UUID = re.compile(
    rf"[ \t]*NVRM: GPU at PCI:(?P<device>{DEVICE}): (?P<uuid>GPU-[0-9a-fA-F-]{{36}})\s*"
)
# The channel's owner at the head of an Xid's words: pid=48213, name=python3 (drivers 510 gave
# no name; '<unknown>' and <unknown> where the driver knows no owner).
_OWNER = re.compile(r"^pid=(?:'<unknown>'|(?P<pid>\d{1,10}))(?:, name=(?P<name>[^,]*))?(?:,|$)")
# The same head, where the driver's own words begin: after ``name=`` comes the process's
# command name, which its owner chose (commas and all).
_HEAD = re.compile(r"^pid=(?:'<unknown>'|\d{1,10})(?P<name>, name=)?(?:, |$)?")
# The kernel keeps a command name to 15 characters (TASK_COMM_LEN 16, with its NUL).
_COMM = 15
_RECOVERY = re.compile(r"\bto 0x(?P<value>[0-9a-fA-F]{1,8})(?: \((?P<label>[^)\n]*)\))?")
_FATAL = re.compile(r"\bFatal\b")
_NONFATAL = re.compile(r"\bNon-?fatal\b", re.IGNORECASE)
_UNCONTAINED = re.compile(r"\bUncontained\b")
_CONTAINED = re.compile(r"\bContained\b")
_D_RST = re.compile(r"\bD-RST: Yes\b")
_RST = re.compile(r"(?<!-)\bRST: Yes\b")

XID_FELL_OFF = 79
# kernel_rc.c's teardown words, at the end of an Xid 45 record: " caused by previous Xid %d".
_CAUSE = re.compile(r"\bcaused by previous Xid (?P<code>[0-9]{1,6})\s*$")


def cause_of(text: str) -> int | None:
    """The Xid an Xid record's words say caused it (``… Ch 00000001 caused by previous Xid
    149``, at their end: a process's name cannot put them there), or None."""
    m = _CAUSE.search(text)
    return int(m["code"]) if m else None


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

    @property
    def pid(self) -> int | None:
        """The process the driver names (``pid=``), or ``None``: none, or not known to it."""
        m = _OWNER.match(self.text)
        return int(m["pid"]) if m and m["pid"] else None

    @property
    def process(self) -> str | None:
        """The process's command name (``name=``, at most 15 characters), or ``None``."""
        m = _OWNER.match(self.text)
        name = m["name"].strip() if m and m["name"] else None
        return None if not name or name == "<unknown>" else name


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


def _small(text: str | None) -> int | None:
    return None if text is None else int(text)


def parse(message: str) -> list[Event]:
    """The event one kernel record's ``MESSAGE`` reports (``[]`` or one event): read from the
    record's first line, and only where the driver wrote the whole record
    (:func:`gpuagent.sources.kernel.driverrecord.lines`); text inside another subsystem's record, or
    on a later line of the driver's, is no event."""
    lines = driverrecord.lines(message)
    if not lines:
        return []
    first = lines[0]
    if m := _XID.fullmatch(first):
        where = parse_device(m.group("where"))
        return [
            Xid(
                where[0] if where else None,
                int(m.group("code")),
                m.group("text") or "",
                function=where[1] if where else None,
                gpu_instance=_small(m.group("gi")),
                compute_instance=_small(m.group("ci")),
            )
        ]
    for pattern, origin, text in ((_COMPANION, "companion", first), (_PROBE, "probe", message)):
        if m := pattern.match(text):
            device, function = parse_device(m.group("slot")) or ("", None)
            return [Xid(device, XID_FELL_OFF, "GPU has fallen off the bus", origin, function)]
    if m := _INIT.match(first):
        return [InitFailure(slot_of(m.group("slot")), m.group("detail") or "")]
    if m := _SXID.fullmatch(first):
        where = parse_device(m.group("where"))
        slot = f"{where[0]}.{where[1] or 0}" if where else None
        return [SXid(slot, int(m.group("switch")), int(m.group("code")), m.group("text") or "")]
    if (m := _UUID.fullmatch(first)) and (named := parse_device(m.group("device"))):
        # As nvidia-smi prints it, so that the two sources give one metric label.
        return [GpuUuid(named[0], "GPU-" + m.group("uuid")[4:].lower())]
    return []


def words(text: str) -> str:
    """The driver's own words of an Xid's ``text``, after the channel's owner (``pid=…,
    name=…, ``): the severity words are read there, never in a command name a process chose
    (``Uncontained`` as the name of a job's process).  A name holds at most 15 characters, so
    the words begin after the last ``, `` that can end one."""
    head = _HEAD.match(text)
    if head is None:
        return text
    if head["name"] is None:
        return text[head.end() :]
    start = head.end("name")
    cut = text.rfind(", ", start, start + _COMM + 2)
    return "" if cut < 0 else text[cut + 2 :]


def assess(xid: Xid, overrides: Mapping[int, Override] | None = None) -> XidInfo:
    """What ``xid`` means for its GPU: the catalog's entry, with the severity or action the
    line itself states for 94/95 (containment, ``RST:``/``D-RST:``), 144-150 (``Fatal`` /
    ``Nonfatal``; a Nonfatal 145 is the job's to restart, as NVIDIA's workflow says where no
    Xid 154 asks for more) and 154 (the new recovery action).  ``overrides``, the site's
    ``[xid]`` table by code (``Config.xid``), has the last word, but for an entry with a
    count: one record never reaches it (:mod:`gpuagent.sources.kernel.xidwindow`)."""
    site = overrides.get(xid.code) if overrides else None
    if site is not None and site.repeats is None:
        return override(assess(xid), site)
    info = lookup(xid.code)
    text = words(xid.text)
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
