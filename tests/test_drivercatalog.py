"""gpuagent.sources.kernel.drivercatalog: every entry with the driver's exact text.

The texts are the driver's format strings (NVIDIA/open-gpu-kernel-modules 595.45.04, commit
df1c9a3; the file each entry names) with values filled in, one record each as journald keeps
a multi-line printk; "requires use of the NVIDIA open kernel modules" is the proprietary
module's, as NVIDIA/open-gpu-kernel-modules#1332 and awslabs/amazon-eks-ami#2769 quote it.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpuagent.health import ACTIONS, SEVERITIES, WARNING
from gpuagent.logs import Event
from gpuagent.sources.driver.driver import REASONS, absence_reason
from gpuagent.sources.kernel.drivercatalog import CATALOG, Causes, explain, parse
from gpuagent.sources.kernel.drivermessages import SCOPES
from tests import fakesysfs
from tests.conftest import Host
from tests.test_kernel import running_before
from tests.test_kernlog import corpus_text, make

__all__ = ["make"]  # the journal fixture, for the tests below

SLOT = "0000:3b:00.0"
# (the record, the GPU it names (None: RM's instance only, or none), the entry's name): each
# of the 72 messages of /work/scratch's survey of df1c9a3 (its id in the comment), its text
# the format string with values filled in.
MESSAGES = [
    # no_nvidia_gpu_found
    ("NVRM: No NVIDIA GPU found.", None, "no_gpu_found"),
    # pci_driver_register_failed
    ("NVRM: No NVIDIA PCI devices found.", None, "pci_driver_unregistered"),
    # module_init_failed
    ("NVRM: failed to initialize module.", None, "module_init_failed"),
    # rm_init_rm_failed
    ("NVRM: rm_init_rm() failed!", None, "rm_init_rm_failed"),
    # chrdev_region_failed
    ("NVRM: register_chrdev_region() failed for nvidia!", None, "device_numbers_taken"),
    # gpu_already_bound
    ("NVRM: GPU 0000:01:00.0 is already bound to nouveau.", "0000:01:00.0", "other_driver"),
    # probe_not_called
    (
        "NVRM: The NVIDIA probe routine was not called for 1 device(s).\n"
        "NVRM: This can occur when another driver was loaded and \n"
        "NVRM: obtained ownership of the NVIDIA device(s).\n"
        "NVRM: Try unloading the conflicting kernel module (and/or\n"
        "NVRM: reconfigure your kernel without the conflicting\n"
        "NVRM: driver(s)), then try loading the NVIDIA kernel module\n"
        "NVRM: again.",
        None,
        "probe_not_called",
    ),
    # no_devices_probed
    ("NVRM: No NVIDIA devices probed.", None, "no_devices_probed"),
    # probe_failed_count
    ("NVRM: The NVIDIA probe routine failed for 1 device(s).", None, "probe_failed"),
    # none_initialized
    ("NVRM: None of the NVIDIA devices were initialized.", None, "none_initialized"),
    # vf_probe_no_iommu
    (
        "NVRM: Aborting probe for VF 0000:3b:00.4 since IOMMU is not present on the system.",
        "0000:3b:00.4",
        "iommu_absent",
    ),
    # vf_probe_ignored
    ("NVRM: Ignoring probe for VF 0000:3b:00.4 ", "0000:3b:00.4", "vf_ignored"),
    # bar_firewall_timeout
    ("NVRM: failed to wait for bar firewall to lower", None, "bar_firewall"),
    # legacy_gpu_ignored
    ("NVRM: ignoring the legacy GPU 0000:01:00.0", "0000:01:00.0", "legacy_gpu"),
    # pci_enable_device_failed
    ("NVRM: pci_enable_device failed, aborting", None, "pci_enable_failed"),
    # no_irq
    (
        "NVRM: Can't find an IRQ for your NVIDIA card!\n"
        "NVRM: Please check your BIOS settings.\n"
        "NVRM: [Plug & Play OS] should be set to NO\n"
        "NVRM: [Assign IRQ to VGA] should be set to YES ",
        None,
        "no_irq_assigned",
    ),
    # bar_invalid
    (
        "NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:\n"
        "NVRM: BAR1 is 0M @ 0x0 (PCI:0000:3b:00.0)",
        "0000:3b:00.0",
        "bar_unassigned",
    ),
    # request_mem_region_failed
    (
        "NVRM: request_mem_region failed for 16M @ 0xf2000000. This can\n"
        "NVRM: occur when a driver such as rivatv is loaded and claims\n"
        "NVRM: ownership of the device's registers.",
        None,
        "registers_claimed",
    ),
    # bar1_resize_no_space
    ("NVRM: No address space to allocate resized BAR1.", None, "bar1_no_space"),
    # bar_resize_failed
    ("NVRM: BAR resizing failed with error `-22`.", None, "bar_resize_refused"),
    # bar1_realloc_failed
    ("NVRM: FATAL: Failed to re-allocate BAR1.", None, "bar1_lost"),
    # bar_resize_fatal
    ("NVRM: Fatal Error while attempting to resize PCIe BARs.", None, "bar_resize_fatal"),
    # rm_init_private_state_failed
    (
        "NVRM: GPU 0000:3b:00.0: rm_init_private_state() failed!",
        "0000:3b:00.0",
        "unknown_to_driver",
    ),
    # device_start_failed
    ("NVRM: Device start failed for 0000:3b:00.0 (ret=-5)", "0000:3b:00.0", "start_failed"),
    # gpu_fell_off_bus_at_probe
    (
        "NVRM: The NVIDIA GPU 0000:3b:00.0\n"
        "NVRM: (PCI ID: 10de:2330) installed in this system has\n"
        "NVRM: fallen off the bus and is not responding to commands.",
        "0000:3b:00.0",
        "fell_off_bus_at_probe",
    ),
    # gpu_unsupported_by_release
    (
        "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:25a0)\n"
        "NVRM: installed in this system is not supported by the\n"
        "NVRM: NVIDIA 520.56.06 driver release.\n"
        "NVRM: Please see 'Appendix A - Supported NVIDIA GPU Products'\n"
        "NVRM: in this release's README, available on the operating system\n"
        "NVRM: specific graphics driver download page at www.nvidia.com.",
        "0000:01:00.0",
        "unsupported_by_release",
    ),
    # gpu_needs_gsp_not_supported_by_open
    (
        "NVRM: The NVIDIA GPU 0000:af:00.0 (PCI ID: 10de:1db5)\n"
        "NVRM: installed in this system is not supported by open\n"
        "NVRM: nvidia.ko because it does not include the required GPU\n"
        "NVRM: System Processor (GSP).\n"
        "NVRM: Please see the 'Open Linux Kernel Modules' and 'GSP\n"
        "NVRM: Firmware' sections in the driver README, available on\n"
        "NVRM: the Linux graphics driver download page at\n"
        "NVRM: www.nvidia.com.",
        "0000:af:00.0",
        "proprietary_modules_required",
    ),
    # gpu_not_supported_by_open_on_vgpu_host
    (
        "NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:1db4)\n"
        "NVRM: installed in this vGPU host system is not supported by\n"
        "NVRM: open nvidia.ko.\n"
        "NVRM: Please see the 'Open Linux Kernel Modules' and 'GSP\n"
        "NVRM: Firmware' sections in the NVIDIA Virtual GPU (vGPU)\n"
        "NVRM: Software documentation, available at docs.nvidia.com.",
        "0000:3b:00.0",
        "vgpu_host_module_required",
    ),
    # vgpu_not_supported_by_open
    (
        "NVRM: The NVIDIA vGPU 0000:02:00.0 (PCI ID: 10de:1eb8)\n"
        "NVRM: installed in this system is not supported by open\n"
        "NVRM: nvidia.ko.\n"
        "NVRM: Please see the 'Open Linux Kernel Modules' and 'GSP\n"
        "NVRM: Firmware' sections in the NVIDIA Virtual GPU (vGPU)\n"
        "NVRM: Software documentation, available at docs.nvidia.com.",
        "0000:02:00.0",
        "vgpu_guest_module_required",
    ),
    # requires_open_kernel_modules
    (
        "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2d58)\n"
        "NVRM: installed in this system requires use of the NVIDIA open kernel modules.",
        "0000:01:00.0",
        "open_modules_required",
    ),
    # msi_enable_failed
    (
        "NVRM: GPU 0000:3b:00.0: Failed to enable MSI; falling back to PCIe "
        "virtual-wire interrupts.",
        "0000:3b:00.0",
        "msi_unavailable",
    ),
    # msix_enable_failed
    ("NVRM: GPU 0000:3b:00.0: Failed to enable MSI-X.", "0000:3b:00.0", "msix_unavailable"),
    # no_interrupts_available
    (
        "NVRM: GPU 0000:3b:00.0: No interrupts of any type are available. Cannot use this GPU.",
        "0000:3b:00.0",
        "no_interrupt",
    ),
    # irq_in_use_by_other_driver
    (
        "NVRM: GPU 0000:3b:00.0: Tried to get IRQ 16, but another driver\n"
        "NVRM: has it and is not sharing it.\n"
        "NVRM: You may want to verify that no audio driver is using the IRQ.",
        "0000:3b:00.0",
        "no_interrupt",
    ),
    # request_irq_failed
    ("NVRM: GPU 0000:3b:00.0: request_irq() failed (-16)", "0000:3b:00.0", "no_interrupt"),
    # rm_init_adapter_failed_minor
    (
        "NVRM: GPU 0000:3b:00.0: rm_init_adapter failed, device minor number 0",
        "0000:3b:00.0",
        "rm_init_adapter_failed",
    ),
    # device_unavailable_sequestered
    ("NVRM: GPU 0000:3b:00.0: Device is currently unavailable", "0000:3b:00.0", "sequestered"),
    # open_excluded_gpu
    (
        "NVRM: GPU 0000:3b:00.0: open() not permitted for excluded "
        "GPU-5f2c4a1e-8b3d-11ee-9c1a-0242ac120002",
        "0000:3b:00.0",
        "excluded",
    ),
    # rm_init_adapter_failed
    (
        "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x62:0x40:2168)",
        "0000:3b:00.0",
        "rm_init_adapter_failed",
    ),
    # regs_map_failed
    (
        "NVRM: GPU 0000:3b:00.0: Failed to map regs registers!!",
        "0000:3b:00.0",
        "registers_unmapped",
    ),
    # dma_config_failed
    ("NVRM: RmInitAdapter: Cannot configure the device for DMA", None, "dma_unconfigured"),
    # gsp_firmware_missing
    ("NVRM: RmFetchGspRmImages: No firmware image found", None, "gsp_firmware_missing"),
    # gsp_firmware_direct_load_failed
    (
        "nvidia 0000:3b:00.0: Direct firmware load for "
        "nvidia/595.45.04/gsp_ga10x.bin failed with error -2",
        "0000:3b:00.0",
        "gsp_firmware_missing",
    ),
    # gsp_log_firmware_missing
    (
        "NVRM: RmFetchGspRmImages: Failed to load gsp_log_*.bin, no GSP-RM logs will "
        "be printed (non-fatal)",
        None,
        "gsp_log_firmware_missing",
    ),
    # cannot_attach_gpu
    ("NVRM: osInitNvMapping: *** Cannot attach gpu", None, "attach_failed"),
    # osinitnvmapping_failed
    (
        "NVRM: RmInitAdapter: osInitNvMapping failed, bailing out of RmInitAdapter",
        None,
        "mapping_failed",
    ),
    # gsp_init_failed
    ("NVRM: GPU0 RmInitAdapter: Cannot initialize GSP firmware RM", None, "gsp_init_failed"),
    # x86emu_failed
    (
        "NVRM: GPU0 RmInitAdapter: RmInitX86Emu failed, bailing out of RmInitAdapter",
        None,
        "x86emu_failed",
    ),
    # gpu_preinit_failed
    ("NVRM: GPU0 RmInitNvDevice: *** Cannot pre-initialize the device", None, "engines_failed"),
    # gpu_state_init_failed
    ("NVRM: GPU0 RmInitNvDevice: *** Cannot initialize the device", None, "engines_failed"),
    # gpu_state_load_failed
    ("NVRM: GPU0 RmInitNvDevice: *** Cannot load state into the device", None, "engines_failed"),
    # rm_init_nv_device_failed
    (
        "NVRM: GPU0 RmInitAdapter: RmInitNvDevice failed, bailing out of RmInitAdapter",
        None,
        "device_init_failed",
    ),
    # insufficient_power
    (
        "NVRM: GPU 0000:3b:00.0: GPU does not have the necessary power cables connected.",
        "0000:3b:00.0",
        "power_cables",
    ),
    # irq_not_firing
    (
        "NVRM: GPU0 RmInitAdapter: osVerifySystemEnvironment failed, bailing!",
        None,
        "interrupts_silent",
    ),
    # wpr2_already_up
    (
        "NVRM: GPU0 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with "
        "booting GSP\n"
        "NVRM: GPU0 _kgspBootGspRm: (the GPU is likely in a bad state and may need "
        "to be reset)",
        None,
        "gsp_left_running",
    ),
    # gsp_firmware_version_mismatch
    (
        "NVRM: GPU0 _kgspFwContainerVerifyVersion: GSP firmware image version "
        "mismatch: got version 595.71.05, expected version 595.45.04",
        None,
        "gsp_firmware_mismatch",
    ),
    # gsp_image_prep_failed
    ("NVRM: GPU0 kgspInitRm_IMPL: Error preparing GSP-RM image", None, "gsp_image_unprepared"),
    # vbios_extract_failed
    (
        "NVRM: GPU0 kgspInitRm_IMPL: failed to extract VBIOS image from ROM: 0x25",
        None,
        "vbios_unreadable",
    ),
    # vbios_rom_signature_invalid
    (
        "NVRM: GPU0 kgspExtractVbiosFromRom_TU102: did not find valid ROM signature",
        None,
        "vbios_unreadable",
    ),
    # fwsec_parse_failed
    (
        "NVRM: GPU0 kgspInitRm_IMPL: failed to parse FWSEC ucode from VBIOS image "
        "(VBIOS version 94.02.71.40.83): 0x25",
        None,
        "vbios_unreadable",
    ),
    # gfw_boot_timeout
    (
        "NVRM: GPU0 kgspWaitForGfwBootOk_TU102: failed to wait for GFW boot "
        "complete: 0x65 VBIOS version 94.02.59.00.05\n"
        "NVRM: GPU0 kgspWaitForGfwBootOk_TU102: (the GPU may be in a bad state and "
        "may need to be reset)",
        None,
        "gfw_boot_hung",
    ),
    # booter_load_failed
    (
        "NVRM: GPU0 kgspBootstrap_TU102: failed to execute Booter Load (ucode for "
        "initial boot): 0x65",
        None,
        "gsp_boot_failed",
    ),
    # gsp_boot_failed
    ("NVRM: GPU0 kgspBootstrap_TU102: Failed to boot GSP.", None, "gsp_boot_failed"),
    # fsp_boot_failed
    (
        "NVRM: GPU0 kfspSendBootCommands_GH100: FSP boot cmds failed. RM cannot boot.",
        None,
        "fsp_boot_failed",
    ),
    # gpu_fell_off_bus
    ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", "0000:3b:00.0", "fell_off_bus"),
    # xid79_fallen_off_bus
    ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", None, "lost_gpu_xid"),
    # xid119_gsp_rpc_timeout
    (
        "NVRM: Xid (PCI:0000:3b:00): 119, pid=2314, name=nvidia-smi, Timeout after "
        "6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) sequence 3021 (0x20800a4c 0x4).",
        None,
        "lost_gpu_xid",
    ),
    # xid154_recovery_action
    (
        "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 "
        "(None) to 0x2 (Node Reboot Required)",
        None,
        "lost_gpu_xid",
    ),
    # unhandled_irq_threshold
    ("NVRM: Going over RM unhandled interrupt threshold for irq 16", None, "interrupt_storm"),
    # api_mismatch
    (
        "NVRM: API mismatch: the client 'nvidia-smi' (pid 4242)\n"
        "NVRM: has the version 595.71.05, but this kernel module has\n"
        "NVRM: the version 595.45.04.  Please make sure that this\n"
        "NVRM: kernel module and all NVIDIA driver components\n"
        "NVRM: have the same version.",
        None,
        "api_mismatch",
    ),
    # dma_address_not_addressable
    (
        "NVRM: 0000:3b:00.0: DMA address not in addressable range of device "
        "(0x8000000000-0x8000000fff, 0x0-0x7fffffffff)",
        "0000:3b:00.0",
        "dma_out_of_range",
    ),
    # failed_copy_vbios_legacy
    ("NVRM: failed to copy vbios to system memory.", None, "vbios_not_copied"),
]
# Other words of the same entries: older drivers', a capture's, RM's lines one record each.
OTHER_WORDS = [
    (
        "nvidia 0000:3b:00.0: Direct firmware load for nvidia/595.45.04/gsp_ga10x.bin failed "
        "with error -2",
        SLOT,
        "gsp_firmware_missing",
    ),
    (
        "NVRM: GPU0 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP",
        None,
        "gsp_left_running",
    ),
    # rminitadapter-failed-gsp-driver550's records (the capture, their times dropped).
    ("NVRM: RmInitAdapter: Cannot initialize GSP firmware RM", None, "gsp_init_failed"),
    (
        "NVRM: gpuWaitForGfwBootComplete_TU102: failed to wait for GFW_BOOT: (progress 0x3)",
        None,
        "gfw_boot_hung",
    ),
    ("NVRM: No NVIDIA graphics adapter probed!", None, "none_initialized"),
    ("NVRM: Xid (0000:3b:00): 79, GPU has fallen off the bus.", None, "lost_gpu_xid"),
    (
        "NVRM: API mismatch: the client has the version 367.44, but\n"
        "NVRM: this kernel module has the version 367.35.  Please\n"
        "NVRM: make sure that this kernel module and all NVIDIA driver\n"
        "NVRM: components have the same version.",
        None,
        "api_mismatch",
    ),
]
TEXTS = MESSAGES + OTHER_WORDS


@pytest.mark.parametrize(("text", "slot", "name"), TEXTS, ids=[t[2] for t in TEXTS])
def test_each_record_names_its_gpu_and_its_cause(text: str, slot: str | None, name: str) -> None:
    found = parse(text)
    assert found is not None
    assert (found[0], found[1].name) == (slot, name)
    # As dmesg indents its continuation lines, and with journald's trailing newline.
    assert parse(text.replace("\nNVRM: ", "\n  NVRM: ") + "\n") == found


def test_every_entry_has_a_text_an_action_and_a_fix() -> None:
    names = {cause.name for _, cause in CATALOG}
    assert names == {name for _, _, name in TEXTS}
    assert len(MESSAGES) == 72
    for pattern, cause in CATALOG:
        assert cause.action in ACTIONS
        assert cause.severity in SEVERITIES
        assert cause.scope in SCOPES
        assert cause.means and cause.fix and cause.source
        # Reboot only where a reboot can help: a host fix is no reboot.
        if "a reboot loads the same" in cause.fix:
            assert cause.action == "check_host"
        # A module-wide entry names no GPU; only a GPU's cause is a warning or a stage line.
        if cause.scope == "module":
            assert "slot" not in pattern.groupindex
        if cause.severity == WARNING or cause.stage:
            assert cause.scope == "gpu"
        # The reasons no_driver_module tells are driver.py's.
        assert cause.reason in {"", *REASONS}


@pytest.mark.parametrize(("text", "slot", "name"), TEXTS, ids=[t[2] for t in TEXTS])
def test_the_module_wide_reasons_are_the_catalogs(text: str, slot: str | None, name: str) -> None:
    """driver.py's reasons for an absent module are the catalog entries' (one table)."""
    (cause,) = (c for _, c in CATALOG if c.name == name)
    assert absence_reason(text) == (cause.reason or None)


@pytest.mark.parametrize(
    "text",
    [
        # Another subsystem's record carrying the words (a tmpfs mount option any user sets).
        "tmpfs: Bad value for 'size': NVRM: GPU 0000:3b:00.0: Device is currently unavailable",
        # A later line of the driver's record is no head of one.
        "NVRM: API mismatch: the client has the version\nNVRM: GPU 0000:3b:00.0: Device is "
        "currently unavailable",
        # A user's words on a line of the driver's record.
        "NVRM: GPU 0000:3b:00.0: Device is currently unavailable\nuser text",
        "nvidia 0000:3b:00.0: Direct firmware load for other/x.bin failed with error -2",
        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  595.45.04",
    ],
)
def test_other_words_are_no_cause(text: str) -> None:
    assert parse(text) is None


def test_a_cause_that_names_no_gpu_is_the_next_init_failures() -> None:
    causes = Causes()
    causes.add("NVRM: RmFetchGspRmImages: No firmware image found")
    assert causes.by_slot == {}
    causes.failed(SLOT)
    assert causes.by_slot[SLOT].name == "gsp_firmware_missing"
    # The first cause of a GPU stays: what followed it, as strong, is its consequence.
    causes.add("NVRM: GPU 0000:3b:00.0: Device is currently unavailable")
    causes.failed(SLOT)
    assert causes.by_slot[SLOT].name == "gsp_firmware_missing"
    # A failure with nothing waiting says nothing.
    causes.failed("0000:5e:00.0")
    assert "0000:5e:00.0" not in causes.by_slot


def _causes(*records: str) -> dict[str, str]:
    causes = Causes()
    for record in records:
        causes.add(record)
    return {slot: cause.name for slot, cause in causes.by_slot.items()}


MSI = "NVRM: GPU 0000:3b:00.0: Failed to enable MSI; falling back to PCIe virtual-wire interrupts."
CABLES = "NVRM: GPU 0000:3b:00.0: GPU does not have the necessary power cables connected."
FAILED = "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x24:0x1c:1343)"


def test_a_later_critical_cause_replaces_a_warning() -> None:
    assert _causes(MSI) == {SLOT: "msi_unavailable"}
    assert _causes(MSI, CABLES, FAILED) == {SLOT: "power_cables"}


def test_a_later_warning_replaces_nothing() -> None:
    assert _causes(CABLES, MSI, FAILED) == {SLOT: "power_cables"}
    # Nor does one that waits: the stronger waiting cause is the failure's.
    gsp_log = "NVRM: RmFetchGspRmImages: Failed to load gsp_log_*.bin, no GSP-RM logs will be "
    gsp_log += "printed (non-fatal)"
    stage = "NVRM: GPU0 RmInitAdapter: Cannot initialize GSP firmware RM"
    assert _causes(gsp_log, stage, FAILED) == {SLOT: "gsp_init_failed"}
    assert _causes(stage, gsp_log, FAILED) == {SLOT: "gsp_init_failed"}


def test_the_stage_lines_after_the_specific_cause_leave_it_the_cause() -> None:
    """A real RmInitAdapter failure: the line that says why, then RM's stage lines as it
    unwinds, then the failure naming the slot (osinit.c)."""
    rm = "NVRM: GPU0 "
    assert _causes(
        rm + "RmInitNvDevice: *** Cannot initialize the device",
        rm + "RmInitAdapter: RmInitNvDevice failed, bailing out of RmInitAdapter",
        CABLES,
        FAILED,
        "NVRM: GPU 0000:3b:00.0: rm_init_adapter failed, device minor number 0",
        "NVRM: Device start failed for 0000:3b:00.0 (ret=-5)",
    ) == {SLOT: "power_cables"}
    assert _causes(
        rm + "kgspInitRm_IMPL: failed to extract VBIOS image from ROM: 0x25",
        rm + "kgspInitRm_IMPL: Error preparing GSP-RM image",
        rm + "RmInitAdapter: Cannot initialize GSP firmware RM",
        FAILED,
    ) == {SLOT: "vbios_unreadable"}
    # A stage line alone is the cause until a later try of the GPU says why.
    attach = ("NVRM: osInitNvMapping: *** Cannot attach gpu", FAILED)
    assert _causes(*attach) == {SLOT: "attach_failed"}
    vbios = rm + "kgspExtractVbiosFromRom_TU102: did not find valid ROM signature"
    assert _causes(*attach, vbios, FAILED) == {SLOT: "vbios_unreadable"}


def test_a_probe_time_cause_is_the_failed_probes() -> None:
    """Records of the probe that name no GPU wait for the kernel's own record of the probe
    that failed (drivers/base/dd.c, either form), which names it."""
    for failed in (
        "nvidia: probe of 0000:3b:00.0 failed with error -1",
        "nvidia 0000:3b:00.0: probe with driver nvidia failed with error -1",
    ):
        assert _causes("NVRM: pci_enable_device failed, aborting", failed) == {
            SLOT: "pci_enable_failed"
        }
    # Another driver's probe is no failure of nvidia's.
    other = "nouveau 0000:3b:00.0: probe with driver nouveau failed with error -2"
    assert _causes("NVRM: pci_enable_device failed, aborting", other) == {}


@pytest.mark.parametrize(
    ("text", "slot", "name"),
    [t for t in TEXTS if next(c for _, c in CATALOG if c.name == t[2]).scope != "gpu"],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v and " " not in v else None,
)
def test_a_module_wide_message_or_a_failure_is_no_gpus_cause(
    text: str, slot: str | None, name: str
) -> None:
    """The module's words name no GPU, and the failure itself (RmInitAdapter's, the Xid
    catalog's lost GPU) is another reader's problem: none of them is a GPU's cause, nor
    waits for a failure."""
    causes = Causes()
    causes.add(text)
    causes.failed(SLOT)
    assert causes.by_slot == {}


def test_a_critical_cause_says_what_to_do_and_a_warning_only_beside_the_default() -> None:
    (cables,) = (c for _, c in CATALOG if c.name == "power_cables")
    (msi,) = (c for _, c in CATALOG if c.name == "msi_unavailable")
    assert explain(None, "reboot", "; reboot") == ("reboot", "; reboot")
    assert explain(cables, "reboot", "; reboot") == (
        "check_host",
        f": {cables.means}; {cables.fix}",
    )
    # The driver went on after a warning: the failure keeps its generic action.
    action, said = explain(msi, "reboot", "; reboot")
    assert action == "reboot"
    assert said == f"; reboot; the driver also warned: {msi.means} ({msi.fix})"


def test_a_gpu_the_proprietary_module_cannot_take_says_which_module(host: Host, make: Any) -> None:
    """awslabs/amazon-eks-ami#2769: a Blackwell GPU under the proprietary module.  A reboot
    loads the same module: the action is the host's fix, not a reboot (issue 39)."""
    sick = host.slots[2]
    fakesysfs.bind(host.root, sick, None)
    host.healthy(slots=[s for s in host.slots if s != sick])
    # One record: make-test-journal joins an indented line to the one before, as dmesg
    # shows a record's later lines.
    open_only = next(t for t, _, name in TEXTS if name == "open_modules_required")
    text = open_only.replace("0000:01:00.0", sick).replace("\nNVRM:", "\n NVRM:")
    host.make_agent(journal_directory=make(text + "\n"))
    host.tick(2)
    (p,) = next(g for g in host.state["gpus"] if g["pci_slot"] == sick)["problems"]
    assert (p["kind"], p["severity"], p["action"]) == ("no_driver", "critical", "check_host")
    assert "runs only with the open kernel modules" in p["message"]
    assert "install the open kernel modules" in p["message"]
    (line,) = host.events(Event.problem("no_driver"))
    assert "action: check_host" in line.getMessage()


def test_an_init_failure_takes_its_cause_from_the_records_before_it(host: Host, make: Any) -> None:
    """The GSP firmware missing (the driver's words, NVIDIA/open-gpu-kernel-modules#639), then
    the captured init failure of the same GPU: init_failed names the firmware to install."""
    failure = corpus_text("rminitadapter-failed-gsp-driver550").splitlines()
    sick = host.slots[3]
    lines = [
        "NVRM: RmFetchGspRmImages: No firmware image found",
        *(re.sub(r"^\[[ \d.]+\] ", "", line) for line in failure[1:]),
    ]
    text = "\n".join(lines).replace("0000:98:00", sick[: -len(".0")]) + "\n"
    running_before(host.make_agent(journal_directory=make(text)))
    host.tick(2)
    (p,) = next(g for g in host.state["gpus"] if g["pci_slot"] == sick)["problems"]
    assert (p["kind"], p["action"]) == ("init_failed", "check_host")
    assert p["message"].startswith(
        "the driver could not initialise the GPU (RmInitAdapter failed (0x62:0x65:1792)): the "
        "GSP firmware of this driver version is not on disk"
    )
