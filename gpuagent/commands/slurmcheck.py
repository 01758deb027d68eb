"""``gpuagent slurm-check``: Slurm's HealthCheckProgram, from the state file alone.

It reads the agent's state (never runs nvidia-smi, never waits on the agent), asks
``scontrol`` for the node and runs the one update :func:`gpuagent.commands.drain.decide` names.
Each ``scontrol`` is killed after ``timeout`` seconds, so that the check ends within slurmd's 60 s
even when slurmctld does not answer.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence

from gpuagent import state
from gpuagent.commands.drain import decide, parse_node
from gpuagent.commands.status import ExitCode, checked, clean, judge
from gpuagent.schema import State

__all__ = ["EX_SCONTROL", "EX_UNKNOWN", "TIMEOUT", "check", "node_name", "state_reason"]

# Exit statuses beside 0 (done, whatever it did): slurmd logs a non-zero one with the output.
EX_UNKNOWN = 1  # the state cannot be trusted: nothing changed
EX_SCONTROL = 2  # scontrol failed or timed out
# Seconds for each scontrol (two at most): well within slurmd's 60 s.
TIMEOUT = 20.0


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


def _scontrol(argv: Sequence[str], timeout: float) -> str:
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


def check(
    state_file: str, node: str, scontrol: str = "scontrol", timeout: float = TIMEOUT
) -> tuple[int, str]:
    """Drain or resume ``node`` from the state in ``state_file``; the exit status and a line."""
    st, why = state_reason(state_file)
    if st is not None:
        code, judged = judge(st, time.time())
        if code == ExitCode.UNKNOWN:
            st, why = None, judged  # no need to ask slurmctld
    if st is None:
        return EX_UNKNOWN, f"{node}: nothing changed: {clean(why)}"
    try:
        shown = _scontrol([scontrol, "show", "node", node, "-o"], timeout)
        found = parse_node(shown)
        if found is None:
            return EX_SCONTROL, f"{node}: scontrol show node: no such node in {shown.strip()!r}"
        decision = decide(found, st, why, time.time())
        if decision.update:
            _scontrol([scontrol, *decision.update], timeout)
    except ScontrolError as e:
        return EX_SCONTROL, f"{node}: {e}"
    return (0 if decision.known else EX_UNKNOWN), decision.says
