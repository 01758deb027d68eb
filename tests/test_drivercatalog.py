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

from gpuagent.health import ACTIONS
from gpuagent.logs import Event
from gpuagent.sources.kernel.drivercatalog import CATALOG, Causes, parse
from tests import fakesysfs
from tests.conftest import Host
from tests.test_kernel import running_before
from tests.test_kernlog import corpus_text, make

__all__ = ["make"]  # the journal fixture, for the tests below

SLOT = "0000:3b:00.0"
# (the record, the GPU it names (None: RM's instance only, or none), the cause's name)
TEXTS = [
    (
        "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2d58)\n"
        "NVRM: installed in this system requires use of the NVIDIA open kernel modules.",
        "0000:01:00.0",
        "open_modules_required",
    ),
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
    (
        "NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:1db4)\n"
        "NVRM: installed in this vGPU host system is not supported by\n"
        "NVRM: open nvidia.ko.\n"
        "NVRM: Please see the 'Open Linux Kernel Modules' and 'GSP\n"
        "NVRM: Firmware' sections in the NVIDIA Virtual GPU (vGPU)\n"
        "NVRM: Software documentation, available at docs.nvidia.com.",
        SLOT,
        "vgpu_host_module_required",
    ),
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
    (
        "NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:\n"
        "NVRM: BAR1 is 0M @ 0x0 (PCI:0000:3b:00.0)",
        SLOT,
        "bar_unassigned",
    ),
    (
        "NVRM: Aborting probe for VF 0000:3b:00.4 since IOMMU is not present on the system.",
        "0000:3b:00.4",
        "iommu_absent",
    ),
    (
        "NVRM: GPU 0000:3b:00.0: GPU does not have the necessary power cables connected.",
        SLOT,
        "power_cables",
    ),
    (
        "NVRM: GPU 0000:3b:00.0: No interrupts of any type are available. Cannot use this GPU.",
        SLOT,
        "no_interrupt",
    ),
    (
        "NVRM: GPU 0000:3b:00.0: Tried to get IRQ 16, but another driver\n"
        "NVRM: has it and is not sharing it.\n"
        "NVRM: You may want to verify that no audio driver is using the IRQ.",
        SLOT,
        "no_interrupt",
    ),
    ("NVRM: GPU 0000:3b:00.0: Device is currently unavailable", SLOT, "sequestered"),
    ("NVRM: RmInitAdapter: Cannot configure the device for DMA", None, "dma_unconfigured"),
    ("NVRM: RmFetchGspRmImages: No firmware image found", None, "gsp_firmware_missing"),
    (
        "nvidia 0000:3b:00.0: Direct firmware load for nvidia/595.45.04/gsp_ga10x.bin failed "
        "with error -2",
        SLOT,
        "gsp_firmware_missing",
    ),
    (
        "NVRM: GPU0 _kgspFwContainerVerifyVersion: GSP firmware image version mismatch: got "
        "version 595.71.05, expected version 595.45.04",
        None,
        "gsp_firmware_mismatch",
    ),
    (
        "NVRM: GPU0 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP",
        None,
        "gsp_left_running",
    ),
    (
        "NVRM: GPU0 kgspWaitForGfwBootOk_TU102: failed to wait for GFW boot complete: 0x65 "
        "VBIOS version 94.02.59.00.05",
        None,
        "gfw_boot_hung",
    ),
    (
        "NVRM: GPU0 kfspSendBootCommands_GH100: FSP boot cmds failed. RM cannot boot.",
        None,
        "fsp_boot_failed",
    ),
    ("NVRM: failed to wait for bar firewall to lower", None, "bar_firewall"),
    ("NVRM: ignoring the legacy GPU 0000:01:00.0", "0000:01:00.0", "legacy_gpu"),
    ("NVRM: GPU 0000:3b:00.0: rm_init_private_state() failed!", SLOT, "unknown_to_driver"),
    (
        "NVRM: GPU0 RmInitAdapter: osVerifySystemEnvironment failed, bailing!",
        None,
        "interrupts_silent",
    ),
    (
        "NVRM: GPU0 kgspInitRm_IMPL: failed to extract VBIOS image from ROM: 0x25",
        None,
        "vbios_unreadable",
    ),
    (
        "NVRM: GPU0 kgspExtractVbiosFromRom_TU102: did not find valid ROM signature",
        None,
        "vbios_unreadable",
    ),
    (
        "NVRM: GPU0 kgspBootstrap_TU102: failed to execute Booter Load (ucode for initial "
        "boot): 0x65",
        None,
        "gsp_boot_failed",
    ),
    ("NVRM: GPU0 kgspBootstrap_TU102: Failed to boot GSP.", None, "gsp_boot_failed"),
    ("NVRM: GPU 0000:01:00.0 is already bound to nouveau.", "0000:01:00.0", "other_driver"),
    (
        "NVRM: GPU 0000:3b:00.0: open() not permitted for excluded "
        "GPU-5f2c4a1e-8b3d-11ee-9c1a-0242ac120002",
        SLOT,
        "excluded",
    ),
    ("NVRM: GPU 0000:3b:00.0: request_irq() failed (-16)", SLOT, "no_interrupt"),
    (
        "NVRM: GPU0 kgspInitRm_IMPL: failed to parse FWSEC ucode from VBIOS image (VBIOS "
        "version 94.02.71.40.83): 0x25",
        None,
        "vbios_unreadable",
    ),
    # rminitadapter-failed-gsp-driver550's first record (the capture, its time dropped).
    ("NVRM: RmInitAdapter: Cannot initialize GSP firmware RM", None, "gsp_boot_failed"),
]


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
    for _, cause in CATALOG:
        assert cause.action in ACTIONS
        assert cause.means and cause.fix and cause.source
        # Reboot only where a reboot can help: a host fix is no reboot.
        if "a reboot loads the same" in cause.fix:
            assert cause.action == "check_host"


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
    # The first cause of a GPU stays: what followed it is its consequence.
    causes.add("NVRM: GPU 0000:3b:00.0: Device is currently unavailable")
    causes.failed(SLOT)
    assert causes.by_slot[SLOT].name == "gsp_firmware_missing"
    # A failure with nothing waiting says nothing.
    causes.failed("0000:5e:00.0")
    assert "0000:5e:00.0" not in causes.by_slot


def test_a_gpu_the_proprietary_module_cannot_take_says_which_module(host: Host, make: Any) -> None:
    """awslabs/amazon-eks-ami#2769: a Blackwell GPU under the proprietary module.  A reboot
    loads the same module: the action is the host's fix, not a reboot (issue 39)."""
    sick = host.slots[2]
    fakesysfs.bind(host.root, sick, None)
    host.healthy(slots=[s for s in host.slots if s != sick])
    # One record: make-test-journal joins an indented line to the one before, as dmesg
    # shows a record's later lines.
    text = TEXTS[0][0].replace("0000:01:00.0", sick).replace("\nNVRM:", "\n NVRM:")
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
