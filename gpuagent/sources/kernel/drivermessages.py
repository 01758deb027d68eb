"""The driver's own words: every message NVIDIA's kernel module writes when it cannot
initialise, probe or keep a GPU, each with what it means, its severity and scope, the action
and the one-line fix, and the file it comes from (the table; pure).

Read from NVIDIA/open-gpu-kernel-modules at 595.45.04 (commit df1c9a3); paths below are that
tree's.  Three messages are not in it: "requires use of the NVIDIA open kernel modules" (the
proprietary module's, awslabs/amazon-eks-ami#2769), "No NVIDIA graphics adapter probed!" and
"failed to copy vbios to system memory" (older drivers').  How a record is matched and which
cause a GPU keeps: :mod:`gpuagent.sources.kernel.drivercatalog`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.bus.pciaddr import SLOT

__all__ = ["CATALOG", "DEFAULT_FIX", "SCOPES", "Cause"]

# Where an entry's words belong: one GPU's cause ("gpu"), the module as a whole, naming no GPU
# and never a GPU's cause ("module": no_driver_module's reasons), or the failure itself, which
# another reader makes a problem of ("failure": RmInitAdapter's init_failed, the Xid catalog's
# lost GPU), never a cause.
SCOPES = ("gpu", "module", "failure")


@dataclass(frozen=True)
class Cause:
    """What one driver message says: ``name`` (the catalog's), what it ``means``, the
    ``action`` (:data:`gpuagent.health.ACTIONS`), the one-line ``fix``, the driver's
    ``source`` (file, in open-gpu-kernel-modules); ``severity`` critical (the driver cannot
    take or keep the GPU) or warning (it goes on); ``scope`` (:data:`SCOPES`); ``reason``, the
    ``no_driver_module`` reason (:data:`gpuagent.sources.driver.driver.REASONS`) it gives, or
    ""; ``stage``: RM's generic line of the stage that failed, which says where, not why."""

    name: str
    means: str
    action: str
    fix: str
    source: str
    severity: str = CRITICAL
    scope: str = "gpu"
    reason: str = ""
    stage: bool = False

    @property
    def rank(self) -> tuple[bool, bool]:
        """Higher is stronger: critical over warning, a specific cause over a stage line."""
        return self.severity == CRITICAL, not self.stage


# The generic default: what a GPU's init failure advises where the driver said nothing more.
DEFAULT_FIX = "reboot the host, and if it repeats check the GPU's power and seating"
_OPEN = "install the open kernel modules of the same driver version (nvidia-open, -open)"
_FIRMWARE = (
    "install the GSP firmware of the loaded module's exact version (/lib/firmware/nvidia/"
    "VERSION/gsp_*.bin, from the driver's package) and rebuild the initramfs"
)
_COLD = "power-cycle the host (a cold boot, not only a warm reboot); if it repeats, RMA the board"
_IOMMU = "turn the IOMMU on (BIOS, and intel_iommu=on or amd_iommu=on with iommu=pt)"
_ABOVE_4G = "enable Above 4G Decoding (and Resizable BAR) in BIOS, or 64-bit MMIO in the VM"
_RESIZE = (
    "leave NVreg_EnableResizableBar at 0, or enable Above 4G Decoding and Resizable BAR in "
    "BIOS (or boot with pci=realloc)"
)
_ONE_MODULE = (
    "unload the other nvidia module (lsmod, modprobe -r), keep one nvidia.ko for this kernel "
    "(reinstall the driver, DKMS), and load it again"
)
_SAME = "a reboot loads the same"
_EACH = "act on each GPU's own reason, printed before it"
_NV = "kernel-open/nvidia/nv.c"
_PCI = "kernel-open/nvidia/nv-pci.c"
_OSAPI = "src/nvidia/arch/nvalloc/unix/src/osapi.c"
_OSINIT = "src/nvidia/arch/nvalloc/unix/src/osinit.c"
_GSP = "src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c"
_TU102 = "src/nvidia/src/kernel/gpu/gsp/arch/turing/kernel_gsp_tu102.c"
_XIDS = "the Xid catalog's (gpuagent/sources/kernel/xidcatalog.py): never a cause"
# A GPU as the probe's multi-line printks name it, each line after the first with NVRM:.
_GPU = (
    rf"The NVIDIA v?GPU (?P<slot>{SLOT})\s+(?:NVRM:\s+)?\(PCI ID: [0-9a-fA-F]{{4}}:"
    r"[0-9a-fA-F]{4}\)\s+(?:NVRM:\s+)?installed in this "
)
_NL = r"\s+(?:NVRM:\s+)?"
# RM's prefix inside RmInitAdapter: "GPU0 function: ", or "function: " before it has a GPU.
_RM = r"(?:GPU\d{1,3} )?\w{1,64}: "
# NV_DEV_PRINTF's prefix.
_DEV = rf"GPU (?P<slot>{SLOT}): "
_XID = r"Xid \((?:PCI:)?[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\): "


def _entry(
    pattern: str,
    *cause: str,
    severity: str = CRITICAL,
    scope: str = "gpu",
    reason: str = "",
    stage: bool = False,
) -> tuple[re.Pattern[str], Cause]:
    """The pattern compiled, and the :class:`Cause` of ``cause`` (name, means, action, fix,
    source) and the rest."""
    name, means, action, fix, source = cause
    return re.compile(pattern), Cause(
        name, means, action, fix, source, severity, scope, reason, stage
    )


# The catalog: what each record (after its "NVRM: ") matches, anchored at its start, and its
# cause; the first that matches a record is its cause.  Each pattern is bounded.
CATALOG: tuple[tuple[re.Pattern[str], Cause], ...] = (
    # --- The module as a whole: it names no GPU (no_driver_module's reasons). ---
    _entry(
        r"No NVIDIA GPU found\.",
        "no_gpu_found",
        "the module found no NVIDIA GPU it can drive and refused to load",
        "check_host",
        "check lspci -d 10de: (reseat the board, the slot's power in BIOS, the VM's passthrough) "
        "and that NVreg_RegisterPCIDriver is not 0",
        _NV,
        scope="module",
        reason="no_gpu_found",
    ),
    _entry(
        r"No NVIDIA PCI devices found\.",
        "pci_driver_unregistered",
        "the module could not register its PCI driver with the kernel and unloaded",
        "check_host",
        _ONE_MODULE,
        _NV,
        scope="module",
        reason="module_init_failed",
    ),
    _entry(
        r"failed to initialize module\.",
        "module_init_failed",
        "the module's own initialisation failed before it probed any GPU",
        "check_host",
        f"read the NVRM line before it; {_ONE_MODULE}",
        _NV,
        scope="module",
        reason="module_init_failed",
    ),
    _entry(
        r"rm_init_rm\(\) failed!",
        "rm_init_rm_failed",
        "the driver's core (RM) could not initialise, so the module does not load",
        "check_host",
        "check the kernel's memory messages before it; reinstall the driver for this kernel",
        _NV,
        scope="module",
        reason="module_init_failed",
    ),
    _entry(
        r"register_chrdev_region\(\) failed for [\w-]{1,32}!",
        "device_numbers_taken",
        "the /dev/nvidia* device numbers are taken, most often by another nvidia module",
        "check_host",
        f"check /proc/devices for major 195; {_ONE_MODULE}",
        _NV,
        scope="module",
        reason="module_init_failed",
    ),
    _entry(
        r"The NVIDIA probe routine was not called for \d{1,4} device",
        "probe_not_called",
        "another driver took some NVIDIA GPUs before the nvidia module could probe them",
        "check_host",
        "find the owner (lspci -k -d 10de:), blacklist it (modprobe.d, and the initramfs)",
        _NV,
        scope="module",
        reason="other_driver",
    ),
    _entry(
        r"No NVIDIA devices probed\.",
        "no_devices_probed",
        "the module probed no GPU (each taken by another driver, or refused) and unloaded",
        "check_host",
        "read the NVRM lines before it for each GPU's reason",
        _NV,
        scope="module",
        reason="probe_failed",
    ),
    _entry(
        r"The NVIDIA probe routine failed for \d{1,4} device",
        "probe_failed",
        "the module refused some GPUs at probe; the lines before it say why for each",
        "check_host",
        _EACH,
        _NV,
        scope="module",
        reason="probe_failed",
    ),
    _entry(
        # Older drivers: "No NVIDIA graphics adapter probed!".
        r"(?:None of the NVIDIA devices were initialized\.|No NVIDIA graphics adapter probed!)",
        "none_initialized",
        "no GPU passed the probe, and the module unloaded",
        "check_host",
        _EACH,
        _NV,
        scope="module",
        reason="probe_failed",
    ),
    _entry(
        # Read with its versions by gpuagent.sources.driver.driver.api_mismatch
        # (driver_mismatch); the client's name is the client's choice, so bounded.
        r"API mismatch: the client (?:'[^'\n]{0,64}' \(pid \d{1,10}\)\s+(?:NVRM:\s+)?)?"
        r"has the version \d",
        "api_mismatch",
        "a client of another driver version than the loaded module was refused",
        "reboot",
        "after a driver upgrade reboot (or reload the nvidia modules); else reinstall the "
        "driver so module and libraries are one version (driver_mismatch says which)",
        _OSAPI,
        scope="module",
    ),
    # --- The probe: a GPU the module does not take. ---
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
        reason="open_module_unsupported",
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
        _GPU + r"system is not supported by open" + _NL + r"nvidia\.ko\.",
        "vgpu_guest_module_required",
        "this virtual GPU type is not supported by the open guest kernel module",
        "check_host",
        "install the guest driver flavour NVIDIA's vGPU documentation names for this vGPU "
        f"type, of the host's version; {_SAME} module",
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
        _GPU + r"system has" + _NL + r"fallen off the bus and is not responding to commands",
        "fell_off_bus_at_probe",
        "the GPU answers no register read at probe: its link is down, or it is hung, "
        "unpowered or failing",
        "reboot",
        "power-cycle the host; reseat the GPU and its riser, check its power cables and the "
        "slot's AER errors; if it repeats, RMA the board",
        _OSAPI,
    ),
    _entry(
        r"This PCI I/O region assigned to your NVIDIA device is invalid:"
        + _NL
        + rf"BAR\d is \d+M @ 0x[0-9a-fA-F]+ \(PCI:(?P<slot>{SLOT})\)",
        "bar_unassigned",
        "the firmware or hypervisor gave one of the GPU's BARs no address space",
        "check_host",
        f"{_ABOVE_4G}; {_SAME} layout",
        _PCI,
    ),
    _entry(
        rf"Aborting probe for VF (?P<slot>{SLOT}) since IOMMU is not present on the system",
        "iommu_absent",
        "the GPU's SR-IOV virtual function needs an IOMMU, and the host has none on",
        "check_host",
        _IOMMU,
        _PCI,
    ),
    _entry(
        rf"Ignoring probe for VF (?P<slot>{SLOT})",
        "vf_ignored",
        "this module does not drive SR-IOV virtual functions on the host: the VF stays unbound",
        "none",
        "use the vGPU host driver for VFs, or hand the VF to a VM (vfio-pci); nothing to do "
        "where the VFs are for passthrough",
        _PCI,
        severity=WARNING,
    ),
    _entry(
        r"failed to wait for bar firewall to lower",
        "bar_firewall",
        "the GPU's security processor never opened its BARs to the driver",
        "reboot",
        f"{_COLD}; update the GPU's firmware through its vendor",
        _PCI,
    ),
    _entry(
        rf"ignoring the legacy GPU (?P<slot>{SLOT})",
        "legacy_gpu",
        "this GPU is older than this driver branch supports: it skips it",
        "check_host",
        f"install the legacy branch that supports it (its README lists it); {_SAME} branch",
        _PCI,
    ),
    _entry(
        r"pci_enable_device failed, aborting",
        "pci_enable_failed",
        "the kernel could not enable the GPU's PCI device (its resources unassignable)",
        "check_host",
        "read the kernel's BAR lines (no space, can't assign); enable Above 4G Decoding in "
        "BIOS or boot with pci=realloc; reseat the GPU",
        _PCI,
    ),
    _entry(
        r"Can't find an IRQ for your NVIDIA card!",
        "no_irq_assigned",
        "the GPU has no interrupt line and no MSI-X, so the driver cannot take interrupts",
        "check_host",
        "in BIOS set Plug & Play OS to No and Assign IRQ to VGA to Yes, or update it; in a VM "
        "expose MSI-X",
        _PCI,
    ),
    _entry(
        r"request_mem_region failed for \d{1,12}M @ 0x[0-9a-fA-F]{1,16}\. This can",
        "registers_claimed",
        "another driver or a firmware framebuffer holds the GPU's register window",
        "check_host",
        "find the owner in /proc/iomem: blacklist it (nouveau, rivatv), or keep efifb or "
        "simpledrm off the GPU (video=efifb:off)",
        _PCI,
    ),
    _entry(
        r"No address space to allocate resized BAR1\.",
        "bar1_no_space",
        "the bridge above the GPU has no room for a larger BAR1: the driver keeps its size",
        "check_host",
        _RESIZE,
        _PCI,
        severity=WARNING,
    ),
    _entry(
        r"BAR resizing failed with error `-?\d{1,4}`\.",
        "bar_resize_refused",
        "the kernel refused to resize BAR1: the driver keeps its size",
        "check_host",
        _RESIZE,
        _PCI,
        severity=WARNING,
    ),
    _entry(
        r"FATAL: Failed to re-allocate BAR1\.",
        "bar1_lost",
        "the GPU lost its BAR1 while the driver resized it",
        "reboot",
        f"{_RESIZE}, then reboot: it restores the firmware's BARs",
        _PCI,
    ),
    _entry(
        r"Fatal Error while attempting to resize PCIe BARs\.",
        "bar_resize_fatal",
        "resizing the GPU's BARs broke its PCI resources for this boot",
        "reboot",
        f"{_RESIZE}, then reboot: it restores the firmware's BARs",
        _PCI,
    ),
    _entry(
        _DEV + r"rm_init_private_state\(\) failed!",
        "unknown_to_driver",
        "the driver could not set the GPU up, most often a GPU newer than the driver",
        "check_host",
        f"install a driver release that supports the GPU; {_SAME} release",
        _PCI,
    ),
    _entry(
        rf"GPU (?P<slot>{SLOT}) is already bound to [\w-]{{1,32}}\.",
        "other_driver",
        "another driver holds the GPU",
        "check_host",
        "blacklist that driver (modprobe.d, and the initramfs), or drop its driver_override; "
        "for a VM's passthrough this is meant",
        _PCI,
    ),
    _entry(
        rf"Device start failed for (?P<slot>{SLOT}) \(ret=-?\d{{1,4}}\)",
        "start_failed",
        "the GPU could not be started at probe (its RmInitAdapter lines say why)",
        "reboot",
        DEFAULT_FIX,
        _PCI,
        stage=True,
    ),
    # --- Interrupts, DMA and opening the device. ---
    _entry(
        _DEV + r"Failed to enable MSI; falling back to PCIe virtual-wire interrupts",
        "msi_unavailable",
        "MSI could not be enabled: the GPU shares a legacy interrupt line, slower",
        "check_host",
        "check the kernel's MSI (no pci=nomsi), the IOMMU's interrupt remapping, the VM's MSI",
        "kernel-open/nvidia/nv-msi.c",
        severity=WARNING,
    ),
    _entry(
        _DEV + r"Failed to enable MSI-X\.",
        "msix_unavailable",
        "MSI-X could not be set up: the driver falls back to MSI or a legacy line",
        "none",
        "where it matters, check interrupt remapping, vector exhaustion and the VM's MSI-X",
        "kernel-open/nvidia/nv-msi.c",
        severity=WARNING,
    ),
    _entry(
        _DEV
        + r"(?:No interrupts of any type are available|Tried to get IRQ \d+, but another"
        + r"|request_irq\(\) failed \(-\d+\))",
        "no_interrupt",
        "the GPU has no interrupt it can use (no MSI, or its IRQ held by another driver)",
        "check_host",
        "keep MSI on (NVreg_EnableMSI), expose MSI to the VM, or free the IRQ (/proc/interrupts)",
        _NV,
    ),
    _entry(
        r"Going over RM unhandled interrupt threshold for irq \d{1,5}",
        "interrupt_storm",
        "the GPU's interrupt line fires with no GPU work (a shared line, or a misrouted MSI)",
        "check_host",
        "use MSI (NVreg_EnableMSI=1), move the board off a shared line; see 'nobody cared'",
        _NV,
        severity=WARNING,
    ),
    _entry(
        rf"(?P<slot>{SLOT}): DMA address not in addressable range of device",
        "dma_out_of_range",
        "the DMA layer gave the GPU an address it cannot reach: the allocation failed",
        "check_host",
        "check the IOMMU mode (iommu=pt, or the IOMMU on) and drop forced swiotlb settings",
        "kernel-open/nvidia/nv-dma.c",
        severity=WARNING,
    ),
    _entry(
        _DEV + r"Device is currently unavailable",
        "sequestered",
        "the GPU is fenced off after an error until it is reset",
        "reset_gpu",
        "drain its jobs and reset it (nvidia-smi -r), or reboot; its earlier Xids say why",
        _NV,
    ),
    _entry(
        rf"GPU (?P<slot>{SLOT}): open\(\) not permitted for excluded GPU-",
        "excluded",
        "the GPU is excluded from use by the module's NVreg_ExcludedGpus",
        "check_host",
        "remove its UUID from NVreg_ExcludedGpus (modprobe options) if it is to be used",
        _NV,
    ),
    # --- RmInitAdapter: the specific causes, before the stage they stopped. ---
    _entry(
        _DEV + r"GPU does not have the necessary power cables connected",
        "power_cables",
        "the board's auxiliary power is not connected, or delivers none",
        "check_host",
        "connect every power cable the board takes, check the PSU and riser, then power-cycle",
        _OSINIT,
    ),
    _entry(
        _DEV + r"Failed to map regs registers!!",
        "registers_unmapped",
        "the kernel refused to map the GPU's register BAR",
        "reboot",
        "read the kernel's ioremap and PAT errors before it; reboot",
        _OSINIT,
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
        _RM + r"Failed to load gsp_log_\*\.bin, no GSP-RM logs will be printed",
        "gsp_log_firmware_missing",
        "only the GSP firmware's log decoder is missing: the GPU initialises",
        "none",
        "install the whole firmware set of this driver version if GSP-RM logs are wanted",
        _OSINIT,
        severity=WARNING,
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
        _TU102,
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
        _GSP,
    ),
    _entry(
        r"failed to copy vbios to system memory",
        "vbios_not_copied",
        "the driver could not read the GPU's VBIOS (older drivers' words)",
        "check_host",
        "keep the GPU powered (bbswitch, vga_switcheroo), update the system BIOS, or use a "
        "current driver branch",
        "the proprietary nvidia.ko of older drivers (not in the open tree)",
    ),
    _entry(
        _RM + r"(?:failed to execute Booter Load|Failed to boot GSP\.)",
        "gsp_boot_failed",
        "the GPU's firmware processor (GSP) did not boot",
        "reboot",
        f"{_COLD}; check that the firmware is the module's version",
        _TU102,
    ),
    # RM's stage lines: where RmInitAdapter stopped, printed after the line that says why.
    _entry(
        _RM + r"Error preparing GSP-RM image",
        "gsp_image_unprepared",
        "the GSP firmware image could not be prepared for boot",
        "check_host",
        _FIRMWARE,
        _GSP,
        stage=True,
    ),
    _entry(
        _RM + r"Cannot initialize GSP firmware RM",
        "gsp_init_failed",
        "the GPU's firmware processor (GSP) could not be started",
        "reboot",
        f"{_COLD}; check that the firmware is the module's version",
        _OSINIT,
        stage=True,
    ),
    _entry(
        _RM + r"\*\*\* Cannot attach gpu",
        "attach_failed",
        "the driver could not attach the GPU (stage 0x22: status 0x56 is a GPU this module "
        "flavour or version does not support)",
        "reboot",
        DEFAULT_FIX,
        _OSINIT,
        stage=True,
    ),
    _entry(
        _RM + r"osInitNvMapping failed, bailing out of RmInitAdapter",
        "mapping_failed",
        "the driver's first attach of the GPU failed",
        "reboot",
        DEFAULT_FIX,
        _OSINIT,
        stage=True,
    ),
    _entry(
        _RM + r"RmInitX86Emu failed, bailing out of RmInitAdapter",
        "x86emu_failed",
        "the driver could not set up the GPU's VBIOS execution",
        "reboot",
        DEFAULT_FIX,
        _OSINIT,
        stage=True,
    ),
    _entry(
        _RM + r"\*\*\* Cannot (?:pre-initialize|initialize|load state into) the device",
        "engines_failed",
        "one of the GPU's engines failed to pre-initialise, initialise or load",
        "reboot",
        DEFAULT_FIX,
        _OSINIT,
        stage=True,
    ),
    _entry(
        _RM + r"RmInitNvDevice failed, bailing out of RmInitAdapter",
        "device_init_failed",
        "the GPU's engines could not be initialised",
        "reboot",
        DEFAULT_FIX,
        _OSINIT,
        stage=True,
    ),
    # --- The failure itself: another reader's problem, never a cause. ---
    _entry(
        _DEV + r"(?:RmInitAdapter failed!|rm_init_adapter failed,)",
        "rm_init_adapter_failed",
        "the driver could not initialise the GPU: init_failed (gpuagent/sources/kernel/"
        "xidcount.py), its cause the lines before it",
        "reboot",
        DEFAULT_FIX,
        _OSINIT,
        scope="failure",
    ),
    _entry(
        _DEV + r"GPU has fallen off the bus\.",
        "fell_off_bus",
        f"the GPU left the bus at run time: Xid 79, {_XIDS}",
        "reboot",
        "see Xid 79",
        _OSINIT,
        scope="failure",
    ),
    _entry(
        _XID + r"(?:79|119|154), ",
        "lost_gpu_xid",
        f"Xid 79 (fallen off the bus), 119 (GSP timeout), 154 (recovery action): {_XIDS}",
        "reboot",
        "see the Xid's entry",
        "src/nvidia/src/kernel/gpu/rc/kernel_rc.c",
        scope="failure",
    ),
)
