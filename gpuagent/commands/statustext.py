"""``gpuagent status`` as text: what ``--json`` has, for a person, in the terminal's width (pure).

The header (the status line; the host's remedy in full, step by step; the agent's life), the
probe, every condition of the host (each of the agent's own troubles included), the host's
problems, then one row a GPU that fits 80 columns (``wide``: with its UUID and full name),
each problem under its GPU with the action first and, under it, how it ends.  A GPU whose
sample is stale shows its last index in brackets: another GPU may have that index now.  Lines
other than the table's are wrapped to ``width`` (``$COLUMNS``).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from gpuagent.commands.status import ExitCode, ago, clean, conditions, finite
from gpuagent.commands.statusrows import (
    clock,
    count,
    nvlink_row,
    process_rows,
    services_row,
    vgpu_row,
)
from gpuagent.health import DRAIN_REPORT
from gpuagent.remedy import of_state

if TYPE_CHECKING:
    # Annotations only: the schema's classes cost this command 3 ms to make.
    from gpuagent.schema import GpuEntry, ProblemEntry, State

__all__ = ["render"]

# Columns before MEMORY and POWER, by width (negative: left-aligned).
_Columns = tuple[tuple[str, int], ...]
_NARROW: _Columns = (("SLOT", -12), ("IDX", 4), ("HEALTH", -8), ("TEMP", 5), ("UTIL", 5))
_WIDE: _Columns = (("SLOT", -12), ("IDX", 4), ("UUID", -40), ("HEALTH", -8), ("NAME", -20))
_WIDE += (("TEMP", 5), ("UTIL", 5))


def _plural(n: object, word: str) -> str:
    """``1 failure``, ``2 failures``: a count from the state, made safe to print."""
    return f"{clean(n)} {word}" if n == 1 else f"{clean(n)} {word}s"


def _num(value: object, unit: str, digits: int = 0) -> str:
    if finite(value):
        return f"{value:.{digits}f}{unit}"
    return "-"


def _next_try(ticks: object, interval: float) -> str:
    """The next probe in seconds, as the status line says it (``next try in 20 s``)."""
    if not finite(ticks):
        return "-"
    return f"{ticks * interval:g} s"


def _pair(used: object, total: object, unit: str, scale: float = 1.0) -> str:
    if used is None and total is None:
        return "-"
    u = used / scale if finite(used) else None
    t = total / scale if finite(total) else None
    return f"{_num(u, '')}/{_num(t, '')} {unit}"


def _cell(text: str, width: int) -> str:
    return f"{text[: abs(width)]:<{-width}}" if width < 0 else f"{text:>{width}}"


def _columns() -> int:
    """The terminal's width as :func:`shutil.get_terminal_size` finds it: ``$COLUMNS``, else
    stdout's terminal, else 80 (shutil's import, through bz2 and lzma, was a millisecond of
    ``gpuagent status``)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0 or sys.__stdout__ is None:
        return columns if columns > 0 else 80
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (ValueError, OSError):
        return 80


