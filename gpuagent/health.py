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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Annotations only: the schema's classes cost `gpuagent status` 3 ms to make.
    from gpuagent.schema import ProblemEntry, State

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
    "Rank",
    "Severity",
    "Tracker",
    "rank",
    "ranked",
    "state_rank",
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


@dataclass(frozen=True)
class Finding:
    """One problem seen on one GPU (or the host): ``kind`` (``lost``, ``xid`` …), ``severity``
    (:data:`SEVERITIES`), ``action`` (:data:`ACTIONS`), a one-line ``message``, and ``extra``
    fields carried into the state beside them (``(("xid", 79),)``); ``ends`` when it ends by
    itself (``when nvidia-smi answers again``; ``""``: it holds until a clear or the boot).

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
    # When it ends by itself, said by the rule that makes it ("when nvidia-smi answers
    # again"); "" for one that holds until a clear or the next boot
    # (:func:`gpuagent.sources.kernel.clears.ending` says the whole of it).
    ends: str = field(default="", compare=False)
    # Its start and end are told by a line of the source's own (the probe's "nvidia-smi
    # failing", the gate's "module not loaded"), with that line's MESSAGE_ID since before it
    # was a problem: the verdict logs only a change of its severity or action.
    told: bool = field(default=False, compare=False)

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
    def caused(self) -> bool:
        """Folded under a host's problem, its ``cause`` (a GPU's fabric while the fabric
        manager is down): that problem is the one to act on."""
        return any(k == "cause" for k, _ in self.extra)

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

    @property
    def rank(self) -> Rank:
        """Where it sorts among problems, worst first (:func:`rank`)."""
        f = self.finding
        return rank(f.severity, f.action, self.slot, f.kind, caused=f.caused)


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
        """The problems holding on ``slot``, worst first (:func:`rank`): the first one's
        action is the one that applies."""
        mine = [p for (s, _), p in self._open.items() if s == slot]
        return sorted(mine, key=lambda p: p.rank)

    def slots(self) -> set[str]:
        """Every slot with a problem (``""`` for the host)."""
        return {s for s, _ in self._open}

    def reporter(self, p: Problem) -> str | None:
        """The source whose findings hold ``p`` (the first to report it, as :meth:`settle`
        takes it), or None."""
        for source, findings in self._sources.items():
            if any(f.key == p.finding.key for f in findings.get(p.slot, ())):
                return source
        return None


def _slot_order(p: Problem) -> tuple[str, str]:
    return p.slot, p.finding.kind
