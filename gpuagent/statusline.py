"""The one-line status (sd_notify STATUS, the state's ``status``) of a tick (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .health import Problem
from .views import BusView, Gate, ProbeState, ProbeView, plural

__all__ = ["Problems", "status_line"]

# The verdict's problems by slot (``""``: the host).
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
        return f"{gpus}, all bound to {', '.join(drivers)}; not sampled"
    if probe.gate is Gate.NVIDIA_SMI_MISSING:
        return f"{gpus}, nvidia-smi not found"
    if probe.gate is Gate.DRIVER_NOT_LOADED:
        return f"{gpus}, NVIDIA driver not loaded; not probing"
    if probe.state is ProbeState.STUCK:
        return f"{gpus}, nvidia-smi stuck in the driver; not probing"
    if probe.state is ProbeState.FAILING:
        wait = probe.next_in_ticks * interval
        return f"{gpus}, nvidia-smi failing ({probe.failure}), next try in {wait:g} s"
    if probe.state is ProbeState.OK:
        return _ok_line(gpus, missing, problems)
    return f"{gpus}, starting"


def _ok_line(gpus: str, missing: tuple[str, ...], problems: Problems) -> str:
    ordered = sorted(problems)
    silent = [s for s in missing if s not in problems]
    note = f", {len(silent)} missing from nvidia-smi" if silent else ""
    if not ordered:
        return f"{gpus}, sampling{note}"
    named = [f"{s or 'host'} {problems[s][0].finding.name}" for s in ordered[:3]]
    more = ", ..." if len(ordered) > 3 else ""
    verb = "needs" if len(ordered) == 1 else "need"
    return f"{gpus}, {len(ordered)} {verb} attention: {', '.join(named)}{more}{note}"
