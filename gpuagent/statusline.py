"""The one-line sd_notify STATUS, also the state's ``status`` and the first tick's log line
(pure).

The line leads with the host's remedy (:mod:`gpuagent.remedy`): what to do with the host now,
where the problems it fixes are (a GPU by its slot, the host's problem by its name), then
where those it leaves are; then the problems counted by severity, criticals first; then,
after a semicolon, what the GPUs are doing; then the agent's own trouble (the state's
``problems``) by kind::

    drain and RMA: fixes 0000:2a:00.0, leaves 0000:ab:00.0; 2 critical; 8 GPUs, sampling
    reboot: fixes driver_hung; 1 critical; 8 GPUs, nvidia-smi failing (timeout)
    8 GPUs, sampling; agent problem: journal

Where no problem asks for anything (each asks ``none``, or is folded under a cause) there is
no remedy, and the problems are named in its place, each by its slot (``host`` for the
host's) and :attr:`~gpuagent.views.Finding.name` in the one order of the worst
(:func:`gpuagent.health.rank`): ``1 warning (host inforom); 8 GPUs, sampling``.

The whole line keeps within :data:`WIDTH` columns, for a terminal and ``systemctl status``
(:func:`_forms` says the order in which it gives things up): the counts and the summary always
stand; a slot in domain 0000 loses its domain where the full slots do not fit (``ba:00.0``, as
lspci names it); the remedy's words give way to its action's name (``reboot``); names go from
the end, the worst kept longest, a ``+N more`` in their place (no name left in a group: its
count alone); where even the worst problem's name does not fit, the summary's detail (``, next
try in 20 s``) goes first; last, the remedy itself.  A line too long even so (a summary naming
odd drivers) is cut, ``…`` at its end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuagent.health import CRITICAL
from gpuagent.remedy import places, remedy
from gpuagent.schema import ProbeState, RemedyEntry
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
    where room allows (``, next try in 20 s``), and the host's ``remedy`` (None: no problem
    asks for anything)."""

    critical: tuple[str, ...]
    warning: tuple[str, ...]
    summary: str
    detail: str = ""
    remedy: RemedyEntry | None = None


def status_line(bus: BusView, probe: ProbeView, problems: Problems, interval: float) -> Line:
    """The status line of a tick: ``problems`` by slot (``""``: the host), ``interval`` the
    tick's (s); :func:`with_trouble` makes it text."""
    ordered = sorted((p for mine in problems.values() for p in mine), key=lambda p: p.rank)
    named = [(p.finding.severity, f"{p.slot or 'host'} {p.finding.name}") for p in ordered]
    critical = tuple(name for severity, name in named if severity == CRITICAL)
    warning = tuple(name for severity, name in named if severity != CRITICAL)
    cure = remedy((p.slot, p.finding.name, p.finding.action, p.finding.caused) for p in ordered)
    return Line(critical, warning, *_summary(bus, probe, interval), cure)


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
    at its end, within :data:`WIDTH` columns, in the first of :func:`_forms` that fits."""
    trouble = tuple(sorted(kinds))
    most = min(sum(len(n) for n in _names(line)) + len(trouble), _MOST_NAMES)
    for form in _forms(most, line.remedy is not None):
        text = _render(line, trouble, form)
        if len(text) <= WIDTH:
            return text
    return text[: WIDTH - 1] + "…"


# How a line is said: how many names it shows, whether with the summary's detail, slots in
# lspci's short form, the count of the places the remedy leaves where none is named, and the
# remedy in words (2), by its action's name (1) or not at all (0).
_Form = tuple[int, bool, bool, bool, int]


def _forms(most: int, cure: bool) -> list[_Form]:
    """The ways to say a line with ``most`` names, the one preferred first: every name, in
    full, with the detail; then fewer (``+N more``), a slot without its domain 0000, the
    remedy by its action's name (``reboot``), before the count of what the remedy leaves goes;
    where even one name does not fit, the worst name before the detail; then no name; last,
    without the remedy, the counts and the summary alone."""
    bare = [(0, True, False, False, 0), (0, False, False, False, 0)]
    if not cure:
        named = [(n, True, False, False, 0) for n in range(most, 0, -1)]
        return named + [(1, False, False, False, 0)] * bool(most) + bare
    ways = ((2, False), (2, True), (1, True))
    lefts = (True, False)
    forms = [
        (n, True, sh, left, says) for left in lefts for n in range(most, 0, -1) for says, sh in ways
    ]
    if most:
        forms += [(1, False, True, left, says) for left in lefts for says in (2, 1)]
    return [
        *forms,
        (0, True, True, True, 2),
        (0, True, True, True, 1),
        (0, False, True, True, 1),
        *bare,
    ]


def _names(line: Line) -> tuple[tuple[str, ...], ...]:
    """The line's groups of names, in the order they are given room: where the problems the
    remedy fixes are and where those it leaves (:func:`gpuagent.remedy.places`), else the
    criticals' and the warnings' names."""
    if line.remedy is None:
        return line.critical, line.warning
    return places(line.remedy["fixes"]), places(line.remedy["leaves"])


def _render(line: Line, trouble: tuple[str, ...], form: _Form) -> str:
    """The line said in ``form``: its first names (the remedy's places, else the criticals'
    and warnings', then the trouble's)."""
    shown, detail, short, left, says = form
    counts = [
        (f"{len(line.critical)} critical", line.critical),
        (plural(len(line.warning), "warning"), line.warning),
    ]
    if line.remedy is None or not says:
        groups = []
        for head, names in counts:
            if names:
                groups.append(_named(head, names, shown))
                shown = max(0, shown - len(names))
        parts = [", ".join(groups)] if groups else []
    else:
        fixes, leaves = (tuple(map(_short, n)) if short else n for n in _names(line))
        said = line.remedy["says"] if says == 2 else line.remedy["action"]
        if shown > 0:
            said += f": fixes {_list(fixes, shown)}"
            shown = max(0, shown - len(fixes))
            if leaves and shown > 0:
                said += f", leaves {_list(leaves, shown)}"
                shown = max(0, shown - len(leaves))
            elif leaves and left:
                said += f", leaves {len(leaves)}"
        parts = [said, ", ".join(head for head, names in counts if names)]
    parts.append(line.summary + line.detail if detail else line.summary)
    if trouble:
        parts.append(_trouble(trouble, shown))
    return "; ".join(parts)


def _short(slot: str) -> str:
    """``ba:00.0`` for ``0000:ba:00.0``, as lspci names a slot in domain 0000."""
    return slot.removeprefix("0000:")


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