def render(
    st: State, now: float, code: int, reason: str, *, wide: bool = False, width: int = 0
) -> str:
    """Human text in the spirit of ``systemctl status``: header, probe line, conditions, one
    row a GPU.  ``st`` must have passed :func:`gpuagent.commands.status.malformed`; ``width`` 0 is
    the terminal's (``$COLUMNS``, else 80)."""
    width = width or _columns()
    dot = "\u25cb" if code == ExitCode.UNKNOWN else "\u25cf"
    exit_info = st["exit"]
    if exit_info is None:
        life = f"up {ago(now - st['started_at'])}"
    else:
        # A finished agent's age stops at its end: it is not "up" any more.
        ran = ago(st["updated_at"] - st["started_at"])
        life = f"finished {ago(now - st['updated_at'])} ago after {ran}"
    # A stopped agent's last status line is history: the header says it stopped.
    title = reason if exit_info is not None and code == ExitCode.UNKNOWN else st["status"]
    lines = [f"{dot} gpuagent - {clean(title)}"]
    if code != ExitCode.UNKNOWN:
        lines.extend(_remedy(st))
    if st.get("drain") == DRAIN_REPORT:
        lines.append(
            '    drain: report only (drain = "report"): Slurm, NHC and node-problem-detector '
            "are told what would drain; nothing is drained"
        )
    lines += [
        f"    pid {st['pid']}, {life}, {st['ticks']} tick{'' if st['ticks'] == 1 else 's'} "
        f"every {st['interval']:g} s, "
        f"version {clean(st.get('version'))}",
        _probe_line(st, now),
    ]
    if st["probe"].get("last_error"):
        lines.append(f"    last error: {clean(st['probe']['last_error'])}")
    if st.get("history"):
        lines.append(f"    history: {clean(st.get('history'))}")
    if code == ExitCode.UNKNOWN and reason != title:
        lines.append(f"    {clean(reason)}")
    for severity, text in conditions(st):
        if text not in (st["status"], title):
            lines.append(f"    {severity.health}: {clean(text)}")
    for p in st["host_problems"]:
        lines.append(f"    host: {_problem(p, now, host=True)}")
        lines.extend(f"      {ends}" for ends in _ends(p))
    services = services_row(st.get("services"))
    if services:
        lines.append(f"    services: {services}")
    out = [line for text in lines for line in _wrap(text, width)]
    if st["gpus"]:
        out.append(_row(_WIDE if wide else _NARROW, None, wide))
    for g in st["gpus"]:
        out.append(_row(_WIDE if wide else _NARROW, g, wide, now))
        for text in _gpu_lines(g, now, g["pci_slot"] in st["missing"]):
            out.extend(_wrap(text, width))
    switches: dict[str, list[str]] = {}
    for c in st.get("sxids", []):
        switches.setdefault(c["pci_slot"], []).append(count(f"SXid {c['sxid']}", c))
    for slot, counts in switches.items():
        out.extend(_wrap(f"    NVSwitch {clean(slot)}: {'; '.join(counts)}", width))
    return "\n".join(out)


def _remedy(st: State) -> list[str]:
    """The host's remedy in full, each problem it fixes named, then each step after it
    (:func:`gpuagent.remedy.of_state`): ``remedy: drain and reboot: fixes 0000:db:00.0
    gone_from_bus, 0000:2a:00.0 Xid 119``, ``then: check the host: fixes host gpu_count``."""
    return [
        f"    {'then' if i else 'remedy'}: {clean(step['says'])}: fixes "
        + ", ".join(clean(name) for name in step["fixes"])
        for i, step in enumerate(of_state(st))
    ]


