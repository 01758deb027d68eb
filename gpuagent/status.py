"""``gpuagent status``: judge a state file and render it for a person (pure, light imports).

The exit status follows the monitoring-plugins convention: 0 ok, 1 warning, 2 critical,
3 unknown, from the worst problem on the host (see :func:`judge`).  The state is read as the
agent's report wrote it (:class:`gpuagent.report.State`), once :func:`malformed` has found
nothing wrong with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import IntEnum
from typing import Any, cast

from .fmt import ago as _ago
from .fmt import clean
from .fmt import clock as _clock
from .fmt import finite as _finite
from .fmt import next_try as _next_try
from .fmt import num as _num
from .fmt import pair as _pair
from .fmt import plural as _plural
from .fmt import since as _since
from .health import HEALTH, SEVERITIES, Health, Severity
from .report import GpuEntry, ProblemEntry, State
from .views import ProbeState

__all__ = ["ExitCode", "checked", "clean", "judge", "malformed", "render"]


class ExitCode(IntEnum):
    """``gpuagent status``'s exit status (the monitoring-plugins convention)."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3

    @property
    def health(self) -> Health:
        """The health word of the exit status (``--json``'s ``health``)."""
        return Health(self.name.lower())


_CODE = {Severity.WARNING: ExitCode.WARNING, Severity.CRITICAL: ExitCode.CRITICAL}
# A running daemon rewrites the state every tick; this many intervals without it is a hang.
SILENT_INTERVALS = 3
# ...but never less than this, so that a tick stretched by a probe timeout is not a hang.
SILENT_MIN = 30.0


def _time(value: object) -> bool:
    return value is None or _finite(value)


def _problem_ok(p: object) -> bool:
    return (
        isinstance(p, dict)
        and isinstance(p.get("kind"), str)
        and p.get("severity") in SEVERITIES
        and isinstance(p.get("action"), str)
        and isinstance(p.get("message"), str)
        and _finite(p.get("since"))
    )


def _count_ok(c: object, key: str) -> bool:
    return (
        isinstance(c, dict)
        and isinstance(c.get(key), int)
        and isinstance(c.get("count"), int)
        and _finite(c.get("last"))
    )


def _gpu_ok(g: object) -> bool:
    return (
        isinstance(g, dict)
        and isinstance(g.get("pci_slot"), str)
        and isinstance(g.get("fields"), dict)
        and _time(g.get("sampled_at"))
        and isinstance(g.get("stale"), bool)
        and g.get("health") in HEALTH
        and isinstance(g.get("problems"), list)
        and all(_problem_ok(p) for p in g["problems"])
        and isinstance(g.get("xids", []), list)
        and all(_count_ok(c, "xid") for c in g.get("xids", []))
        and _cleared_ok(g.get("cleared", {"kind": "", "by": "", "at": 0}))
    )


def _cleared_ok(c: object) -> bool:
    return isinstance(c, dict) and isinstance(c.get("by"), str) and _finite(c.get("at"))


def malformed(st: Mapping[str, Any]) -> str | None:
    """The first key of ``st`` that is not what the agent writes, or None if it is sound.

    A state file edited by hand (or by anything else) must give a clear exit 3, not a
    traceback that would read as exit 1, "degraded".
    """
    checks: list[tuple[str, bool]] = [
        ("pid", isinstance(st.get("pid"), int)),
        ("interval", _finite(st.get("interval")) and st["interval"] > 0),
        ("started_at", _finite(st.get("started_at"))),
        ("updated_at", _finite(st.get("updated_at"))),
        ("ticks", isinstance(st.get("ticks"), int)),
        ("status", isinstance(st.get("status"), str)),
        ("history", isinstance(st.get("history", ""), str)),
        ("exit", st.get("exit") is None or isinstance(st.get("exit"), dict)),
        ("pci", isinstance(st.get("pci"), list)),
        ("probe", isinstance(st.get("probe"), dict)),
        ("gpus", isinstance(st.get("gpus"), list)),
        ("host_problems", isinstance(st.get("host_problems"), list)),
        ("missing", isinstance(st.get("missing"), list)),
        ("problems", isinstance(st.get("problems"), dict)),
    ]
    for key, ok in checks:
        if not ok:
            return key
    probe = st["probe"]
    if not isinstance(probe.get("state"), str) or not _time(probe.get("last_success_at")):
        return "probe"
    if not all(isinstance(s, str) for s in st["missing"]):
        return "missing"
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in st["problems"].items()):
        return "problems"
    if not all(_gpu_ok(g) for g in st["gpus"]):
        return "gpus"
    if not all(_problem_ok(p) for p in st["host_problems"]):
        return "host_problems"
    sxids = st.get("sxids", [])
    if not isinstance(sxids, list) or not all(
        _count_ok(c, "sxid") and isinstance(c.get("pci_slot"), str) for c in sxids
    ):
        return "sxids"
    return None


