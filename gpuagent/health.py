"""The one order of severity and action (pure): a problem's :class:`Severity`, a GPU's
:class:`Health`, the :data:`ACTIONS` mildest first, and :func:`rank`, the order of problems
that every surface tells them in.

The problems themselves are :class:`gpuagent.views.Finding` (what a source sees) and
:class:`gpuagent.views.Problem` (one that holds since a time); the verdict
(:mod:`gpuagent.verdict`) settles them.  No dataclass here: ``gpuagent status`` imports this
module, and the dataclasses module (with inspect) is a sixth of its start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuagent.compat import StrEnum

if TYPE_CHECKING:
    # Annotations only: the schema's classes cost `gpuagent status` 3 ms to make.
    from gpuagent.schema import ProblemEntry, State

__all__ = [
    "ACTIONS",
    "CRITICAL",
    "DRAIN_ASK",
    "DRAIN_MODES",
    "DRAIN_REPORT",
    "HEALTH",
    "OK",
    "SEVERITIES",
    "UNKNOWN",
    "WARNING",
    "Health",
    "Rank",
    "Severity",
    "named",
    "rank",
    "ranked",
    "state_rank",
]


# What the scheduler's hooks do with a critical problem (the config's and the state's
# ``drain``): ask Slurm, NHC and node-problem-detector to drain the node, or only report what
# would drain (a fleet's first week on a host: the verdict is the same, nothing is drained).
DRAIN_ASK = "ask"
DRAIN_REPORT = "report"
DRAIN_MODES = (DRAIN_ASK, DRAIN_REPORT)


class Severity(StrEnum):
    """How bad a problem is: a warning opens a ticket, a critical problem pages."""

    WARNING = "warning"
    CRITICAL = "critical"


class Health(StrEnum):
    """A GPU's health: its worst problem's severity, ``ok``, or ``unknown`` while nothing
    fresh is known about it."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    UNKNOWN = "unknown"


WARNING, CRITICAL = Severity.WARNING, Severity.CRITICAL
OK, UNKNOWN = Health.OK, Health.UNKNOWN
SEVERITIES = tuple(Severity)
HEALTH = tuple(Health)
# What an operator should do about a problem, mildest first: of several problems, the one
# whose action takes most is the worst (an RMA covers a reboot, a reboot a reset …).
ACTIONS = (
    "none",
    "restart_app",
    # A service the GPUs depend on (nvidia-fabricmanager, nvidia-persistenced) is down:
    # restart it (systemctl restart UNIT), and see its journal for why it stopped.
    "restart_service",
    "drain_p2p",
    "check_host",
    "reset_gpu",
    "drain_and_reset",
    "reboot",
    "drain_and_rma",
)
_TAKES = {a: i for i, a in enumerate(ACTIONS)}
# The order of problems, worst first, as :func:`rank` gives it.
Rank = tuple[bool, bool, int, bool, str, str]


def named(kind: str, xid: object) -> str:
    """A problem in a few words, as every surface names it: its ``kind``, or ``Xid 79`` for
    one with an Xid code ``xid`` (an int; anything else is no code)."""
    return f"Xid {xid}" if type(xid) is int else kind


def rank(severity: str, action: str, slot: str, kind: str, *, caused: bool = False) -> Rank:
    """The one order of problems, for every surface (the state's lists, the problem the
    status line names for each slot, ``status``, the metrics, Slurm, NHC,
    node-problem-detector): a sort key, the worst smallest.

    Critical before warning; then a problem with a ``cause`` (a GPU's fabric while the
    fabric manager is down) after the others, for its cause is what to act on; then the
    action that takes most (:data:`ACTIONS` from its end; one this version does not know,
    from a newer agent's state, before all: it may take more); then the slot, the host's
    (``""``) before the GPUs', those by PCI slot; then the kind."""
    return (
        severity != CRITICAL,
        caused,
        -_TAKES.get(action, len(ACTIONS)),
        slot != "",
        slot,
        kind,
    )


def state_rank(slot: str, p: ProblemEntry) -> Rank:
    """:func:`rank` of a problem as the state holds it, on ``slot`` (``""``: the host)."""
    return rank(p["severity"], p["action"], slot, p["kind"], caused=bool(p.get("cause")))


def ranked(st: State) -> list[tuple[str, ProblemEntry]]:
    """Every problem of the state ``st``, the host's (slot ``""``) and each GPU's, as
    ``(slot, problem)``, worst first (:func:`rank`): the first is the worst of all."""
    found = [("", p) for p in st["host_problems"]]
    found += [(g["pci_slot"], p) for g in st["gpus"] for p in g["problems"]]
    return sorted(found, key=lambda item: state_rank(*item))
