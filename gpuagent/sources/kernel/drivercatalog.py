"""What NVIDIA's kernel module says when it cannot probe or initialise a GPU: its own words,
each with what it means, the action and the one-line fix (pure).

Read from the driver's source, NVIDIA/open-gpu-kernel-modules at 595.45.04 (commit df1c9a3):
``kernel-open/nvidia/nv-pci.c`` (probe), ``kernel-open/nvidia/nv.c`` (interrupts, firmware),
``src/nvidia/arch/nvalloc/unix/src/osapi.c`` (the supported-GPU checks),
``src/nvidia/arch/nvalloc/unix/src/osinit.c`` (RmInitAdapter) and
``src/nvidia/src/kernel/gpu/gsp/`` and ``…/fsp/`` (GSP and FSP boot).  The one message not in
that tree, "requires use of the NVIDIA open kernel modules", is the proprietary module's
(awslabs/amazon-eks-ami#2769, NVIDIA/open-gpu-kernel-modules#1332).  Of the 72 messages that
path writes, these are the ones that say what to do; the others keep init_failed's and
no_driver's default (a reboot, then power and seating): warnings the driver goes on after (an
MSI fallback, a resized BAR refused), RM's generic stages (``Cannot pre-initialize the
device``), the module-wide ones that name no GPU (no_driver_module's reasons,
:mod:`gpuagent.sources.driver.driver`), and those of a GPU already lost (Xid 79's, the Xid
catalog's).

The driver names the GPU in a probe-time record (``0000:3b:00.0``); RM's own records during
RmInitAdapter name it by instance (``GPU0``) or not at all, and are the cause of the
``RmInitAdapter failed!`` record that follows and names the slot (:class:`Causes`).  A
GPU's ``init_failed`` or ``no_driver`` takes its cause from them: a reboot is the action only
where a reboot can help (it loads the same module, the same firmware, the same BIOS layout);
a host fix names what to change.  Each record is read where the driver wrote all of it
(:mod:`gpuagent.sources.kernel.driverrecord`), or for the firmware loader's line, the kernel's
own one-line record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuagent.sources.bus.pciaddr import SLOT, slot_of
from gpuagent.sources.kernel import driverrecord

__all__ = ["CATALOG", "Cause", "Causes", "parse"]


@dataclass(frozen=True)
class Cause:
    """Why the driver could not take a GPU: ``name`` (the catalog's), what it ``means``, the
    ``action`` (:data:`gpuagent.health.ACTIONS`), the one-line ``fix`` and the driver's
    ``source`` (file, in open-gpu-kernel-modules)."""

    name: str
    means: str
    action: str
    fix: str
    source: str


_OPEN = "install the open kernel modules of the same driver version (nvidia-open, -open)"
_FIRMWARE = (
    "install the GSP firmware of the loaded module's exact version (/lib/firmware/nvidia/"
    "VERSION/gsp_*.bin, from the driver's package) and rebuild the initramfs"
)
_COLD = "power-cycle the host (a cold boot, not only a warm reboot); if it repeats, RMA the board"
_IOMMU = "turn the IOMMU on (BIOS, and intel_iommu=on or amd_iommu=on with iommu=pt)"
_SAME = "a reboot loads the same"
_OSAPI = "src/nvidia/arch/nvalloc/unix/src/osapi.c"
_OSINIT = "src/nvidia/arch/nvalloc/unix/src/osinit.c"
_GSP = "src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c"
# A GPU as the probe's multi-line printks name it, each line after the first with NVRM:.
_GPU = (
    rf"The NVIDIA GPU (?P<slot>{SLOT})\s+(?:NVRM:\s+)?\(PCI ID: [0-9a-fA-F]{{4}}:[0-9a-fA-F]{{4}}\)"
    r"\s+(?:NVRM:\s+)?installed in this "
)
_NL = r"\s+(?:NVRM:\s+)?"
# RM's prefix inside RmInitAdapter: "GPU0 function: ", or "function: " before it has a GPU.
_RM = r"(?:GPU\d{1,3} )?\w{1,64}: "
_DEV = rf"GPU (?P<slot>{SLOT}): "


def _entry(pattern: str, *cause: str) -> tuple[re.Pattern[str], Cause]:
    """The pattern compiled, and the :class:`Cause` of ``cause`` (its fields in order)."""
    return re.compile(pattern), Cause(*cause)


# The catalog: what each record (after its "NVRM: ") matches, and its cause; the first that
# matches a record is its cause.
CATALOG: tuple[tuple[re.Pattern[str], Cause], ...] = (
    _entry(
        _GPU + r"system requires use of the NVIDIA open kernel modules",
        "open_modules_required",
        "this GPU runs only with the open kernel modules, and the proprietary ones are loaded",
        "check_host",
        f"{_OPEN}; {_SAME} module",
        "the proprietary nvidia.ko (not in the open tree)",
    ),
    _entry(
        _GPU + r"system is not supported by open" + _NL + r"nvidia\.ko because it does not",
        "proprietary_modules_required",
        "this GPU has no GSP, which the open kernel modules need",
        "check_host",
        f"install the proprietary kernel modules of a branch that supports it; {_SAME} module",
        _OSAPI,
    ),
    _entry(
        _GPU + r"vGPU host system is not supported by" + _NL + r"open nvidia\.ko",
        "vgpu_host_module_required",
        "on a vGPU host this GPU needs the proprietary vGPU manager module",
        "check_host",
        "install the vGPU host driver that NVIDIA's vGPU documentation names for it",
        _OSAPI,
    ),
    _entry(
        _GPU + r"system is not supported by the" + _NL + r"NVIDIA [\w.-]{1,32} driver release",
        "unsupported_by_release",
        "this driver release does not support this GPU",
        "check_host",
        f"install a driver release whose README lists its PCI ID; {_SAME} release",
        _OSAPI,
    ),
    _entry(
        r"This PCI I/O region assigned to your NVIDIA device is invalid:"
        + _NL
        + rf"BAR\d is \d+M @ 0x[0-9a-fA-F]+ \(PCI:(?P<slot>{SLOT})\)",
        "bar_unassigned",
        "the firmware or hypervisor gave one of the GPU's BARs no address space",
        "check_host",
        "enable Above 4G Decoding (and Resizable BAR) in BIOS, or 64-bit MMIO in the VM; "
        f"{_SAME} layout",
        "kernel-open/nvidia/nv-pci.c",
    ),
    _entry(
        rf"Aborting probe for VF (?P<slot>{SLOT}) since IOMMU is not present on the system",
        "iommu_absent",
        "the GPU's SR-IOV virtual function needs an IOMMU, and the host has none on",
        "check_host",
        _IOMMU,
        "kernel-open/nvidia/nv-pci.c",
    ),
    _entry(
        _DEV + r"GPU does not have the necessary power cables connected",
        "power_cables",
        "the board's auxiliary power is not connected, or delivers none",
        "check_host",
        "connect every power cable the board takes, check the PSU and riser, then power-cycle",
        _OSINIT,
    ),
    _entry(
        _DEV
        + r"(?:No interrupts of any type are available|Tried to get IRQ \d+, but another"
        + r"|request_irq\(\) failed \(-\d+\))",
        "no_interrupt",
        "the GPU has no interrupt it can use (no MSI, or its IRQ held by another driver)",
        "check_host",
        "keep MSI on (NVreg_EnableMSI), expose MSI to the VM, or free the IRQ (/proc/interrupts)",
        "kernel-open/nvidia/nv.c",
    ),
    _entry(
        _DEV + r"Device is currently unavailable",
        "sequestered",
        "the GPU is fenced off after an error until it is reset",
        "reset_gpu",
        "drain its jobs and reset it (nvidia-smi -r), or reboot; its earlier Xids say why",
        "kernel-open/nvidia/nv.c",
    ),
    _entry(
        _RM + r"Cannot configure the device for DMA",
        "dma_unconfigured",
        "the driver could not set up DMA translation for the GPU behind the IOMMU",
        "check_host",
        f"check the IOMMU: {_IOMMU}",
        _OSINIT,
    ),
    _entry(
        _RM + r"No firmware image found",
        "gsp_firmware_missing",
        "the GSP firmware of this driver version is not on disk or in the initramfs",
        "check_host",
        _FIRMWARE,
        _OSINIT,
    ),
    _entry(
        _RM + r"GSP firmware image version mismatch: got version [\w.-]{1,32}, expected",
        "gsp_firmware_mismatch",
        "the GSP firmware on disk is another driver version's than the loaded module",
        "check_host",
        _FIRMWARE,
        _GSP,
    ),
    _entry(
        _RM + r"unexpected WPR2 already up, cannot proceed with booting GSP",
        "gsp_left_running",
        "the GPU still holds a previous GSP boot: it must be reset before the driver can start it",
        "reset_gpu",
        "reset the GPU (nvidia-smi -r) or power-cycle the host",
        _GSP,
    ),
    _entry(
        # Older drivers: "gpuWaitForGfwBootComplete_TU102: failed to wait for GFW_BOOT".
        _RM + r"failed to wait for GFW(?:_BOOT| boot complete)",
        "gfw_boot_hung",
        "the GPU did not finish its power-on firmware boot: hung, or without power",
        "reboot",
        f"check its power cables, then {_COLD}",
        "src/nvidia/src/kernel/gpu/gsp/arch/turing/kernel_gsp_tu102.c",
    ),
    _entry(
        _RM + r"FSP boot cmds failed\. RM cannot boot",
        "fsp_boot_failed",
        "the GPU's security processor (FSP) refused to boot its firmware",
        "reboot",
        f"{_COLD}; update the GPU's firmware through its vendor",
        "src/nvidia/src/kernel/gpu/fsp/arch/hopper/kern_fsp_gh100.c",
    ),
    _entry(
        rf"GPU (?P<slot>{SLOT}) is already bound to [\w-]{{1,32}}\.",
        "other_driver",
        "another driver holds the GPU",
        "check_host",
        "blacklist that driver (modprobe.d, and the initramfs), or drop its driver_override; "
        "for a VM's passthrough this is meant",
        "kernel-open/nvidia/nv-pci.c",
    ),
    _entry(
        rf"GPU (?P<slot>{SLOT}): open\(\) not permitted for excluded GPU-",
        "excluded",
        "the GPU is excluded from use by the module's NVreg_ExcludedGpus",
        "check_host",
        "remove its UUID from NVreg_ExcludedGpus (modprobe options) if it is to be used",
        "kernel-open/nvidia/nv.c",
    ),
    _entry(
        rf"ignoring the legacy GPU (?P<slot>{SLOT})",
        "legacy_gpu",
        "this GPU is older than this driver branch supports: it skips it",
        "check_host",
        f"install the legacy branch that supports it (its README lists it); {_SAME} branch",
        "kernel-open/nvidia/nv-pci.c",
    ),
    _entry(
        _DEV + r"rm_init_private_state\(\) failed!",
        "unknown_to_driver",
        "the driver could not set the GPU up, most often a GPU newer than the driver",
        "check_host",
        f"install a driver release that supports the GPU; {_SAME} release",
        "kernel-open/nvidia/nv-pci.c",
    ),
    _entry(
        _RM + r"osVerifySystemEnvironment failed, bailing!",
        "interrupts_silent",
        "the GPU's interrupts do not reach the CPU (MSI or interrupt remapping)",
        "check_host",
        "check MSI (NVreg_EnableMSI), the IOMMU's interrupt remapping, the VM's MSI and BIOS",
        _OSINIT,
    ),
    _entry(
        _RM
        + r"(?:failed to extract VBIOS image from ROM|did not find valid ROM signature"
        + r"|failed to parse FWSEC ucode from VBIOS image)",
        "vbios_unreadable",
        "the GPU's VBIOS could not be read, or is not valid",
        "reboot",
        f"{_COLD}; if it repeats, reflash the board's VBIOS (in a VM: drop a romfile)",
        "src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c",
    ),
    _entry(
        _RM
        + r"(?:failed to execute Booter Load|Failed to boot GSP\.|Cannot initialize GSP "
        + r"firmware RM)",
        "gsp_boot_failed",
        "the GPU's firmware processor (GSP) did not boot",
        "reboot",
        f"{_COLD}; check that the firmware is the module's version",
        "src/nvidia/src/kernel/gpu/gsp/arch/turing/kernel_gsp_tu102.c",
    ),
    _entry(
        r"failed to wait for bar firewall to lower",
        "bar_firewall",
        "the GPU's security processor never opened its BARs to the driver",
        "reboot",
        f"{_COLD}; update the GPU's firmware through its vendor",
        "kernel-open/nvidia/nv-pci.c",
    ),
)
# The kernel's firmware loader, for the driver's device: "nvidia 0000:3b:00.0: Direct firmware
# load for nvidia/595.45.04/gsp_ga10x.bin failed with error -2" (a one-line kernel record).
_FIRMWARE_LOAD = re.compile(
    rf"nvidia (?P<slot>{SLOT}): Direct firmware load for nvidia/[\w.-]{{1,32}}/gsp_\w{{1,32}}\.bin "
    r"failed with error -\d{1,4}"
)
# The record a waiting cause is the cause of (osinit.c), and the probe's own (nv.c).
_INIT_FAILED = re.compile(
    rf"[ \t]*NVRM: GPU (?P<slot>{SLOT}): (?:RmInitAdapter failed!|rm_init_adapter failed,)"
)
_MISSING_FILE = next(c for _, c in CATALOG if c.name == "gsp_firmware_missing")


def parse(message: str) -> tuple[str | None, Cause] | None:
    """The GPU (its slot; None where the record names it only by RM's instance, or not at
    all) and the cause one kernel record's ``MESSAGE`` gives, or None."""
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
    for pattern, cause in CATALOG:
        if m := pattern.match(rest):
            slot = m.groupdict().get("slot")
            return (slot_of(slot) if slot else None), cause
    return None


class Causes:
    """The driver's causes this boot, by GPU slot: :meth:`add` each kernel record in journal
    order; a cause that names no slot waits for the ``RmInitAdapter failed!`` record that
    follows it (:meth:`failed`), which names the GPU.  Bounded: one cause a GPU (its first,
    the root of what followed) and a few waiting."""

    _WAITING = 8

    def __init__(self) -> None:
        self.by_slot: dict[str, Cause] = {}
        self._waiting: list[Cause] = []

    def add(self, message: str) -> None:
        """Take one kernel record, if it is a cause, or the init failure a cause waits for."""
        lines = driverrecord.lines(message)
        found = _parse(message, lines)
        if found is None:
            if lines and (m := _INIT_FAILED.match(lines[0])):
                self.failed(slot_of(m["slot"]))
            return
        slot, cause = found
        if slot is None:
            self._waiting = [*self._waiting, cause][-self._WAITING :]
        else:
            self.by_slot.setdefault(slot, cause)

    def failed(self, slot: str) -> None:
        """The GPU in ``slot`` failed RmInitAdapter: the causes waiting are its."""
        if self._waiting:
            self.by_slot.setdefault(slot, self._waiting[0])
            self._waiting = []
