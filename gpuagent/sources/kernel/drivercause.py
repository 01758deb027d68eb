"""What one driver message says (:class:`Cause`), and what the catalog's entries are made of:
the fixes, the driver's source files and the pattern pieces several entries share
(:data:`gpuagent.sources.kernel.drivermessages.CATALOG`; pure).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuagent.health import CRITICAL
from gpuagent.sources.bus.pciaddr import SLOT

__all__ = [
    "ABOVE_4G",
    "COLD",
    "DEFAULT_FIX",
    "DEV",
    "EACH",
    "FIRMWARE",
    "GPU",
    "GSP",
    "IOMMU",
    "NL",
    "NV",
    "ONE_MODULE",
    "OPEN",
    "OSAPI",
    "OSINIT",
    "PCI",
    "RESIZE",
    "RM",
    "SAME",
    "TU102",
    "XID",
    "XIDS",
    "Cause",
    "entry",
]


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
OPEN = "install the open kernel modules of the same driver version (nvidia-open, -open)"
FIRMWARE = (
    "install the GSP firmware of the loaded module's exact version (/lib/firmware/nvidia/"
    "VERSION/gsp_*.bin, from the driver's package) and rebuild the initramfs"
)
COLD = "power-cycle the host (a cold boot, not only a warm reboot); if it repeats, RMA the board"
IOMMU = "turn the IOMMU on (BIOS, and intel_iommu=on or amd_iommu=on with iommu=pt)"
ABOVE_4G = "enable Above 4G Decoding (and Resizable BAR) in BIOS, or 64-bit MMIO in the VM"
RESIZE = (
    "leave NVreg_EnableResizableBar at 0, or enable Above 4G Decoding and Resizable BAR in "
    "BIOS (or boot with pci=realloc)"
)
ONE_MODULE = (
    "unload the other nvidia module (lsmod, modprobe -r), keep one nvidia.ko for this kernel "
    "(reinstall the driver, DKMS), and load it again"
)
SAME = "a reboot loads the same"
EACH = "act on each GPU's own reason, printed before it"
NV = "kernel-open/nvidia/nv.c"
PCI = "kernel-open/nvidia/nv-pci.c"
OSAPI = "src/nvidia/arch/nvalloc/unix/src/osapi.c"
OSINIT = "src/nvidia/arch/nvalloc/unix/src/osinit.c"
GSP = "src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c"
TU102 = "src/nvidia/src/kernel/gpu/gsp/arch/turing/kernel_gsp_tu102.c"
XIDS = "the Xid catalog's (gpuagent/sources/kernel/xidcatalog.py): never a cause"
# A GPU as the probe's multi-line printks name it, each line after the first with NVRM:.
GPU = (
    rf"The NVIDIA v?GPU (?P<slot>{SLOT})\s+(?:NVRM:\s+)?\(PCI ID: [0-9a-fA-F]{{4}}:"
    r"[0-9a-fA-F]{4}\)\s+(?:NVRM:\s+)?installed in this "
)
NL = r"\s+(?:NVRM:\s+)?"
# RM's prefix inside RmInitAdapter: "GPU0 function: ", or "function: " before it has a GPU.
RM = r"(?:GPU\d{1,3} )?\w{1,64}: "
# NV_DEV_PRINTF's prefix.
DEV = rf"GPU (?P<slot>{SLOT}): "
XID = r"Xid \((?:PCI:)?[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\): "


def entry(
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
