"""The driver's messages about the nvidia module as a whole, which name no GPU: the
``no_driver_module`` reasons (entries of :data:`gpuagent.sources.kernel.drivermessages.CATALOG`;
pure).
"""

from __future__ import annotations

import re

from gpuagent.sources.kernel.drivercause import (
    EACH,
    NV,
    ONE_MODULE,
    OSAPI,
    Cause,
    entry,
)

__all__ = ["MODULE"]

MODULE: tuple[tuple[re.Pattern[str], Cause], ...] = (
    # --- The module as a whole: it names no GPU (no_driver_module's reasons). ---
    entry(
        r"No NVIDIA GPU found\.",
        "no_gpu_found",
        "the module found no NVIDIA GPU it can drive and refused to load",
        "check_host",
        "check lspci -d 10de: (reseat the board, the slot's power in BIOS, the VM's passthrough) "
        "and that NVreg_RegisterPCIDriver is not 0",
        NV,
        scope="module",
        reason="no_gpu_found",
    ),
    entry(
        r"No NVIDIA PCI devices found\.",
        "pci_driver_unregistered",
        "the module could not register its PCI driver with the kernel and unloaded",
        "check_host",
        ONE_MODULE,
        NV,
        scope="module",
        reason="module_init_failed",
    ),
    entry(
        r"failed to initialize module\.",
        "module_init_failed",
        "the module's own initialisation failed before it probed any GPU",
        "check_host",
        f"read the NVRM line before it; {ONE_MODULE}",
        NV,
        scope="module",
        reason="module_init_failed",
    ),
    entry(
        r"rm_init_rm\(\) failed!",
        "rm_init_rm_failed",
        "the driver's core (RM) could not initialise, so the module does not load",
        "check_host",
        "check the kernel's memory messages before it; reinstall the driver for this kernel",
        NV,
        scope="module",
        reason="module_init_failed",
    ),
    entry(
        r"register_chrdev_region\(\) failed for [\w-]{1,32}!",
        "device_numbers_taken",
        "the /dev/nvidia* device numbers are taken, most often by another nvidia module",
        "check_host",
        f"check /proc/devices for major 195; {ONE_MODULE}",
        NV,
        scope="module",
        reason="module_init_failed",
    ),
    entry(
        r"The NVIDIA probe routine was not called for \d{1,4} device",
        "probe_not_called",
        "another driver took some NVIDIA GPUs before the nvidia module could probe them",
        "check_host",
        "find the owner (lspci -k -d 10de:), blacklist it (modprobe.d, and the initramfs)",
        NV,
        scope="module",
        reason="other_driver",
    ),
    entry(
        r"No NVIDIA devices probed\.",
        "no_devices_probed",
        "the module probed no GPU (each taken by another driver, or refused) and unloaded",
        "check_host",
        "read the NVRM lines before it for each GPU's reason",
        NV,
        scope="module",
        reason="probe_failed",
    ),
    entry(
        r"The NVIDIA probe routine failed for \d{1,4} device",
        "probe_failed",
        "the module refused some GPUs at probe; the lines before it say why for each",
        "check_host",
        EACH,
        NV,
        scope="module",
        reason="probe_failed",
    ),
    entry(
        # Older drivers: "No NVIDIA graphics adapter probed!".
        r"(?:None of the NVIDIA devices were initialized\.|No NVIDIA graphics adapter probed!)",
        "none_initialized",
        "no GPU passed the probe, and the module unloaded",
        "check_host",
        EACH,
        NV,
        scope="module",
        reason="probe_failed",
    ),
    entry(
        # Read with its versions by gpuagent.sources.driver.driver.api_mismatch
        # (driver_mismatch); the client's name is the client's choice, so bounded.
        r"API mismatch: the client (?:'[^'\n]{0,64}' \(pid \d{1,10}\)\s+(?:NVRM:\s+)?)?"
        r"has the version \d",
        "api_mismatch",
        "a client of another driver version than the loaded module was refused",
        "reboot",
        "after a driver upgrade reboot (or reload the nvidia modules); else reinstall the "
        "driver so module and libraries are one version (driver_mismatch says which)",
        OSAPI,
        scope="module",
    ),
)
