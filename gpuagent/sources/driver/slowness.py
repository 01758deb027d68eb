"""What explains a slow nvidia-smi, where something on the host does: the agent's own trouble,
never the driver's (issue 39).

* nvidia-persistenced down, or persistence mode off: each nvidia-smi run initialises every GPU
  again (30 s instead of 2 s per call on 8-GPU A100 VMs, Azure/aks-gpu#105);
* the agent starved of CPU: the kernel's pressure stall information (PSI,
  Documentation/accounting/psi.rst) for the agent's own control group (its unit's
  ``CPUQuota=`` counts there), else for the host: ``some avg60=`` is the share of the last
  minute in which some task waited for a CPU.

:func:`explain` is pure; :func:`cpu_pressure` reads the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from gpuagent.views import Finding, Row

__all__ = ["STARVED", "cpu_pressure", "explain", "pressure"]

# The share (%) of the last minute in which the agent waited for a CPU that explains a probe
# running out of its time: past it nvidia-smi's own work waits too.
STARVED = 40.0
_SOME = re.compile(r"^some avg10=\d{1,3}\.\d{1,2} avg60=(?P<avg60>\d{1,3}\.\d{1,2}) ", re.M)
_CGROUP = re.compile(r"^0::(?P<path>/[^\n]{0,4000})$", re.M)


def pressure(text: str) -> float | None:
    """``some avg60`` (%) of a PSI file's ``text`` (``some avg10=1.00 avg60=72.40 avg300=…``),
    or None where it has none."""
    m = _SOME.search(text)
    return float(m["avg60"]) if m else None


def cpu_pressure(sysfs_root: str = "/sys", proc_root: str = "/proc") -> float | None:
    """The agent's CPU pressure (``some avg60``, %): its control group's ``cpu.pressure``
    (cgroup v2), else the host's ``pressure/cpu``; None where the kernel offers neither."""
    files = []
    cgroup = _read(os.path.join(proc_root, "self", "cgroup"))
    m = _CGROUP.search(cgroup or "")
    if m and ".." not in m["path"]:
        files.append(os.path.join(sysfs_root, "fs", "cgroup", m["path"][1:], "cpu.pressure"))
    files.append(os.path.join(proc_root, "pressure", "cpu"))
    for path in files:
        found = pressure(_read(path) or "")
        if found is not None:
            return found
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("ascii", errors="replace")
    except OSError:
        return None


def explain(
    host: Iterable[Finding], rows: Mapping[str, Row], starved: float | None
) -> tuple[str, str] | None:
    """What explains nvidia-smi timing out, with its fix, and the action it takes, from the
    host's service findings (``persistenced_down``), the GPUs' last rows
    (``persistence_mode``) and the agent's CPU pressure (%, :func:`cpu_pressure`); None where
    nothing does."""
    said, action = [], "check_host"
    if any(f.kind == "persistenced_down" for f in host):
        action = "restart_service"
        said.append(
            "nvidia-persistenced is not running, so each nvidia-smi run initialises every GPU "
            "again: start it (systemctl start nvidia-persistenced)"
        )
    elif any(row.get("persistence_mode") == "Disabled" for row in rows.values()):
        said.append(
            "persistence mode is off, so each nvidia-smi run initialises every GPU again: "
            "start nvidia-persistenced, or run nvidia-smi -pm 1 as root"
        )
    if starved is not None and starved >= STARVED:
        said.append(
            f"the agent waited for a CPU {starved:g} % of the last minute (CPU pressure): "
            "see what loads the host, or the unit's CPUQuota="
        )
    return ("; ".join(said), action) if said else None
