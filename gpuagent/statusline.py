"""The one-line sd_notify STATUS, also the state's ``status`` and the first tick's log line
(pure).

The line leads with the problems, counted by severity, criticals first, each named (its slot,
``host`` for the host's, and :attr:`~gpuagent.views.Finding.name`) in the one order of the
worst (:func:`gpuagent.health.rank`); then, after a semicolon, what the GPUs are doing; then
the agent's own trouble (the state's ``problems``) by kind::

    2 critical (0000:ba:00.0 Xid 79, host gpu_count), 1 warning; 8 GPUs, sampling
    1 critical (host driver_hung); 8 GPUs, nvidia-smi failing (timeout)
    8 GPUs, sampling; agent problem: journal

The whole line keeps within :data:`WIDTH` columns, for a terminal and ``systemctl status``:
the counts and the summary always stand; names go from the end, the worst kept longest, a
``+N more`` in their place (no name left in a group: its count alone); where even the worst
problem's name does not fit, the summary's detail (``, next try in 20 s``) goes first.  A
line too long even so (a summary naming odd drivers) is cut, ``…`` at its end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuagent.health import CRITICAL
from gpuagent.schema import ProbeState
from gpuagent.views import BusView, Gate, ProbeView, Problem, plural

__all__ = ["WIDTH", "Line", "Problems", "status_line", "with_trouble"]

Problems = Mapping[str, Sequence[Problem]]
# Columns: a terminal's, and what `systemctl status` shows of a STATUS= line unwrapped.
WIDTH = 80
# At most this many names fit in WIDTH columns (each at least one character and ", ").
_MOST_NAMES = WIDTH // 3


@dataclass(frozen=True)
class Line:
    """The status line before the agent's trouble is named in it: the problems' names, each
    severity's worst first (``0000:ba:00.0 Xid 79``, ``host gpu_count``), the summary of
    what the GPUs are doing (``8 GPUs, nvidia-smi failing (timeout)``) and its detail, said
    where room allows (``, next try in 20 s``)."""

    critical: tuple[str, ...]
    warning: tuple[str, ...]
    summary: str
    detail: str = ""


def status_line(bus: BusView, probe: ProbeView, problems: Problems, interval: float) -> Line:
    """The status line of a tick: ``problems`` by slot (``""``: the host), ``interval`` the
    tick's (s); :func:`with_trouble` makes it text."""
    ordered = sorted((p for mine in problems.values() for p in mine), key=lambda p: p.rank)
    named = [(p.finding.severity, f"{p.slot or 'host'} {p.finding.name}") for p in ordered]
    critical = tuple(name for severity, name in named if severity == CRITICAL)
    warning = tuple(name for severity, name in named if severity != CRITICAL)
    return Line(critical, warning, *_summary(bus, probe, interval))


def _summary(bus: BusView, probe: ProbeView, interval: float) -> tuple[str, str]:
    """What the GPUs are doing, how many and the probe's state, and the detail that goes
    first where room is short (``, next try in 20 s``)."""
    n = len(bus.gpus)
    if n == 0:
        return "no NVIDIA GPU on the PCI bus", ""
    gpus = plural(n, "GPU")
    if probe.gate is Gate.NO_GPU:
        drivers = sorted({g.driver or "none" for g in bus.gpus})
        return f"{gpus}, all bound to {', '.join(drivers)}", "; not sampled"
    if probe.gate is Gate.NVIDIA_SMI_MISSING:
        return f"{gpus}, nvidia-smi not found", ""
    if probe.gate is Gate.DRIVER_NOT_LOADED:
        return f"{gpus}, NVIDIA driver not loaded", "; not probing"
    if probe.state is ProbeState.STUCK:
        return f"{gpus}, nvidia-smi stuck in the driver", "; not probing"
    if probe.state is ProbeState.FAILING:
        wait = probe.next_in_ticks * interval
        return f"{gpus}, nvidia-smi failing ({probe.failure})", f", next try in {wait:g} s"
    if probe.state is ProbeState.OK:
        return f"{gpus}, sampling", ""
    return f"{gpus}, starting", ""


def with_trouble(line: Line, kinds: Iterable[str]) -> str:
    """``line`` as text, the agent's own trouble named by kind (``journal``, ``textfile`` …)
    at its end, within :data:`WIDTH` columns: as many names as fit, with the summary's
    detail; where even one name does not, the worst problem's name before the detail."""
    trouble = tuple(sorted(kinds))
    most = min(len(line.critical) + len(line.warning) + len(trouble), _MOST_NAMES)
    tries = [(n, True) for n in range(most, 0, -1)] + [(1, False)] * bool(most)
    for shown, detail in [*tries, (0, True), (0, False)]:
        text = _render(line, trouble, shown, detail)
        if len(text) <= WIDTH:
            return text
    return text[: WIDTH - 1] + "…"


def _render(line: Line, trouble: tuple[str, ...], shown: int, detail: bool) -> str:
    """The line with its first ``shown`` names (criticals', warnings', then the trouble's),
    with the summary's detail or without."""
    groups = []
    for head, names in (
        (f"{len(line.critical)} critical", line.critical),
        (plural(len(line.warning), "warning"), line.warning),
    ):
        if names:
            groups.append(_named(head, names, shown))
            shown = max(0, shown - len(names))
    parts = [", ".join(groups)] if groups else []
    parts.append(line.summary + line.detail if detail else line.summary)
    if trouble:
        parts.append(_trouble(trouble, shown))
    return "; ".join(parts)


def _named(head: str, names: tuple[str, ...], shown: int) -> str:
    """``2 critical (a, +1 more)``: ``head`` with the first ``shown`` of ``names``."""
    if shown <= 0:
        return head
    return f"{head} ({_list(names, shown)})"


def _trouble(kinds: tuple[str, ...], shown: int) -> str:
    """``agent problem: journal``, ``agent problems: journal, +1 more``, ``2 agent problems``."""
    if shown <= 0:
        return plural(len(kinds), "agent problem")
    word = "problem" if len(kinds) == 1 else "problems"
    return f"agent {word}: {_list(kinds, shown)}"


def _list(names: tuple[str, ...], shown: int) -> str:
    rest = len(names) - shown
    return ", ".join(names[:shown] + ((f"+{rest} more",) if rest > 0 else ()))
