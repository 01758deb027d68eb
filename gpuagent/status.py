"""``gpuagent status``: judge a state file and render it for a person (pure, light imports)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["DEGRADED", "HEALTHY", "UNKNOWN", "judge", "render"]

HEALTHY, DEGRADED, UNKNOWN = 0, 1, 3
# A running daemon rewrites the state every tick; this many intervals without it is a hang.
SILENT_INTERVALS = 3
# ...but never less than this, so that a tick stretched by a probe timeout is not a hang.
SILENT_MIN = 30.0


def _pid_alive(pid: object) -> bool:
    return isinstance(pid, int) and pid > 0 and os.path.exists(f"/proc/{pid}")


def judge(st: dict[str, Any], now: float) -> tuple[int, str]:
    """Exit status and a one-line reason for state ``st`` read at wall time ``now`` (s)."""
    exit_info = st.get("exit")
    if exit_info is None or exit_info.get("reason") != "ticks":
        if exit_info is not None:
            return UNKNOWN, "gpuagent is not running (stopped)"
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


def _ago(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _num(value: object, unit: str, digits: int = 0) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.{digits}f}{unit}"
    return "-"


def _pair(used: object, total: object, unit: str) -> str:
    if used is None and total is None:
        return "-"
    return f"{_num(used, '')}/{_num(total, '')} {unit}"


def render(st: dict[str, Any], now: float, code: int, reason: str) -> str:
    """Human text in the spirit of ``systemctl status``: header, probe line, one row a GPU."""
    dot = {HEALTHY: "\u25cf", DEGRADED: "\u25cf", UNKNOWN: "\u25cb"}.get(code, "?")
    probe = st.get("probe") or {}
    up = _ago(now - float(st.get("started_at") or now))
    lines = [
        f"{dot} gpuagent - {st.get('status', '?')}",
        f"    pid {st.get('pid')}, up {up}, {st.get('ticks')} ticks every "
        f"{float(st.get('interval') or 0):g} s, version {st.get('version')}",
    ]
    last = probe.get("last_success_at")
    probe_line = f"    probe: {probe.get('state')}"
    if probe.get("failure_class"):
        probe_line += (
            f" ({probe['failure_class']}, {probe.get('consecutive_failures')} failures, "
            f"next try in {probe.get('next_probe_in_ticks')} ticks)"
        )
    probe_line += f", {probe.get('spawns_total', 0)} spawns"
    if last:
        probe_line += f", last success {_ago(now - float(last))} ago"
    lines.append(probe_line)
    if probe.get("last_error"):
        lines.append(f"    last error: {probe['last_error']}")
    if code != HEALTHY and reason != st.get("status"):
        lines.append(f"    {reason}")
    gpus = st.get("gpus") or []
    if gpus:
        lines.append(
            f"    {'SLOT':<13} {'NAME':<26} {'TEMP':>5} {'UTIL':>5} {'MEMORY':>18} "
            f"{'POWER':>13} AGE"
        )
    for g in gpus:
        f = g.get("fields") or {}
        age = _ago(now - float(g.get("sampled_at") or now))
        lines.append(
            f"    {g.get('pci_slot', '?'):<13} {str(f.get('name') or '-')[:26]:<26} "
            f"{_num(f.get('temperature.gpu'), 'C'):>5} {_num(f.get('utilization.gpu'), '%'):>5} "
            f"{_pair(f.get('memory.used'), f.get('memory.total'), 'MiB'):>18} "
            f"{_pair(f.get('power.draw'), f.get('power.limit'), 'W'):>13} "
            f"{'STALE ' + age if g.get('stale') else age}"
        )
    for slot in st.get("missing") or []:
        lines.append(f"    {slot:<13} (on the PCI bus, not reported by nvidia-smi)")
    return "\n".join(lines)