def _wrap(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    # Imported only for a line too long for the terminal: its regexes are 3 ms of a start.
    import textwrap  # noqa: PLC0415

    indent = " " * (len(text) - len(text.lstrip(" ")))
    return textwrap.wrap(text, width, subsequent_indent=indent + "  ", break_on_hyphens=False) or [
        text
    ]


def _probe_line(st: State, now: float) -> str:
    probe = st["probe"]
    line = f"    probe: {clean(probe['state'])}"
    if probe.get("failure_class"):
        line += (
            f" ({clean(probe['failure_class'])}, "
            f"{_plural(probe.get('consecutive_failures'), 'failure')}, "
            f"next try in {_next_try(probe.get('next_probe_in_ticks'), st['interval'])})"
        )
    line += f", {_plural(probe.get('spawns_total', 0), 'spawn')}"
    if finite(probe.get("duration")):
        line += f", last took {probe['duration']:.2f} s"
    last = probe.get("last_success_at")
    if last is not None:
        line += f", last success {ago(now - last)} ago"
    return line


def _row(columns: _Columns, g: GpuEntry | None, wide: bool, now: float = 0) -> str:
    """The header (``g`` None) or a GPU's row."""
    mem, power = (18, 13) if wide else (11, 9)
    if g is None:
        cells = [_cell(name, w) for name, w in columns]
        return "    " + " ".join([*cells, f"{'MEMORY':>{mem}}", f"{'POWER':>{power}}", "AGE"])
    f = g["fields"]
    index = "-" if f.get("index") is None else clean(f.get("index"))
    if g["stale"] and index != "-":
        index = f"({index})"  # its index when last seen: another GPU may have it now
    values = {
        "SLOT": clean(g["pci_slot"]),
        "IDX": index,
        "UUID": clean(f.get("uuid") or g.get("uuid") or "-"),
        "HEALTH": clean(g["health"]).upper(),
        "NAME": clean(f.get("name") or "-"),
        "TEMP": _num(f.get("temperature.gpu"), "C"),
        "UTIL": _num(f.get("utilization.gpu"), "%"),
    }
    memory = f.get("memory.used"), f.get("memory.total")
    memory_text = _pair(*memory, "MiB") if wide else _pair(*memory, "GiB", 1024)
    age = "-" if g["sampled_at"] is None else ago(now - g["sampled_at"])
    cells = [_cell(values[name], w) for name, w in columns]
    cells += [
        f"{memory_text:>{mem}}",
        f"{_pair(f.get('power.draw'), f.get('power.limit'), 'W'):>{power}}",
    ]
    return "    " + " ".join([*cells, "STALE " + age if g["stale"] else age])


def _problem(p: ProblemEntry, now: float, *, host: bool = False) -> str:
    """The action first: what to do, then what is wrong; a folded problem (a GPU's fabric
    while the fabric manager is down; the host's gpu_count while GPUs are gone from the bus)
    names its cause, the host's problem or the GPUs'."""
    where = "the GPUs' " if host else "host "
    cause = f"cause: {where}{clean(p['cause'])}, " if p.get("cause") else ""
    said = f"{clean(p['severity'])} {clean(p['kind'])}"
    unread = p.get("unread_since")
    if finite(unread):
        # Held as last seen: its source cannot look (evidence before verdict).
        why = clean(p.get("unread") or "not read")
        said = f"not read since {clock(unread)} ({why}), last seen {said}"
    return (
        f"{clean(p['action'])}: {said}: "
        f"{clean(p['message'])} ({cause}since {ago(now - p['since'])} ago)"
    )


def _ends(p: ProblemEntry) -> list[str]:
    """How the problem ends, as the agent that wrote the state said (none from an older one)."""
    ends = p.get("ends")
    return [clean(ends)] if isinstance(ends, str) and ends else []


def _evidence(p: ProblemEntry) -> list[str]:
    """The evidence bundle root gathered for the problem, where the state names one."""
    path = p.get("evidence")
    return [f"evidence: {clean(path)}"] if isinstance(path, str) and path else []


def _gpu_lines(g: GpuEntry, now: float, missing: bool) -> list[str]:
    rows = (nvlink_row(g.get("nvlink")), vgpu_row(g.get("vgpu")))
    lines = [f"      {row}" for row in rows if row]
    lines.extend(f"      {row}" for row in process_rows(g))
    for p in g["problems"]:
        lines.append(f"      - {_problem(p, now)}")
        lines.extend(f"        {said}" for said in [*_ends(p), *_evidence(p)])
    if g.get("xids"):
        lines.append("      " + "; ".join(count(f"Xid {c['xid']}", c) for c in g["xids"]))
    kinds = {p["kind"] for p in g["problems"]}
    if missing and not kinds & {"missing", "lost"}:
        lines.append("      - on the PCI bus, not reported by nvidia-smi")
    cleared = g.get("cleared")
    if cleared is not None:
        lines.append(f"      cleared by {clean(cleared['by'])} at {clock(cleared['at'])}")
    return lines
