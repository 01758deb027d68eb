"""How NVIDIA's kernel module's own words are read: which record is which message of the
catalog (:mod:`gpuagent.sources.kernel.drivermessages`, every message the driver writes when
it cannot initialise, probe or keep a GPU), and which one is a GPU's cause this boot (pure).

The driver names the GPU in a probe-time record (``0000:3b:00.0``); RM's own records during
RmInitAdapter name it by instance (``GPU0``) or not at all, and are the cause of the
``RmInitAdapter failed!`` record that follows and names the slot; a probe-time record that
names no GPU (``pci_enable_device failed``) is the cause of the kernel's ``probe of SLOT
failed`` that follows it (:class:`Causes`).  A GPU's ``init_failed`` or ``no_driver`` takes
its cause from them (:func:`explain`): a reboot is the action only where a reboot can help (it
loads the same module, the same firmware, the same BIOS layout); a host fix names what to
change.

Each entry has a severity and a scope.  A GPU keeps the first of its strongest causes this
boot: a critical one over a warning (an MSI fallback, a BAR resize refused: the driver goes
on), and a specific one over RM's stage lines (``Cannot pre-initialize the device``), which
RmInitAdapter prints after the line that says why; a warning is only said beside the generic
advice, never the action.  Module-wide entries (``No NVIDIA GPU found``, the probe's counts,
API mismatch) name no GPU and are never a GPU's cause: they are ``no_driver_module``'s
reasons (:func:`gpuagent.sources.driver.driver.absence_reason`).  The failure itself
(``RmInitAdapter failed!``, the Xid catalog's lost GPU) is another reader's problem and never
a cause.  Each record is read where the driver wrote all of it
(:mod:`gpuagent.sources.kernel.driverrecord`), or for the firmware loader's and the probe's
failure, the kernel's own one-line record.
"""

from __future__ import annotations

import re

from gpuagent.health import CRITICAL
from gpuagent.sources.bus.pciaddr import SLOT, slot_of
from gpuagent.sources.kernel import driverrecord
from gpuagent.sources.kernel.drivercause import DEFAULT_FIX, Cause
from gpuagent.sources.kernel.drivermessages import CATALOG

__all__ = ["CATALOG", "DEFAULT_FIX", "Cause", "Causes", "explain", "parse"]

# The kernel's firmware loader, for the driver's device: "nvidia 0000:3b:00.0: Direct firmware
# load for nvidia/595.45.04/gsp_ga10x.bin failed with error -2" (a one-line kernel record).
_FIRMWARE_LOAD = re.compile(
    rf"nvidia (?P<slot>{SLOT}): Direct firmware load for nvidia/[\w.-]{{1,32}}/gsp_\w{{1,32}}\.bin "
    r"failed with error -\d{1,4}"
)
# The kernel's driver core when the probe failed (the probe returns -1): "nvidia: probe of
# 0000:3b:00.0 failed with error -1" (older kernels), "nvidia 0000:3b:00.0: probe with driver
# nvidia failed with error -1" (drivers/base/dd.c); a one-line kernel record.
_PROBE_FAILED = re.compile(
    rf"nvidia(?:: probe of (?P<old>{SLOT})| (?P<slot>{SLOT}): probe with driver nvidia) "
    r"failed with error -\d{1,4}"
)
# The driver's record of the failure a waiting cause is the cause of (osinit.c, nv.c).
_FAILED = "rm_init_adapter_failed"
_MISSING_FILE = next(c for _, c in CATALOG if c.name == "gsp_firmware_missing")
# Any entry at all, in one match: most of the driver's records (its Xids) are none, and one
# scan in the regex engine costs a fraction of a loop over every entry.
_ANY = re.compile("|".join(f"(?:{p.pattern.replace('(?P<slot>', '(?:')})" for p, _ in CATALOG))


def parse(message: str) -> tuple[str | None, Cause] | None:
    """The GPU (its slot; None where the record names it only by RM's instance, or not at
    all) and the catalog's entry one kernel record's ``MESSAGE`` is, or None."""
    return _parse(message, driverrecord.lines(message))


def _parse(message: str, lines: list[str]) -> tuple[str | None, Cause] | None:
    """:func:`parse` of ``message``, its ``lines`` where the driver wrote it whole (``[]``:
    not so)."""
    if m := _FIRMWARE_LOAD.fullmatch(message.rstrip("\n")):
        return slot_of(m["slot"]), _MISSING_FILE
    if not lines:
        return None
    head = driverrecord.PREFIX.sub("", lines[0], count=1)
    rest = "\n".join([head, *lines[1:]])
    if not _ANY.match(rest):
        return None
    for pattern, cause in CATALOG:
        if m := pattern.match(rest):
            slot = m.groupdict().get("slot")
            return (slot_of(slot) if slot else None), cause
    return None


def explain(cause: Cause | None, action: str, default: str) -> tuple[str, str]:
    """A GPU failure's action and the words after what failed: ``action`` and ``default``
    (the generic advice, with its leading separator) where the driver gave no ``cause``;
    a critical cause's own action and ": means; fix"; a warning's, only said beside the
    generic advice (the driver went on after it: it need not be why the GPU failed)."""
    if cause is None:
        return action, default
    if cause.severity == CRITICAL:
        return cause.action, f": {cause.means}; {cause.fix}"
    return action, f"{default}; the driver also warned: {cause.means} ({cause.fix})"


def _stronger(kept: Cause | None, new: Cause) -> Cause:
    """The first of the strongest (:attr:`Cause.rank`): ``new`` only where it outranks."""
    return new if kept is None or new.rank > kept.rank else kept


class Causes:
    """The driver's causes this boot, by GPU slot: :meth:`add` each kernel record in journal
    order.  A GPU keeps the first of its strongest causes (:attr:`Cause.rank`: a later
    critical one replaces a warning or a stage line, nothing replaces one as strong); a
    cause that names no slot waits for the failure that follows it and names the GPU
    (:meth:`failed`: ``RmInitAdapter failed!``, or the kernel's ``probe of SLOT failed``).
    Module-wide entries and the failures themselves are no GPU's cause.  Bounded: one cause
    a GPU, and one waiting."""

    def __init__(self) -> None:
        self.by_slot: dict[str, Cause] = {}
        self._waiting: Cause | None = None

    def add(self, message: str) -> None:
        """Take one kernel record, if it is a cause, or the failure a cause waits for."""
        found = _parse(message, driverrecord.lines(message))
        if found is None:
            if m := _PROBE_FAILED.fullmatch(message.rstrip("\n")):
                self.failed(slot_of(m["slot"] or m["old"]))
            return
        slot, cause = found
        if cause.name == _FAILED and slot is not None:
            self.failed(slot)
        elif cause.scope != "gpu":
            return
        elif slot is None:
            self._waiting = _stronger(self._waiting, cause)
        else:
            self.by_slot[slot] = _stronger(self.by_slot.get(slot), cause)

    def failed(self, slot: str) -> None:
        """The GPU in ``slot`` failed (RmInitAdapter, or its probe): the cause waiting is
        its, where it outranks what the GPU has."""
        if self._waiting is not None:
            self.by_slot[slot] = _stronger(self.by_slot.get(slot), self._waiting)
            self._waiting = None
