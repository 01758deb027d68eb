"""The one-line sd_notify STATUS, also the state's ``status`` (pure).

The line says what the GPUs are doing and, after a semicolon, the agent's own trouble (the
state's ``problems``) by kind: ``8 GPUs, sampling; agent problem: journal``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuagent.health import Problem
from gpuagent.schema import ProbeState
from gpuagent.views import BusView, Gate, ProbeView, plural

__all__ = ["Problems", "status_line", "with_trouble"]

Problems = Mapping[str, Sequence[Problem]]


def status_line(
    bus: BusView, probe: ProbeView, missing: tuple[str, ...], problems: Problems, interval: float
) -> str:
    """The one-line sd_notify STATUS (also the state's ``status``); ``problems`` by slot
    (``""``: the host), ``interval`` the tick's (s)."""
    n = len(bus.gpus)
    if n == 0:
        return "no NVIDIA GPU on the PCI bus"
    gpus = plural(n, "GPU")
    if probe.gate is Gate.NO_GPU:
        drivers = sorted({g.driver or "none" for g in bus.gpus})
        return _attention(f"{gpus}, all bound to {', '.join(drivers)}; not sampled", problems)
    if probe.gate is Gate.NVIDIA_SMI_MISSING:
        return f"{gpus}, nvidia-smi not found"
    if probe.gate is Gate.DRIVER_NOT_LOADED:
        return _attention(f"{gpus}, NVIDIA driver not loaded; not probing", problems)
    if probe.state is ProbeState.STUCK:
        return f"{gpus}, nvidia-smi stuck in the driver; not probing"
    if probe.state is ProbeState.FAILING:
        wait = probe.next_in_ticks * interval
        return f"{gpus}, nvidia-smi failing ({probe.failure}), next try in {wait:g} s"
    if probe.state is ProbeState.OK:
        return _attention(gpus, problems) if problems else f"{gpus}, sampling"
    return f"{gpus}, starting"


def _attention(line: str, problems: Problems) -> str:
    """``line`` naming the first three slots (``""``: the host) that need attention."""
    if not problems:
        return line
    ordered = sorted(problems)
    named = [f"{s or 'host'} {problems[s][0].finding.name}" for s in ordered[:3]]
    more = ", ..." if len(ordered) > 3 else ""
    verb = "needs" if len(ordered) == 1 else "need"
    return f"{line}, {len(ordered)} {verb} attention: {', '.join(named)}{more}"


def with_trouble(line: str, kinds: Iterable[str]) -> str:
    """``line`` with the agent's own trouble named by kind (``journal``, ``textfile`` …)."""
    named = sorted(kinds)
    if not named:
        return line
    word = "problem" if len(named) == 1 else "problems"
    return f"{line}; agent {word}: {', '.join(named)}"
