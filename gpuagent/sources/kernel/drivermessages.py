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

from gpuagent.sources.kernel.drivercause import Cause
from gpuagent.sources.kernel.driverinit import INIT
from gpuagent.sources.kernel.drivermodule import MODULE
from gpuagent.sources.kernel.driverprobe import PROBE

__all__ = ["CATALOG", "SCOPES"]


# Where an entry's words belong: one GPU's cause ("gpu"), the module as a whole, naming no GPU
# and never a GPU's cause ("module": no_driver_module's reasons), or the failure itself, which
# another reader makes a problem of ("failure": RmInitAdapter's init_failed, the Xid catalog's
# lost GPU), never a cause.
SCOPES = ("gpu", "module", "failure")


# The catalog: what each record (after its "NVRM: ") matches, anchored at its start, and its
# cause; the first that matches a record is its cause.  Each pattern is bounded.  The areas
# keep the table's order: the module as a whole, the probe (and interrupts, DMA and opening
# the device), RmInitAdapter's causes and stages, and the failure itself.
CATALOG: tuple[tuple[re.Pattern[str], Cause], ...] = (*MODULE, *PROBE, *INIT)
