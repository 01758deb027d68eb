"""The driver's messages inside RmInitAdapter (the specific causes, GSP's included, then the
stage lines), and the failure itself, another reader's problem (entries of
:data:`gpuagent.sources.kernel.drivermessages.CATALOG`; pure).
"""

from __future__ import annotations

import re

from gpuagent.health import WARNING
from gpuagent.sources.kernel.drivercause import (
    COLD,
    DEFAULT_FIX,
    DEV,
    FIRMWARE,
    GSP,
    IOMMU,
    OSINIT,
    RM,
    TU102,
    XID,
    XIDS,
    Cause,
    entry,
)

__all__ = ["INIT"]

INIT: tuple[tuple[re.Pattern[str], Cause], ...] = (
    # --- RmInitAdapter: the specific causes, before the stage they stopped. ---
    entry(
        DEV + r"GPU does not have the necessary power cables connected",
        "power_cables",
        "the board's auxiliary power is not connected, or delivers none",
        "check_host",
        "connect every power cable the board takes, check the PSU and riser, then power-cycle",
        OSINIT,
    ),
    entry(
        DEV + r"Failed to map regs registers!!",
        "registers_unmapped",
        "the kernel refused to map the GPU's register BAR",
        "reboot",
        "read the kernel's ioremap and PAT errors before it; reboot",
        OSINIT,
    ),
    entry(
        RM + r"Cannot configure the device for DMA",
        "dma_unconfigured",
        "the driver could not set up DMA translation for the GPU behind the IOMMU",
        "check_host",
        f"check the IOMMU: {IOMMU}",
        OSINIT,
    ),
    entry(
        RM + r"No firmware image found",
        "gsp_firmware_missing",
        "the GSP firmware of this driver version is not on disk or in the initramfs",
        "check_host",
        FIRMWARE,
        OSINIT,
    ),
    entry(
        RM + r"Failed to load gsp_log_\*\.bin, no GSP-RM logs will be printed",
        "gsp_log_firmware_missing",
        "only the GSP firmware's log decoder is missing: the GPU initialises",
        "none",
        "install the whole firmware set of this driver version if GSP-RM logs are wanted",
        OSINIT,
        severity=WARNING,
    ),
    entry(
        RM + r"GSP firmware image version mismatch: got version [\w.-]{1,32}, expected",
        "gsp_firmware_mismatch",
        "the GSP firmware on disk is another driver version's than the loaded module",
        "check_host",
        FIRMWARE,
        GSP,
    ),
    entry(
        RM + r"unexpected WPR2 already up, cannot proceed with booting GSP",
        "gsp_left_running",
        "the GPU still holds a previous GSP boot: it must be reset before the driver can start it",
        "reset_gpu",
        "reset the GPU (nvidia-smi -r) or power-cycle the host",
        GSP,
    ),
    entry(
        # Older drivers: "gpuWaitForGfwBootComplete_TU102: failed to wait for GFW_BOOT".
        RM + r"failed to wait for GFW(?:_BOOT| boot complete)",
        "gfw_boot_hung",
        "the GPU did not finish its power-on firmware boot: hung, or without power",
        "reboot",
        f"check its power cables, then {COLD}",
        TU102,
    ),
    entry(
        RM + r"FSP boot cmds failed\. RM cannot boot",
        "fsp_boot_failed",
        "the GPU's security processor (FSP) refused to boot its firmware",
        "reboot",
        f"{COLD}; update the GPU's firmware through its vendor",
        "src/nvidia/src/kernel/gpu/fsp/arch/hopper/kern_fsp_gh100.c",
    ),
    entry(
        RM + r"osVerifySystemEnvironment failed, bailing!",
        "interrupts_silent",
        "the GPU's interrupts do not reach the CPU (MSI or interrupt remapping)",
        "check_host",
        "check MSI (NVreg_EnableMSI), the IOMMU's interrupt remapping, the VM's MSI and BIOS",
        OSINIT,
    ),
    entry(
        RM
        + r"(?:failed to extract VBIOS image from ROM|did not find valid ROM signature"
        + r"|failed to parse FWSEC ucode from VBIOS image)",
        "vbios_unreadable",
        "the GPU's VBIOS could not be read, or is not valid",
        "reboot",
        f"{COLD}; if it repeats, reflash the board's VBIOS (in a VM: drop a romfile)",
        GSP,
    ),
    entry(
        r"failed to copy vbios to system memory",
        "vbios_not_copied",
        "the driver could not read the GPU's VBIOS (older drivers' words)",
        "check_host",
        "keep the GPU powered (bbswitch, vga_switcheroo), update the system BIOS, or use a "
        "current driver branch",
        "the proprietary nvidia.ko of older drivers (not in the open tree)",
    ),
    entry(
        RM + r"(?:failed to execute Booter Load|Failed to boot GSP\.)",
        "gsp_boot_failed",
        "the GPU's firmware processor (GSP) did not boot",
        "reboot",
        f"{COLD}; check that the firmware is the module's version",
        TU102,
    ),
    # RM's stage lines: where RmInitAdapter stopped, printed after the line that says why.
    entry(
        RM + r"Error preparing GSP-RM image",
        "gsp_image_unprepared",
        "the GSP firmware image could not be prepared for boot",
        "check_host",
        FIRMWARE,
        GSP,
        stage=True,
    ),
    entry(
        RM + r"Cannot initialize GSP firmware RM",
        "gsp_init_failed",
        "the GPU's firmware processor (GSP) could not be started",
        "reboot",
        f"{COLD}; check that the firmware is the module's version",
        OSINIT,
        stage=True,
    ),
    entry(
        RM + r"\*\*\* Cannot attach gpu",
        "attach_failed",
        "the driver could not attach the GPU (stage 0x22: status 0x56 is a GPU this module "
        "flavour or version does not support)",
        "reboot",
        DEFAULT_FIX,
        OSINIT,
        stage=True,
    ),
    entry(
        RM + r"osInitNvMapping failed, bailing out of RmInitAdapter",
        "mapping_failed",
        "the driver's first attach of the GPU failed",
        "reboot",
        DEFAULT_FIX,
        OSINIT,
        stage=True,
    ),
    entry(
        RM + r"RmInitX86Emu failed, bailing out of RmInitAdapter",
        "x86emu_failed",
        "the driver could not set up the GPU's VBIOS execution",
        "reboot",
        DEFAULT_FIX,
        OSINIT,
        stage=True,
    ),
    entry(
        RM + r"\*\*\* Cannot (?:pre-initialize|initialize|load state into) the device",
        "engines_failed",
        "one of the GPU's engines failed to pre-initialise, initialise or load",
        "reboot",
        DEFAULT_FIX,
        OSINIT,
        stage=True,
    ),
    entry(
        RM + r"RmInitNvDevice failed, bailing out of RmInitAdapter",
        "device_init_failed",
        "the GPU's engines could not be initialised",
        "reboot",
        DEFAULT_FIX,
        OSINIT,
        stage=True,
    ),
    # --- The failure itself: another reader's problem, never a cause. ---
    entry(
        DEV + r"(?:RmInitAdapter failed!|rm_init_adapter failed,)",
        "rm_init_adapter_failed",
        "the driver could not initialise the GPU: init_failed (gpuagent/sources/kernel/"
        "xidcount.py), its cause the lines before it",
        "reboot",
        DEFAULT_FIX,
        OSINIT,
        scope="failure",
    ),
    entry(
        DEV + r"GPU has fallen off the bus\.",
        "fell_off_bus",
        f"the GPU left the bus at run time: Xid 79, {XIDS}",
        "reboot",
        "see Xid 79",
        OSINIT,
        scope="failure",
    ),
    entry(
        XID + r"(?:79|119|154), ",
        "lost_gpu_xid",
        f"Xid 79 (fallen off the bus), 119 (GSP timeout), 154 (recovery action): {XIDS}",
        "reboot",
        "see the Xid's entry",
        "src/nvidia/src/kernel/gpu/rc/kernel_rc.c",
        scope="failure",
    ),
)
