"""The kernel's PCIe AER records (pure): read with the rest of the boot's kernel records, for
the PCIe source (:mod:`gpuagent.sources.pcie`) and for an Xid 79 that follows them.

A record is the AER driver's line for an error message that a root port (or a root complex
event collector) received, naming the device the message came from, its source:

* ``pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010`` (to Linux
  4.16: the requester id, bus and devfn, in the port's domain);
* ``pcieport 0000:00:01.1: AER: Corrected error received: 0000:00:00.0`` (4.17 to 6.6);
* ``pcieport 0000:00:1b.2: AER: Uncorrectable (Fatal) error message received from
  0000:03:04.0`` (6.7 on); each with ``Multiple`` before it for several at once;
* on a host where the firmware handles PCIe errors first, ``pcieport 0000:00:02.0: AER:
  aer_status: 0x00000020, aer_mask: 0x00000000``: the erring device's own registers, of an
  error whose severity the line does not give (kind ``reported``).

The device that erred is the source, not the port that printed.  Only the kernel's own
records are read (``_TRANSPORT=kernel``, which journald sets): no user can log one.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpuagent.sources.bus.pciaddr import SLOT, path_role
from gpuagent.views import AerHeard, AerRecord, XidInfo

__all__ = [
    "FALLEN_OFF",
    "LOOKBACK",
    "RECENT",
    "SEEN_AFTER",
    "Heard",
    "fallen_off",
    "record",
    "recovery",
]

# The records an Xid 79 looks back on: the latest, whatever a storm of correctable ones brings;
# and the (device, kind) pairs counted, past which a record naming a new one is not.
RECENT = 512
_MAX_DEVICES = 256
# The Xid of a GPU fallen off the bus, which errors on its path may explain.
FALLEN_OFF = 79
# How long before an Xid 79 an error above the GPU on its path blames the path (s).
LOOKBACK = 3600.0
# How long after an Xid 79 a rise of the path's AER counters, as the agent saw it, counts:
# they are read each tick, the rise seen a tick or two after the errors.
SEEN_AFTER = 60.0
_RECORD = re.compile(
    rf"^\S+ (?P<port>{SLOT}): AER: (?:Multiple )?"
    r"(?P<kind>Correct(?:ed|able)|Uncorrect(?:ed|able) \((?:Non-)?Fatal\)) error (?:message )?"
    rf"received(?:: | from )(?:(?P<source>{SLOT})|id=(?P<id>[0-9a-fA-F]{{4}}))",
    re.ASCII,
)
# Firmware-first hosts (APEI/GHES: the firmware handles the error and hands the kernel its
# record) print no "error received" line: cper_print_aer (drivers/pci/pcie/aer.c) prints the
# registers of the device that erred, "pcieport 0000:00:02.0: AER: aer_status: 0x00000020,
# aer_mask: 0x00000000", then "aer_layer=…".  Its severity is not on the line: kind
# "reported", which an Xid 79 looks back on and pcie_error's counts leave out.
_FIRMWARE_FIRST = re.compile(
    rf"^\S+ (?P<source>{SLOT}): AER: aer_status: 0x[0-9a-fA-F]{{8}}, aer_mask: 0x[0-9a-fA-F]{{8}}$",
    re.ASCII,
)
# A kind as a message says it.
WORDS = {
    "fatal": "fatal",
    "nonfatal": "non-fatal",
    "correctable": "correctable",
    "reported": "firmware-reported",
}
# The kernel's word on its recovery from an uncorrectable error (pcie_do_recovery in
# drivers/pci/pcie/err.c: "device recovery successful", "device recovery failed"; before
# 4.19 "AER: Device recovery …" from aerdrv_core.c), printed by the port that ran it.
_RECOVERY = re.compile(
    rf"^\S+ (?P<port>{SLOT}): AER: [Dd]evice recovery (?P<outcome>successful|failed)$",
    re.ASCII,
)


def recovery(message: str) -> tuple[str, bool] | None:
    """The port and outcome (True: successful) of a kernel recovery record, or None."""
    m = _RECOVERY.match(message.rstrip("\n"))
    return (m["port"].lower(), m["outcome"] == "successful") if m else None


def record(time: float, message: str) -> AerRecord | None:
    """The AER record a kernel message logged at ``time`` (wall s) is, or None."""
    if "AER: " not in message:
        return None
    m = _RECORD.match(message)
    if m is None:
        if f := _FIRMWARE_FIRST.match(message.rstrip("\n")):
            device = f["source"].lower()
            return AerRecord(time, device, device, "reported")
        return None
    port = m["port"].lower()
    source = m["source"]
    if source is None:
        # The requester id: bus (8 bits), device (5), function (3), in the port's domain.
        rid = int(m["id"], 16)
        domain = port.rsplit(":", 2)[0]
        source = f"{domain}:{rid >> 8:02x}:{(rid >> 3) & 0x1F:02x}.{rid & 7}"
    words = m["kind"].lower()
    kind = "correctable" if words.startswith("correct") else "nonfatal"
    if kind == "nonfatal" and "non-fatal" not in words:
        kind = "fatal"
    return AerRecord(time, port, source.lower(), kind)


class Heard:
    """This boot's AER records as read (:meth:`add` each kernel message in journal order);
    :attr:`view` is what a tick sees, made anew only after a record."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], tuple[int, float]] = {}
        self._recent: deque[AerRecord] = deque(maxlen=RECENT)
        self._recoveries: dict[str, tuple[float, bool]] = {}
        self._view = AerHeard()
        self._changed = False

    def add(self, time: float, message: str) -> None:
        """Take one kernel message logged at ``time`` (wall s), if it is an AER record."""
        found = record(time, message)
        if found is None:
            outcome = recovery(message)
            if outcome is not None and (
                outcome[0] in self._recoveries or len(self._recoveries) < _MAX_DEVICES
            ):
                self._recoveries[outcome[0]] = (time, outcome[1])
                self._changed = True
            return
        self._recent.append(found)
        key = (found.source, found.kind)
        count, _ = self._counts.get(key, (0, 0.0))
        if count or len(self._counts) < _MAX_DEVICES:
            self._counts[key] = (count + 1, time)
        self._changed = True

    @property
    def view(self) -> AerHeard:
        """The records so far (:class:`gpuagent.views.AerHeard`)."""
        if self._changed:
            self._view = AerHeard(dict(self._counts), tuple(self._recent), dict(self._recoveries))
            self._changed = False
        return self._view


