"""The driver's messages at the probe (a GPU the module does not take) and on interrupts, DMA
and opening the device (entries of :data:`gpuagent.sources.kernel.drivermessages.CATALOG`;
pure).
"""

from __future__ import annotations

import re

from gpuagent.health import WARNING
from gpuagent.sources.bus.pciaddr import SLOT
from gpuagent.sources.kernel.drivercause import (
    ABOVE_4G,
    COLD,
    DEFAULT_FIX,
    DEV,
    GPU,
    IOMMU,
    NL,
    NV,
    OPEN,
    OSAPI,
    PCI,
    RESIZE,
    SAME,
    Cause,
    entry,
)

__all__ = ["PROBE"]

PROBE: tuple[tuple[re.Pattern[str], Cause], ...] = (
    # --- The probe: a GPU the module does not take. ---
    entry(
        GPU + r"system requires use of the NVIDIA open kernel modules",
        "open_modules_required",
        "this GPU runs only with the open kernel modules, and the proprietary ones are loaded",
        "check_host",
        f"{OPEN}; {SAME} module",
        "the proprietary nvidia.ko (not in the open tree)",
    ),
    entry(
        GPU + r"system is not supported by open" + NL + r"nvidia\.ko because it does not",
        "proprietary_modules_required",
        "this GPU has no GSP, which the open kernel modules need",
        "check_host",
        f"install the proprietary kernel modules of a branch that supports it; {SAME} module",
        OSAPI,
        reason="open_module_unsupported",
    ),
    entry(
        GPU + r"vGPU host system is not supported by" + NL + r"open nvidia\.ko",
        "vgpu_host_module_required",
        "on a vGPU host this GPU needs the proprietary vGPU manager module",
        "check_host",
        "install the vGPU host driver that NVIDIA's vGPU documentation names for it",
        OSAPI,
    ),
    entry(
        GPU + r"system is not supported by open" + NL + r"nvidia\.ko\.",
        "vgpu_guest_module_required",
        "this virtual GPU type is not supported by the open guest kernel module",
        "check_host",
        "install the guest driver flavour NVIDIA's vGPU documentation names for this vGPU "
        f"type, of the host's version; {SAME} module",
        OSAPI,
    ),
    entry(
        GPU + r"system is not supported by the" + NL + r"NVIDIA [\w.-]{1,32} driver release",
        "unsupported_by_release",
        "this driver release does not support this GPU",
        "check_host",
        f"install a driver release whose README lists its PCI ID; {SAME} release",
        OSAPI,
    ),
    entry(
        GPU + r"system has" + NL + r"fallen off the bus and is not responding to commands",
        "fell_off_bus_at_probe",
        "the GPU answers no register read at probe: its link is down, or it is hung, "
        "unpowered or failing",
        "reboot",
        "power-cycle the host; reseat the GPU and its riser, check its power cables and the "
        "slot's AER errors; if it repeats, RMA the board",
        OSAPI,
    ),
    entry(
        r"This PCI I/O region assigned to your NVIDIA device is invalid:"
        + NL
        + rf"BAR\d is \d+M @ 0x[0-9a-fA-F]+ \(PCI:(?P<slot>{SLOT})\)",
        "bar_unassigned",
        "the firmware or hypervisor gave one of the GPU's BARs no address space",
        "check_host",
        f"{ABOVE_4G}; {SAME} layout",
        PCI,
    ),
    entry(
        rf"Aborting probe for VF (?P<slot>{SLOT}) since IOMMU is not present on the system",
        "iommu_absent",
        "the GPU's SR-IOV virtual function needs an IOMMU, and the host has none on",
        "check_host",
        IOMMU,
        PCI,
    ),
    entry(
        rf"Ignoring probe for VF (?P<slot>{SLOT})",
        "vf_ignored",
        "this module does not drive SR-IOV virtual functions on the host: the VF stays unbound",
        "none",
        "use the vGPU host driver for VFs, or hand the VF to a VM (vfio-pci); nothing to do "
        "where the VFs are for passthrough",
        PCI,
        severity=WARNING,
    ),
    entry(
        r"failed to wait for bar firewall to lower",
        "bar_firewall",
        "the GPU's security processor never opened its BARs to the driver",
        "reboot",
        f"{COLD}; update the GPU's firmware through its vendor",
        PCI,
    ),
    entry(
        rf"ignoring the legacy GPU (?P<slot>{SLOT})",
        "legacy_gpu",
        "this GPU is older than this driver branch supports: it skips it",
        "check_host",
        f"install the legacy branch that supports it (its README lists it); {SAME} branch",
        PCI,
    ),
    entry(
        r"pci_enable_device failed, aborting",
        "pci_enable_failed",
        "the kernel could not enable the GPU's PCI device (its resources unassignable)",
        "check_host",
        "read the kernel's BAR lines (no space, can't assign); enable Above 4G Decoding in "
        "BIOS or boot with pci=realloc; reseat the GPU",
        PCI,
    ),
    entry(
        r"Can't find an IRQ for your NVIDIA card!",
        "no_irq_assigned",
        "the GPU has no interrupt line and no MSI-X, so the driver cannot take interrupts",
        "check_host",
        "in BIOS set Plug & Play OS to No and Assign IRQ to VGA to Yes, or update it; in a VM "
        "expose MSI-X",
        PCI,
    ),
    entry(
        r"request_mem_region failed for \d{1,12}M @ 0x[0-9a-fA-F]{1,16}\. This can",
        "registers_claimed",
        "another driver or a firmware framebuffer holds the GPU's register window",
        "check_host",
        "find the owner in /proc/iomem: blacklist it (nouveau, rivatv), or keep efifb or "
        "simpledrm off the GPU (video=efifb:off)",
        PCI,
    ),
    entry(
        r"No address space to allocate resized BAR1\.",
        "bar1_no_space",
        "the bridge above the GPU has no room for a larger BAR1: the driver keeps its size",
        "check_host",
        RESIZE,
        PCI,
        severity=WARNING,
    ),
    entry(
        r"BAR resizing failed with error `-?\d{1,4}`\.",
        "bar_resize_refused",
        "the kernel refused to resize BAR1: the driver keeps its size",
        "check_host",
        RESIZE,
        PCI,
        severity=WARNING,
    ),
    entry(
        r"FATAL: Failed to re-allocate BAR1\.",
        "bar1_lost",
        "the GPU lost its BAR1 while the driver resized it",
        "reboot",
        f"{RESIZE}, then reboot: it restores the firmware's BARs",
        PCI,
    ),
    entry(
        r"Fatal Error while attempting to resize PCIe BARs\.",
        "bar_resize_fatal",
        "resizing the GPU's BARs broke its PCI resources for this boot",
        "reboot",
        f"{RESIZE}, then reboot: it restores the firmware's BARs",
        PCI,
    ),
    entry(
        DEV + r"rm_init_private_state\(\) failed!",
        "unknown_to_driver",
        "the driver could not set the GPU up, most often a GPU newer than the driver",
        "check_host",
        f"install a driver release that supports the GPU; {SAME} release",
        PCI,
    ),
    entry(
        rf"GPU (?P<slot>{SLOT}) is already bound to [\w-]{{1,32}}\.",
        "other_driver",
        "another driver holds the GPU",
        "check_host",
        "blacklist that driver (modprobe.d, and the initramfs), or drop its driver_override; "
        "for a VM's passthrough this is meant",
        PCI,
    ),
    entry(
        rf"Device start failed for (?P<slot>{SLOT}) \(ret=-?\d{{1,4}}\)",
        "start_failed",
        "the GPU could not be started at probe (its RmInitAdapter lines say why)",
        "reboot",
        DEFAULT_FIX,
        PCI,
        stage=True,
    ),
    # --- Interrupts, DMA and opening the device. ---
    entry(
        DEV + r"Failed to enable MSI; falling back to PCIe virtual-wire interrupts",
        "msi_unavailable",
        "MSI could not be enabled: the GPU shares a legacy interrupt line, slower",
        "check_host",
        "check the kernel's MSI (no pci=nomsi), the IOMMU's interrupt remapping, the VM's MSI",
        "kernel-open/nvidia/nv-msi.c",
        severity=WARNING,
    ),
    entry(
        DEV + r"Failed to enable MSI-X\.",
        "msix_unavailable",
        "MSI-X could not be set up: the driver falls back to MSI or a legacy line",
        "none",
        "where it matters, check interrupt remapping, vector exhaustion and the VM's MSI-X",
        "kernel-open/nvidia/nv-msi.c",
        severity=WARNING,
    ),
    entry(
        DEV
        + r"(?:No interrupts of any type are available|Tried to get IRQ \d+, but another"
        + r"|request_irq\(\) failed \(-\d+\))",
        "no_interrupt",
        "the GPU has no interrupt it can use (no MSI, or its IRQ held by another driver)",
        "check_host",
        "keep MSI on (NVreg_EnableMSI), expose MSI to the VM, or free the IRQ (/proc/interrupts)",
        NV,
    ),
    entry(
        r"Going over RM unhandled interrupt threshold for irq \d{1,5}",
        "interrupt_storm",
        "the GPU's interrupt line fires with no GPU work (a shared line, or a misrouted MSI)",
        "check_host",
        "use MSI (NVreg_EnableMSI=1), move the board off a shared line; see 'nobody cared'",
        NV,
        severity=WARNING,
    ),
    entry(
        rf"(?P<slot>{SLOT}): DMA address not in addressable range of device",
        "dma_out_of_range",
        "the DMA layer gave the GPU an address it cannot reach: the allocation failed",
        "check_host",
        "check the IOMMU mode (iommu=pt, or the IOMMU on) and drop forced swiotlb settings",
        "kernel-open/nvidia/nv-dma.c",
        severity=WARNING,
    ),
    entry(
        DEV + r"Device is currently unavailable",
        "sequestered",
        "the GPU is fenced off after an error until it is reset",
        "reset_gpu",
        "drain its jobs and reset it (nvidia-smi -r), or reboot; its earlier Xids say why",
        NV,
    ),
    entry(
        rf"GPU (?P<slot>{SLOT}): open\(\) not permitted for excluded GPU-",
        "excluded",
        "the GPU is excluded from use by the module's NVreg_ExcludedGpus",
        "check_host",
        "remove its UUID from NVreg_ExcludedGpus (modprobe options) if it is to be used",
        NV,
    ),
)
