"""Per-GPU health: problems, their severity and the action an operator should take (pure).

Every source of facts about a GPU (nvidia-smi's values and per-GPU errors, the PCI bus, the
kernel driver's Xid events) reports :class:`Finding` objects keyed by the GPU's PCI slot; a
GPU's health is the worst severity among its findings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ACTIONS",
    "CRITICAL",
    "HEALTH",
    "OK",
    "SEVERITIES",
    "UNKNOWN",
    "WARNING",
    "Finding",
    "worst",
]

OK, WARNING, CRITICAL, UNKNOWN = "ok", "warning", "critical", "unknown"
SEVERITIES = (WARNING, CRITICAL)
HEALTH = (OK, WARNING, CRITICAL, UNKNOWN)
# What an operator should do about a problem, mildest first.
ACTIONS = (
    "none",
    "restart_app",
    "reset_gpu",
    "reboot",
    "drain_p2p",
    "drain_and_reset",
    "drain_and_rma",
    "check_host",
)


@dataclass(frozen=True)
class Finding:
    """One problem seen on one GPU (or the host): ``kind`` (``lost``, ``xid`` …), ``severity``
    (:data:`SEVERITIES`), ``action`` (:data:`ACTIONS`), a one-line ``message``, and ``extra``
    fields carried into the state beside them (``(("xid", 79),)``).

    ``kind`` and ``extra`` together identify a problem across ticks: Xid 79 and Xid 48 on one
    GPU are two problems, each with its own start and end.
    """

    kind: str
    severity: str
    action: str
    message: str
    extra: tuple[tuple[str, int | str], ...] = ()

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} is not one of {ACTIONS}")

    @property
    def key(self) -> tuple[str, tuple[tuple[str, int | str], ...]]:
        """What identifies this problem from one tick to the next."""
        return self.kind, self.extra


def worst(findings: Iterable[Finding]) -> str:
    """The health of a GPU with ``findings``: ``critical``, ``warning`` or ``ok`` (none)."""
    severities = {f.severity for f in findings}
    if CRITICAL in severities:
        return CRITICAL
    return WARNING if WARNING in severities else OK