def checked(st: dict[str, Any]) -> State | str:
    """``st`` as the agent's state, or the first key that is not what the agent writes."""
    bad = malformed(st)
    if bad is not None:
        return bad
    return cast(State, st)  # malformed() has checked every key


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # another user's process (/proc may hide it: hidepid)
    except (ProcessLookupError, OverflowError):
        return False
    return True


def judge(st: State, now: float) -> tuple[ExitCode, str]:
    """Exit status and a one-line reason for state ``st`` read at wall time ``now`` (s).

    3 (unknown) when the agent is not running or has hung; else the worst of each GPU's
    problems (critical 2, warning 1) and the host's conditions: nvidia-smi failing or stuck
    with GPUs on the bus, or a GPU bound to nvidia that nvidia-smi does not report, is
    critical; the probe gated with GPUs on the bus, stale samples or the agent's own trouble
    (state file, metrics, sysfs) is a warning.  The reason names the worst conditions.
    """
    exit_info = st.get("exit")
    if exit_info is None or exit_info.get("reason") != "ticks":
        if exit_info is not None:
            return ExitCode.UNKNOWN, f"gpuagent is stopped since {_since(exit_info['at'], now)}"
        if not _pid_alive(st["pid"]):
            return ExitCode.UNKNOWN, f"gpuagent (pid {st['pid']}) died without finishing"
        age = now - st["updated_at"]
        if age > max(SILENT_INTERVALS * st["interval"], SILENT_MIN):
            return ExitCode.UNKNOWN, f"gpuagent has not updated its state for {age:.0f} s"
    found = _conditions(st)
    if not found:
        return ExitCode.OK, st["status"] or "ok"
    code = max(c for c, _ in found)
    return code, "; ".join(reason for c, reason in found if c == code)


def _conditions(st: State) -> list[tuple[ExitCode, str]]:
    probe = st["probe"]
    gpus = st["gpus"]
    found: list[tuple[ExitCode, str]] = []
    sick = set()
    owners: list[tuple[str, list[ProblemEntry]]] = [("host", st["host_problems"])]
    for owner, problems in owners + [(g["pci_slot"], g["problems"]) for g in gpus]:
        for p in problems:
            sick.add(owner)
            found.append((_CODE[Severity(p["severity"])], f"{owner} {p['kind']}: {p['action']}"))
    if probe["state"] in (ProbeState.FAILING, ProbeState.STUCK) and st["pci"]:
        found.append((ExitCode.CRITICAL, st["status"] or "probe failing"))
    if probe["state"] == ProbeState.GATED and st["pci"]:
        found.append((ExitCode.WARNING, st["status"] or "probe gated"))
    silent = [s for s in st["missing"] if s not in sick]
    if silent:
        found.append((ExitCode.CRITICAL, f"GPU missing from nvidia-smi: {', '.join(silent)}"))
    if any(g["stale"] and g["pci_slot"] not in sick for g in gpus):
        found.append((ExitCode.WARNING, "samples are stale"))
    if st["problems"]:
        trouble = "; ".join(f"{k}: {v}" for k, v in sorted(st["problems"].items()))
        found.append((ExitCode.WARNING, trouble))
    return found


