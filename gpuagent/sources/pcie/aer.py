"""PCIe Advanced Error Reporting (pure): the kernel's AER counters in sysfs and the problem
that errors on a GPU's path make.

The counters (``aer_dev_nonfatal``, ``aer_dev_fatal``: Linux 4.19 on, readable by any user)
are one ``NAME COUNT`` line per error type and a ``TOTAL_ERR_*`` line, counted since the
device was enumerated, each by the device that saw the error (a link's errors may be counted
at its partner, the port above).  The kernel's records of the same errors are
:mod:`gpuagent.sources.kernel.aerrecord`'s.

A GPU's path is every PCI function from its root port down to the GPU
(:func:`gpuagent.sources.bus.pciaddr.path`); errors of any of them are the GPU's problem
``pcie_error``, one per erring device: critical for a fatal error, a warning for a non-fatal
one, action ``check_host`` (the slot, riser, cable or switch, or the board's seating: not an
RMA on this evidence alone).  Correctable errors make no problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.kernel.aerrecord import WORDS
from gpuagent.untrusted import whole
from gpuagent.views import Finding

__all__ = ["FILES", "KIND", "Errors", "counters", "finding"]

# The problem's kind; one per erring device, ``extra`` ``(("pcie_device", SLOT),)``.
KIND = "pcie_error"
# The counter files read each tick, by the kind of error they count.
FILES = (("fatal", "aer_dev_fatal"), ("nonfatal", "aer_dev_nonfatal"))
_TOTAL = "TOTAL_ERR_"


def counters(text: str) -> dict[str, int]:
    """One counter file's counts by error type (``{"SDES": 1, "CmpltTO": 0, …}``), its
    ``TOTAL_ERR_*`` line left out; raises ValueError naming the first line that is not
    ``NAME COUNT``."""
    out: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        name, _, count = line.strip().rpartition(" ")
        got = whole(count)
        if not name or got is None:
            raise ValueError(f"line {n} is not 'NAME COUNT': {line.strip()[:60]!r}")
        if not name.startswith(_TOTAL):
            out[name] = got
    return out


@dataclass(frozen=True)
class Errors:
    """One device's errors of one kind this boot: ``rise`` of its counters since the agent
    first read them (by error type), ``records`` the kernel's that name it, the ``last``
    one's time (wall s; None: none)."""

    rise: Mapping[str, int]
    records: int = 0
    last: float | None = None

    @property
    def count(self) -> int:
        """How many errors: the counters' rise, or the records where they say more (a
        device without counters, or errors before the agent's first read)."""
        return max(sum(self.rise.values()), self.records)


def _words(kind: str, errors: Errors) -> str:
    types = ", ".join(f"{n} {name}" for name, n in sorted(errors.rise.items()) if n)
    return f"{errors.count} {WORDS[kind]}" + (f" ({types})" if types else "")


def finding(
    device: str,
    where: str,
    errors: Mapping[str, Errors],
    recovered: tuple[str, bool] | None = None,
) -> Finding | None:
    """The problem ``pcie_error`` of the GPU whose path has ``device`` (``where``: its
    :func:`~gpuagent.sources.bus.pciaddr.path_role`), from its errors by kind (``fatal``,
    ``nonfatal``); None without any.  ``recovered`` is the kernel's word on its recovery
    after the last of them, by the port on the path that ran it (True: ``device recovery
    successful``): where it says so, that decides, not the error's class: a recovery that
    failed is not undone without a reboot (critical, ``reboot``), one that succeeded left a
    link that works (a warning, ``check_host``)."""
    kinds = [k for k in ("fatal", "nonfatal") if k in errors and errors[k].count]
    if not kinds:
        return None
    said = ", ".join(_words(k, errors[k]) for k in kinds)
    severity, action = (CRITICAL if kinds[0] == "fatal" else WARNING), "check_host"
    then = "check the slot, riser, cable or switch on this path and the board's seating"
    if recovered is not None:
        port, ok = recovered
        if ok:
            severity, then = WARNING, f"the kernel recovered the link (at {port}); {then}"
        else:
            severity, action = CRITICAL, "reboot"
            then = (
                f"the kernel's recovery failed (at {port}): the GPU is unreachable until "
                f"a reboot; then {then}"
            )
    return Finding(
        KIND,
        severity,
        action,
        f"PCIe uncorrectable errors at {device}, {where}: {said}; {then}",
        (("pcie_device", device),),
    )