def fallen_off(
    info: XidInfo,
    path: tuple[str, ...],
    recent: Iterable[AerRecord],
    at: float,
    rose: Mapping[str, tuple[float, str]] | None = None,
) -> XidInfo | None:
    """An Xid 79's ``info`` blamed on its path, or None: where, within :data:`LOOKBACK` s
    before its first record (``at``, wall s), the kernel logged AER errors of a function
    above the GPU (``path`` without its last entry, the GPU), or the AER counters of one rose
    (``rose``: each function's last rise as the agent saw it, wall s, and its kind; a rise
    seen up to :data:`SEEN_AFTER` s after the Xid counts, the counters being read a tick
    late), the latest of them names that function, and the action is ``check_host`` there:
    the slot, riser, cable or switch."""
    above = path[:-1]
    hits = [r for r in recent if r.source in above and at - LOOKBACK <= r.time <= at]
    counted = [
        AerRecord(min(t, at), d, d, kind)
        for d, (t, kind) in (rose or {}).items()
        if d in above and at - LOOKBACK <= t <= at + SEEN_AFTER
    ]
    if not hits and not counted:
        return None
    last = max([*hits, *counted], key=lambda r: r.time)
    kinds = {r.kind for r in [*hits, *counted] if r.source == last.source}
    said = " and ".join(w for k, w in WORDS.items() if k in kinds)
    when = f"{at - last.time:.0f} s before" if last in hits else "about when it fell"
    return replace(
        info,
        action="check_host",
        advice=(
            f"its path logged PCIe {said} errors at {last.source}, "
            f"{path_role(above.index(last.source), len(path))}, {when}: check the slot, "
            f"riser, cable or switch there (lspci -vvv -s {last.source}) before the board; "
            "reboot the host to bring the GPU back"
        ),
    )
