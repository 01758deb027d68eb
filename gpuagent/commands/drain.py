"""What a scheduler should do with this node, from the agent's state (pure).

Slurm (``gpuagent slurm-check``), NHC (``check_gpuagent``) and node-problem-detector
(``gpuagent status --format=npd``) ask the same question of the state file: is there a
critical problem on this host, and which is the worst?  The answer is here, with no I/O:

* :func:`worst` picks the worst problem, in the one order of :func:`gpuagent.health.rank`;
* :func:`decide` turns it and the node's Slurm state (:func:`parse_node`, from ``scontrol show
  node -o``) into the one ``scontrol update`` to run, if any: drain on a critical problem with
  reason ``gpuagent: <slot> <kind> <action>`` (then ``(Xid N)`` for an Xid, and ``; then
  gpuagent clear`` for a problem that only a clear ends, where it fits), resume only a
  node whose reason starts with ``gpuagent:``, leave every other drain alone, and touch
  nothing when the state cannot be trusted (missing, stale, the agent stopped);
* :func:`agreed` says where slurmctld's own view of the node (``SLURM_NODE_IS_HEALTHY``)
  already is what the state asks for, so that no ``scontrol`` need be run;
* :func:`npd` and :func:`npd_warning` are node-problem-detector's exit status and line: a
  critical problem sets its condition, a warning is an event.

Where the state's ``drain`` is ``report`` (:func:`reports_only`: the config's ``drain``, a
fleet's first week on a host), nothing asks for a drain and each says what would drain
instead: :func:`decide` is not reached (``slurm-check`` runs no ``scontrol`` for a critical
problem), :func:`reason` (NHC's, through ``slurm-check --reason``) gives no drain reason but
:func:`would`'s line, and node-problem-detector's condition stays unset, the critical
problem being the warning rule's event (``would drain: …``).  The verdict is the state's
either way: ``gpuagent status`` still says the host is critical.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuagent.commands.status import ExitCode, clean, graded, judge
from gpuagent.health import CRITICAL, DRAIN_REPORT, ranked
from gpuagent.schema import State

__all__ = [
    "NPD_WIDTH",
    "PREFIX",
    "REASON_WIDTH",
    "THEN_CLEAR",
    "WOULD",
    "Decision",
    "Node",
    "Worst",
    "agreed",
    "critical",
    "decide",
    "npd",
    "npd_warning",
    "parse_node",
    "reason",
    "reports_only",
    "worst",
    "would",
]

# Every drain reason gpuagent sets starts with it; only such a drain is gpuagent's to resume.
PREFIX = "gpuagent:"
# What a hook says instead of draining where the state's drain is "report".
WOULD = "would drain:"
# node-problem-detector keeps a plugin's output to max_output_length (80 by default).
NPD_WIDTH = 80
# The longest drain reason that says how its problem ends: one line of a terminal, as
# `sinfo -R -o "%80E %N"` shows it whole and node-problem-detector its own line (sinfo -R's
# default 20 columns cut every reason; scontrol show node prints it whole).  A reason longer
# with the ending than this is given without it.
REASON_WIDTH = 80
# What a drain reason adds when only `gpuagent clear` ends the problem: a repair alone (the
# reset the action says) ends neither the problem nor the drain.
THEN_CLEAR = "; then gpuagent clear"
# scontrol ends a reason with who set it and when: "Reason=text [root@2026-12-01T09:30:00]".
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?:\s+\[[^\]\s]*@[^\]\s]*\])?\s*$", re.S)
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_NAME = re.compile(r"(?:^|\s)NodeName=(\S+)")
# SLURM_NODE_IS_HEALTHY, which slurmd sets in HealthCheckProgram's environment from 26.05.2
# (src/slurmd/slurmd/slurmd.c; slurm.conf(5)): slurmctld's view of the node, "no" where it is
# down, drained or draining, failing or in a maintenance reservation
# (src/slurmctld/ping_nodes.c), else "yes"; unset before the node registers, and by older
# slurmd.  Any other value is no view.
_CONTROLLER_VIEWS = {"yes": True, "no": False}


@dataclass(frozen=True)
class Worst:
    """The worst problem on the host: its GPU's ``slot`` (``host`` for the host's own), for
    kind ``xid`` the Xid code where the state has it, and whether it ``latches`` (only
    ``gpuagent clear`` ends it, as the state says)."""

    severity: str
    slot: str
    kind: str
    action: str
    xid: int | None = None
    latches: bool = False

    @property
    def reason(self) -> str:
        """The drain reason: ``gpuagent: <slot> <kind> <action>``, then ``(Xid N)`` for an
        Xid, then, for a problem that latches, ``; then gpuagent clear`` where the whole fits
        :data:`REASON_WIDTH` (``gpuagent: 0000:3a:00.0 xid reboot (Xid 79); then gpuagent
        clear``)."""
        said = f"{PREFIX} {self.slot} {self.kind} {self.action}"
        said = said if self.xid is None else f"{said} (Xid {self.xid})"
        if self.latches and len(said) + len(THEN_CLEAR) <= REASON_WIDTH:
            return said + THEN_CLEAR
        return said


def worst(st: State) -> Worst | None:
    """The worst problem in ``st`` (a GPU's or the host's, :func:`gpuagent.health.ranked`),
    or None when there is none."""
    found = ranked(st)
    if not found:
        return None
    slot, p = found[0]
    code = p.get("xid")
    xid = code if p["kind"] == "xid" and type(code) is int else None
    return Worst(
        p["severity"],
        clean(slot or "host"),
        clean(p["kind"]),
        clean(p["action"]),
        xid,
        p.get("latches") is True,
    )


def critical(st: State) -> Worst | None:
    """The worst problem in ``st`` if it is critical (what drains the node), else None."""
    bad = worst(st)
    return bad if bad is not None and bad.severity == CRITICAL else None


def reports_only(st: State) -> bool:
    """Whether the agent that wrote ``st`` was told (config ``drain = "report"``) to have
    what would drain reported, not drained; an older agent's state, without the key, asks."""
    return st.get("drain") == DRAIN_REPORT


