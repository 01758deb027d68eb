"""``gpuagent status``: judge a state file and render it for a person (pure, light imports)."""

from __future__ import annotations

import math
import os
import time
from typing import Any, TypeGuard

__all__ = ["DEGRADED", "HEALTHY", "UNKNOWN", "clean", "judge", "malformed", "render"]

HEALTHY, DEGRADED, UNKNOWN = 0, 1, 3
# A running daemon rewrites the state every tick; this many intervals without it is a hang.
SILENT_INTERVALS = 3
# ...but never less than this, so that a tick stretched by a probe timeout is not a hang.
SILENT_MIN = 30.0


def _finite(value: object) -> TypeGuard[int | float]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _time(value: object) -> bool:
    return value is None or _finite(value)


def malformed(st: dict[str, Any]) -> str | None:
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
        ("exit", st.get("exit") is None or isinstance(st.get("exit"), dict)),
        ("pci", isinstance(st.get("pci"), list)),
        ("probe", isinstance(st.get("probe"), dict)),
        ("gpus", isinstance(st.get("gpus"), list)),
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
    for g in st["gpus"]:
        if not (
            isinstance(g, dict)
            and isinstance(g.get("pci_slot"), str)
            and isinstance(g.get("fields"), dict)
            and _finite(g.get("sampled_at"))
            and isinstance(g.get("stale"), bool)
        ):
            return "gpus"
    return None


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


def judge(st: dict[str, Any], now: float) -> tuple[int, str]:
    """Exit status and a one-line reason for state ``st`` read at wall time ``now`` (s)."""
    exit_info = st.get("exit")
    if exit_info is None or exit_info.get("reason") != "ticks":
        if exit_info is not None:
            return UNKNOWN, f"gpuagent is stopped since {_since(exit_info.get('at'), now)}"
        if not _pid_alive(st.get("pid")):
            return UNKNOWN, f"gpuagent (pid {st.get('pid')}) died without finishing"
        interval = float(st.get("interval") or 10)
        age = now - float(st.get("updated_at") or 0)
        if age > max(SILENT_INTERVALS * interval, SILENT_MIN):
            return UNKNOWN, f"gpuagent has not updated its state for {age:.0f} s"
    probe = st.get("probe") or {}
    gpus = st.get("gpus") or []
    if probe.get("state") in ("failing", "stuck") and st.get("pci"):
        return DEGRADED, st.get("status") or "probe failing"
    if probe.get("state") == "gated" and st.get("pci"):
        return DEGRADED, st.get("status") or "probe gated"
    if st.get("missing"):
        return DEGRADED, f"GPU missing from nvidia-smi: {', '.join(st['missing'])}"
    if any(g.get("stale") for g in gpus):
        return DEGRADED, "samples are stale"
    if st.get("problems"):
        return DEGRADED, "; ".join(f"{k}: {v}" for k, v in sorted(st["problems"].items()))
    return HEALTHY, st.get("status") or "ok"


def _since(at: object, now: float) -> str:
    """``at`` (wall s) as local time and how long ago; "an unknown time" if it is not one."""
    if not _finite(at):
        return "an unknown time"
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))
    except (OverflowError, OSError, ValueError):
        return "an unknown time"
    return f"{stamp} ({_ago(now - at)} ago)"


def _ago(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _num(value: object, unit: str, digits: int = 0) -> str:
    if _finite(value):
        return f"{value:.{digits}f}{unit}"
    return "-"


def clean(value: object) -> str:
    """Text from the state (nvidia-smi's words) made safe to print on a terminal."""
    return "".join(c if c.isprintable() else "?" for c in str(value))


def _next_try(ticks: object, interval: float) -> str:
    """The next probe in seconds, as the status line says it (``next try in 20 s``)."""
    if not _finite(ticks):
        return "-"
    return f"{ticks * interval:g} s"


def _pair(used: object, total: object, unit: str) -> str:
    if used is None and total is None:
        return "-"
    return f"{_num(used, '')}/{_num(total, '')} {unit}"


def render(st: dict[str, Any], now: float, code: int, reason: str) -> str:
    """Human text in the spirit of ``systemctl status``: header, probe line, one row a GPU.

    ``st`` must have passed :func:`malformed`.
    """
    dot = "\u25cb" if code == UNKNOWN else "\u25cf"
    probe = st["probe"]
    exit_info = st["exit"]
    if exit_info is None:
        life = f"up {_ago(now - st['started_at'])}"
    else:
        # A finished agent's age stops at its end: it is not "up" any more.
        ran = _ago(st["updated_at"] - st["started_at"])
        life = f"finished {_ago(now - st['updated_at'])} ago after {ran}"
    # A stopped agent's last status line is history: the header says it stopped.
    title = reason if exit_info is not None and code == UNKNOWN else st["status"]
    lines = [
        f"{dot} gpuagent - {clean(title)}",
        f"    pid {st['pid']}, {life}, {st['ticks']} ticks every {st['interval']:g} s, "
        f"version {clean(st.get('version'))}",
    ]
    last = probe.get("last_success_at")
    probe_line = f"    probe: {clean(probe['state'])}"
    if probe.get("failure_class"):
        probe_line += (
            f" ({clean(probe['failure_class'])}, {clean(probe.get('consecutive_failures'))} "
            f"failures, next try in {_next_try(probe.get('next_probe_in_ticks'), st['interval'])})"
        )
    probe_line += f", {clean(probe.get('spawns_total', 0))} spawns"
    if last is not None:
        probe_line += f", last success {_ago(now - last)} ago"
    lines.append(probe_line)
    if probe.get("last_error"):
        lines.append(f"    last error: {clean(probe['last_error'])}")
    if code != HEALTHY and reason not in (st["status"], title):
        lines.append(f"    {clean(reason)}")
    if st["gpus"]:
        lines.append(
            f"    {'SLOT':<13} {'NAME':<26} {'TEMP':>5} {'UTIL':>5} {'MEMORY':>18} "
            f"{'POWER':>13} AGE"
        )
    for g in st["gpus"]:
        f = g["fields"]
        age = _ago(now - g["sampled_at"])
        lines.append(
            f"    {clean(g['pci_slot']):<13} {clean(f.get('name') or '-')[:26]:<26} "
            f"{_num(f.get('temperature.gpu'), 'C'):>5} {_num(f.get('utilization.gpu'), '%'):>5} "
            f"{_pair(f.get('memory.used'), f.get('memory.total'), 'MiB'):>18} "
            f"{_pair(f.get('power.draw'), f.get('power.limit'), 'W'):>13} "
            f"{'STALE ' + age if g['stale'] else age}"
        )
    for slot in st["missing"]:
        lines.append(f"    {clean(slot):<13} (on the PCI bus, not reported by nvidia-smi)")
    return "\n".join(lines)
