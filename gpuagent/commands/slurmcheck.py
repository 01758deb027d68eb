"""``gpuagent slurm-check``: Slurm's HealthCheckProgram, from the state file alone.

It reads the agent's state (never runs nvidia-smi, never waits on the agent), asks
``scontrol`` for the node and runs the one update :func:`gpuagent.commands.drain.decide` names.
Each ``scontrol`` is killed after ``timeout`` seconds, so that the check ends within slurmd's 60 s
even when slurmctld does not answer.  With no critical problem and no drain of its own in its
record (:mod:`gpuagent.commands.drainrecord`) it asks nothing: slurmd runs the check before it
registers, when ``scontrol`` may hang, and a healthy node's check must not delay that.  Nor
does it ask where slurmctld's own view of the node, which slurmd gives it in
``SLURM_NODE_IS_HEALTHY`` (Slurm 26.05.2 and later), agrees with the state
(:func:`gpuagent.commands.drain.agreed`).  Where the state only reports (config ``drain =
"report"``, :func:`gpuagent.commands.drain.reports_only`), a critical problem asks nothing
either: the check says ``would drain: <reason>`` and exits 0; a drain of gpuagent's own from
before is still resumed once no critical problem holds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuagent import state
from gpuagent.commands import drainrecord
from gpuagent.commands.drain import WOULD, agreed, critical, decide, parse_node, reports_only
from gpuagent.commands.status import ExitCode, checked, clean, judge
from gpuagent.schema import State

__all__ = [
    "EX_SCONTROL",
    "EX_UNKNOWN",
    "HEALTHY",
    "TIMEOUT",
    "Checked",
    "Scontrol",
    "ScontrolError",
    "check",
    "node_name",
    "run_scontrol",
    "state_reason",
]

# Exit statuses beside 0 (done, whatever it did): slurmd logs a non-zero one with the output.
EX_UNKNOWN = 1  # the state cannot be trusted: nothing changed
EX_SCONTROL = 2  # scontrol failed or timed out
# Seconds for each scontrol (two at most): well within slurmd's 60 s.
TIMEOUT = 20.0
# The variable slurmd sets to slurmctld's view of the node ("yes", "no"; see drain.agreed).
HEALTHY = "SLURM_NODE_IS_HEALTHY"


def node_name(env: Mapping[str, str]) -> str:
    """The node: slurmd's ``SLURMD_NODENAME``, else the short host name."""
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]


def state_reason(path: str) -> tuple[State | None, str]:
    """The state file at ``path`` if it is the agent's, else None and why not."""
    try:
        raw = state.read(path)
    except state.StateError as e:
        return None, str(e)
    typed = checked(raw)
    if isinstance(typed, str):
        return None, f"{path}: not a gpuagent state file: bad {typed!r}"
    return typed, ""


class ScontrolError(Exception):
    """scontrol failed, or did not answer in time."""


# Runs scontrol's argv within the timeout (s) and returns its output, or raises ScontrolError.
Scontrol = Callable[[Sequence[str], float], str]


def run_scontrol(argv: Sequence[str], timeout: float) -> str:
    """scontrol's output for ``argv``, killed (its whole session) after ``timeout`` s."""
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as e:
        raise ScontrolError(f"cannot run {argv[0]}: {e.strerror or e}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise ScontrolError(f"{' '.join(argv)}: no answer in {timeout:g} s") from None
    if proc.returncode != 0:
        said = " ".join((err or out).split()) or "no output"
        raise ScontrolError(f"{' '.join(argv)}: exit {proc.returncode}: {said}")
    return out


@dataclass(frozen=True)
class Checked:
    """The check's exit status, its line, and a ``warning`` line before it (``""``: none)."""

    code: int
    says: str
    warning: str = ""


def check(
    state_file: str,
    node: str,
    scontrol: str = "scontrol",
    timeout: float = TIMEOUT,
    *,
    record: str = drainrecord.PATH,
    run: Scontrol = run_scontrol,
    healthy: str | None = None,
) -> Checked:
    """Drain or resume ``node`` from the state in ``state_file``, asking slurmctld (through
    ``run``) only when a critical problem holds or the ``record`` of gpuagent's drains does not
    rule out one of ``node``, and slurmctld's view ``healthy`` (``SLURM_NODE_IS_HEALTHY``'s
    value; ``None``: unset) does not agree with the state; a state that only reports
    (``drain = "report"``) has a critical problem said, not drained."""
    st, why = state_reason(state_file)
    if st is not None:
        code, judged = judge(st, time.time())
        if code == ExitCode.UNKNOWN:
            st, why = None, judged  # no need to ask slurmctld
    if st is None:
        return Checked(EX_UNKNOWN, f"{node}: nothing changed: {clean(why)}")
    drained, damaged = drainrecord.read(record)
    warning = f"{damaged}; asking slurmctld" if damaged else ""
    bad = critical(st)
    if bad is not None and reports_only(st):
        return Checked(0, f"{node}: {WOULD} {bad.reason}")
    if bad is None and drained is not None and node not in drained:
        return Checked(0, f"{node}: no critical GPU problem")
    kept = dict(drained or {})
    said = agreed(healthy, bad, kept.get(node))
    if said is not None:
        # Healthy to slurmctld: no drain of gpuagent's holds any more (an admin resumed it).
        if bad is None:
            kept.pop(node, None)
        warning = f"{damaged}; taking slurmctld's view ({HEALTHY}={healthy})" if damaged else ""
        failed = _remember(record, drained, kept)
        warning = "; ".join(w for w in (warning, failed) if w)
        return Checked(0, f"{node}: {said}; slurmctld agrees ({HEALTHY}={healthy})", warning)
    try:
        shown = run([scontrol, "show", "node", node, "-o"], timeout)
        found = parse_node(shown)
        if found is None:
            said = f"{node}: scontrol show node: no such node in {shown.strip()!r}"
            return Checked(EX_SCONTROL, said, warning)
        decision = decide(found, st, why, time.time())
        kept.pop(node, None)
        if decision.held:
            kept[node] = decision.held
        # A drain is recorded before it is made, and forgotten only once the resume is done: a
        # record naming a drain not made costs a question, one missing a drain would keep it.
        failed = _remember(record, drained, kept) if decision.held else ""
        if decision.update:
            run([scontrol, *decision.update], timeout)
        if not decision.held:
            failed = _remember(record, drained, kept)
    except ScontrolError as e:
        return Checked(EX_SCONTROL, f"{node}: {e}", warning)
    warning = "; ".join(w for w in (warning, failed) if w)
    return Checked(0 if decision.known else EX_UNKNOWN, decision.says, warning)


def _remember(record: str, was: Mapping[str, str] | None, now: Mapping[str, str]) -> str:
    return drainrecord.write(record, now) if was != now else ""