def agreed(healthy: str | None, bad: Worst | None, held: str | None) -> str | None:
    """What to say where slurmctld's view ``healthy`` (``SLURM_NODE_IS_HEALTHY``'s value,
    ``None``: unset) and the agent's verdict agree, so that ``scontrol`` need not be asked; or
    ``None``: they differ, or slurmctld gave no view.  ``bad`` is the critical problem
    (:func:`critical`; ``None``: none) and ``held`` the reason of gpuagent's recorded drain of
    the node (``None``: none recorded).

    They agree where the node is healthy to slurmctld and no critical problem holds (no
    drain, so nothing to resume), and where it is not healthy and gpuagent's own drain for
    this very problem is recorded.  An unhealthy node without that record may be down, in
    maintenance or drained by another: only ``scontrol show node`` tells which."""
    view = _CONTROLLER_VIEWS.get(healthy or "")
    if view is True and bad is None:
        return "no critical GPU problem"
    if view is False and bad is not None and held == bad.reason:
        return f"drained: {bad.reason}"
    return None


@dataclass(frozen=True)
class Node:
    """A Slurm node as ``scontrol show node -o`` shows it: ``flags`` from ``State=``
    (``IDLE``, ``DRAIN``, ``DOWN`` …) and its ``reason`` (``""``: none)."""

    name: str
    flags: frozenset[str]
    reason: str

    @property
    def drained(self) -> bool:
        """Drained or draining (``IDLE+DRAIN``, ``MIXED+DRAIN``, ``DRAINED``, ``DRAINING``)."""
        return any(f.startswith("DRAIN") for f in self.flags)

    @property
    def ours(self) -> bool:
        """gpuagent set its reason."""
        return self.reason.startswith(PREFIX)


def parse_node(text: str) -> Node | None:
    """The node in ``scontrol show node NAME -o``'s line, or None if the text has none."""
    lines = [line for line in text.splitlines() if "NodeName=" in line]
    if len(lines) != 1:
        return None
    line = lines[0]
    name, state = _NAME.search(line), _STATE.search(line)
    if name is None or state is None:
        return None
    reason = _REASON.search(line)
    flags = frozenset(f for f in re.split(r"[+*~#!%$@^-]", state.group(1).upper()) if f)
    return Node(name.group(1), flags, reason.group(1).strip() if reason else "")


@dataclass(frozen=True)
class Decision:
    """The ``scontrol`` arguments to run (``()``: nothing to do), what to say about it,
    whether the state was ``known`` (False: missing or stale, nothing was decided), and the
    reason of gpuagent's drain the node is ``held`` in once the update is done (``""``: none,
    no drain or another's)."""

    update: tuple[str, ...]
    says: str
    known: bool = True
    held: str = ""