def render(st: State, now: float, code: int, reason: str) -> str:
    """Human text in the spirit of ``systemctl status``: header, probe line, one row a GPU.

    ``st`` must have passed :func:`malformed`.
    """
    dot = "\u25cb" if code == ExitCode.UNKNOWN else "\u25cf"
    probe = st["probe"]
    exit_info = st["exit"]
    if exit_info is None:
        life = f"up {_ago(now - st['started_at'])}"
    else:
        # A finished agent's age stops at its end: it is not "up" any more.
        ran = _ago(st["updated_at"] - st["started_at"])
        life = f"finished {_ago(now - st['updated_at'])} ago after {ran}"
    # A stopped agent's last status line is history: the header says it stopped.
    title = reason if exit_info is not None and code == ExitCode.UNKNOWN else st["status"]
    lines = [
        f"{dot} gpuagent - {clean(title)}",
        f"    pid {st['pid']}, {life}, {st['ticks']} ticks every {st['interval']:g} s, "
        f"version {clean(st.get('version'))}",
    ]
    last = probe.get("last_success_at")
    probe_line = f"    probe: {clean(probe['state'])}"
    if probe.get("failure_class"):
        probe_line += (
            f" ({clean(probe['failure_class'])}, "
            f"{_plural(probe.get('consecutive_failures'), 'failure')}, "
            f"next try in {_next_try(probe.get('next_probe_in_ticks'), st['interval'])})"
        )
    probe_line += f", {_plural(probe.get('spawns_total', 0), 'spawn')}"
    if _finite(probe.get("duration")):
        probe_line += f", last took {probe['duration']:.2f} s"
    if last is not None:
        probe_line += f", last success {_ago(now - last)} ago"
    lines.append(probe_line)
    if probe.get("last_error"):
        lines.append(f"    last error: {clean(probe['last_error'])}")
    if st.get("history"):
        lines.append(f"    history: {clean(st.get('history'))}")
    if code != ExitCode.OK and reason not in (st["status"], title):
        lines.append(f"    {clean(reason)}")
    for p in st["host_problems"]:
        lines.append(f"    host: {_problem(p, now)}")
    if st["gpus"]:
        lines.append(
            f"    {'SLOT':<13} {'IDX':>3} {'UUID':<40} {'HEALTH':<8} {'NAME':<20} {'TEMP':>5} "
            f"{'UTIL':>5} {'MEMORY':>18} {'POWER':>13} AGE"
        )
    for g in st["gpus"]:
        lines.extend(_gpu_lines(g, now, g["pci_slot"] in st["missing"]))
    switches: dict[str, list[str]] = {}
    for c in st.get("sxids", []):
        switches.setdefault(c["pci_slot"], []).append(_count(f"SXid {c['sxid']}", c))
    lines.extend(f"    NVSwitch {clean(slot)}: {'; '.join(c)}" for slot, c in switches.items())
    return "\n".join(lines)


def _count(name: str, c: Mapping[str, Any]) -> str:
    """``Xid 79`` times its count and the last one's local time of day."""
    return f"{name} \u00d7{c['count']}, last {_clock(c['last'])}"


def _problem(p: ProblemEntry, now: float) -> str:
    return (
        f"{clean(p['severity'])} {clean(p['kind'])}: {clean(p['message'])} "
        f"(action: {clean(p['action'])}, since {_ago(now - p['since'])} ago)"
    )


def _gpu_lines(g: GpuEntry, now: float, missing: bool) -> list[str]:
    f = g["fields"]
    age = "-" if g["sampled_at"] is None else _ago(now - g["sampled_at"])
    index = f.get("index")
    lines = [
        f"    {clean(g['pci_slot']):<13} {clean(index) if index is not None else '-':>3} "
        f"{clean(f.get('uuid') or '-'):<40} {clean(g['health']).upper():<8} "
        f"{clean(f.get('name') or '-')[:20]:<20} "
        f"{_num(f.get('temperature.gpu'), 'C'):>5} {_num(f.get('utilization.gpu'), '%'):>5} "
        f"{_pair(f.get('memory.used'), f.get('memory.total'), 'MiB'):>18} "
        f"{_pair(f.get('power.draw'), f.get('power.limit'), 'W'):>13} "
        f"{'STALE ' + age if g['stale'] else age}"
    ]
    lines.extend(f"      - {_problem(p, now)}" for p in g["problems"])
    if g.get("xids"):
        lines.append("      " + "; ".join(_count(f"Xid {c['xid']}", c) for c in g["xids"]))
    if missing and not g["problems"]:
        lines.append("      - on the PCI bus, not reported by nvidia-smi")
    cleared = g.get("cleared")
    if cleared is not None:
        lines.append(f"      cleared by {clean(cleared['by'])} at {_clock(cleared['at'])}")
    return lines
