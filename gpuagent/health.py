"""Per-GPU health: problems, their severity and the action an operator should take (pure).

Every source of facts about a GPU (nvidia-smi's values and per-GPU errors, the PCI bus, the
kernel driver's Xid events) reports :class:`Finding` objects keyed by the GPU's PCI slot; a
GPU's health is the worst severity among its findings.  A :class:`Tracker` keeps each
source's latest findings, gives every problem the time it started (``since``) and says which
problems started and which ended, so that each is logged once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "ACTIONS",
    "CRITICAL",
    "HEALTH",
    "OK",
    "SEVERITIES",
    "UNKNOWN",
    "WARNING",
    "Finding",
    "Health",
    "Problem",
    "Severity",
    "Tracker",
    "worst",
]


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
    # A service the GPUs depend on (nvidia-fabricmanager, nvidia-persistenced) is down:
    # restart it (systemctl restart UNIT), and see its journal for why it stopped.
    "restart_service",
)

# Which action applies when a GPU has several problems: the one that takes most (an RMA
# covers a reboot, a reboot a reset …).
_WEIGHT = {
    a: i
    for i, a in enumerate(
        (
            "none",
            "restart_app",
            "restart_service",
            "drain_p2p",
            "check_host",
            "reset_gpu",
            "drain_and_reset",
            "reboot",
            "drain_and_rma",
        )
    )
}


@dataclass(frozen=True)
class Finding:
    """One problem seen on one GPU (or the host): ``kind`` (``lost``, ``xid`` …), ``severity``
    (:data:`SEVERITIES`), ``action`` (:data:`ACTIONS`), a one-line ``message``, and ``extra``
    fields carried into the state beside them (``(("xid", 79),)``).

    ``kind`` and ``extra`` together identify a problem across ticks: Xid 79 and Xid 48 on one
    GPU are two problems, each with its own start and end.  ``at`` is when the fault happened,
    where the source knows (an Xid's first kernel record): the problem's ``since``.
    """

    kind: str
    severity: str
    action: str
    message: str
    extra: tuple[tuple[str, int | str], ...] = ()
    # When the fault itself happened (wall s), where the source knows (an Xid: its first
    # kernel record); not part of what the finding says.
    at: float | None = field(default=None, compare=False)
    # The systemd unit of the process that caused it (an application Xid's), where known: in
    # the message already, and a field of its own for the journal and the state.
    unit: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} is not one of {ACTIONS}")

    @property
    def name(self) -> str:
        """The problem in a few words: its kind, or ``Xid 79`` for an Xid."""
        code = dict(self.extra).get("xid")
        return self.kind if code is None else f"Xid {code}"

    @property
    def key(self) -> tuple[str, tuple[tuple[str, int | str], ...]]:
        """What identifies this problem from one tick to the next."""
        return self.kind, self.extra


def worst(findings: Iterable[Finding]) -> Health:
    """The health of a GPU with ``findings``: ``critical``, ``warning`` or ``ok`` (none)."""
    severities = {f.severity for f in findings}
    if CRITICAL in severities:
        return Health.CRITICAL
    return Health.WARNING if WARNING in severities else Health.OK


@dataclass(frozen=True)
class Problem:
    """A :class:`Finding` that holds on the GPU in ``slot`` (``""``: the host) since ``since``
    (Unix time, s)."""

    slot: str
    finding: Finding
    since: float


class Tracker:
    """Problems from several sources (``smi``, ``pci``, ``xid`` …), each problem's start and end.

    Each source calls :meth:`report` with all it currently finds, ``{slot: [Finding, ...]}``;
    a source's findings hold until it reports again.  :meth:`settle` then merges them: a
    problem (slot and :attr:`Finding.key`) seen by any source holds; its ``since`` is the time
    of the first :meth:`settle` that saw it.  :attr:`restated` lists the problems whose
    severity or action the last :meth:`settle` changed (a Nonfatal NVLink Xid turned Fatal).
    """

    def __init__(self) -> None:
        self._sources: dict[str, dict[str, list[Finding]]] = {}
        self._open: dict[tuple[str, tuple[str, tuple[tuple[str, int | str], ...]]], Problem] = {}
        self.restated: list[Problem] = []

    def report(self, source: str, findings: Mapping[str, Iterable[Finding]]) -> None:
        """Replace everything ``source`` found with ``findings`` (by slot)."""
        self._sources[source] = {slot: list(fs) for slot, fs in findings.items()}

    def settle(self, now: float, exempt: Iterable[str] = ()) -> tuple[list[Problem], list[Problem]]:
        """Merge the sources at wall time ``now`` (s); returns the problems that started and
        those that ended, in slot order.  Slots in ``exempt`` (a GPU bound to another driver
        on purpose) have no problems."""
        skip = set(exempt)
        current: dict[tuple[str, tuple[str, tuple[tuple[str, int | str], ...]]], Finding] = {}
        for findings in self._sources.values():
            for slot, fs in findings.items():
                if slot in skip:
                    continue
                for f in fs:
                    current.setdefault((slot, f.key), f)
        started: list[Problem] = []
        self.restated = []
        ended = [p for key, p in self._open.items() if key not in current]
        for key in [k for k in self._open if k not in current]:
            del self._open[key]
        for key, f in current.items():
            old = self._open.get(key)
            if old is None:
                since = now if f.at is None else min(now, f.at)
                self._open[key] = Problem(key[0], f, since)
                started.append(self._open[key])
            elif old.finding != f:
                # Same problem, new wording (another throttle reason): no new start.
                self._open[key] = Problem(key[0], f, old.since)
                was = old.finding
                if (was.severity, was.action) != (f.severity, f.action):
                    self.restated.append(self._open[key])
        self.restated.sort(key=_slot_order)
        return sorted(started, key=_slot_order), sorted(ended, key=_slot_order)

    def problems(self, slot: str) -> list[Problem]:
        """The problems holding on ``slot``, worst first (critical first, then the action
        that takes most), then by kind: the first one's action is the one that applies."""
        mine = [p for (s, _), p in self._open.items() if s == slot]
        return sorted(mine, key=_worst_first)

    def slots(self) -> set[str]:
        """Every slot with a problem (``""`` for the host)."""
        return {s for s, _ in self._open}


def _worst_first(p: Problem) -> tuple[bool, int, str]:
    f = p.finding
    return f.severity != CRITICAL, -_WEIGHT[f.action], f.kind


def _slot_order(p: Problem) -> tuple[str, str]:
    return p.slot, p.finding.kind