def decide(node: Node, st: State | None, why: str, now: float) -> Decision:
    """What to do with ``node`` given the agent's state ``st`` read at wall time ``now``.

    ``st`` None (no state file, or one that is not the agent's) and a state judged unknown (the
    agent stopped, died or hung) change nothing, whatever gpuagent drained before: ``why`` (or
    the judge's reason) says so.  A critical problem drains the node, or updates gpuagent's
    own reason; a node drained by anyone else is left alone; a node gpuagent drained is resumed
    once no critical problem holds.
    """
    if st is not None:
        code, why = judge(st, now)
        if code == ExitCode.UNKNOWN:
            st = None
    if st is None:
        return Decision((), f"{node.name}: nothing changed: {clean(why)}", known=False)
    bad = critical(st)
    node_arg = f"NodeName={node.name}"
    if bad is not None:
        if node.drained and not node.ours:
            held = node.reason or "no reason"
            return Decision((), f"{node.name}: {bad.reason}; left as drained by another: {held}")
        if node.drained and node.reason == bad.reason:
            return Decision((), f"{node.name}: drained: {bad.reason}", held=bad.reason)
        return Decision(
            ("update", node_arg, "State=DRAIN", f"Reason={bad.reason}"),
            f"{node.name}: draining: {bad.reason}",
            held=bad.reason,
        )
    if node.drained and node.ours:
        return Decision(
            ("update", node_arg, "State=RESUME"),
            f"{node.name}: resuming: no critical GPU problem (was {node.reason})",
        )
    if node.drained:
        return Decision((), f"{node.name}: no critical GPU problem; drained by another, left so")
    return Decision((), f"{node.name}: no critical GPU problem")


def reason(st: State | None, why: str, now: float) -> tuple[bool, str]:
    """Whether the state ``st`` is known, and then the drain reason of its worst critical
    problem (``""``: none, or none asked for: :func:`would`), else why it is not (``why``
    when ``st`` is None)."""
    if st is not None:
        code, why = judge(st, now)
        if code != ExitCode.UNKNOWN:
            bad = critical(st)
            return True, bad.reason if bad is not None and not reports_only(st) else ""
    return False, clean(why)


def would(st: State | None, now: float) -> str:
    """What would drain where ``st`` only reports (:func:`reports_only`) and is known at wall
    time ``now``: ``would drain: <drain reason>``; ``""`` where nothing would, or it asks."""
    if st is None or not reports_only(st) or judge(st, now)[0] == ExitCode.UNKNOWN:
        return ""
    bad = critical(st)
    return f"{WOULD} {bad.reason}" if bad is not None else ""


def npd(st: State | None, why: str, now: float) -> tuple[int, str]:
    """node-problem-detector's exit status and line for ``st`` (None: ``why`` it is missing),
    for a ``permanent`` rule that sets the node's condition: 0 no critical problem, 1 a
    critical one (the worst one's slot, kind and action), 2 unknown.  A warning does not set
    the condition (:func:`npd_warning` makes it an event): the line says it beside ``ok``;
    nor does a critical problem where the state only reports (:func:`reports_only`): ``ok;
    would drain: …``, the warning rule's event."""
    if st is None:
        return 2, _fit(f"unknown: {why}")
    code, why = judge(st, now)
    if code == ExitCode.UNKNOWN:
        return 2, _fit(f"unknown: {why}")
    if code == ExitCode.CRITICAL:
        bad = critical(st)
        said = f"{bad.slot} {bad.kind}: {bad.action}" if bad is not None else why
        if reports_only(st):
            return 0, _fit(f"ok; {WOULD} {said}")
        return 1, _fit(f"critical: {said}")
    if code == ExitCode.WARNING:
        return 0, _fit(f"ok; warning: {_warnings(st)[0]}")
    return 0, _fit(f"ok: {why}")


def npd_warning(st: State | None, why: str, now: float) -> tuple[int, str]:
    """node-problem-detector's exit status and line for a ``temporary`` rule, which NPD makes
    an event (never a condition): 1 while a warning holds (the worst one, whatever critical
    problem holds beside it: that one is the condition's), 0 none, 2 unknown.  Where the
    state only reports (:func:`reports_only`), a critical problem is this event, before any
    warning: ``would drain: <slot> <kind>: <action>``."""
    if st is None:
        return 2, _fit(f"unknown: {why}")
    code, why = judge(st, now)
    if code == ExitCode.UNKNOWN:
        return 2, _fit(f"unknown: {why}")
    bad = critical(st) if reports_only(st) else None
    if bad is not None:
        return 1, _fit(f"{WOULD} {bad.slot} {bad.kind}: {bad.action}")
    warnings = _warnings(st)
    if warnings:
        return 1, _fit(f"warning: {warnings[0]}")
    return 0, _fit("ok: no warning")


def _warnings(st: State) -> list[str]:
    """Each warning of ``st``, worst first (``slot kind: action``, or the agent's trouble)."""
    return [said for level, said in graded(st) if level == ExitCode.WARNING]


def _fit(line: str) -> str:
    line = " ".join(clean(line).split())
    return line if len(line) <= NPD_WIDTH else line[: NPD_WIDTH - 3] + "..."
