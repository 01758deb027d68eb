"""``gpuagent status``: judge a state file and render it for a person (pure, light imports).

The exit status follows the monitoring-plugins convention: 0 ok, 1 warning, 2 critical,
3 unknown, from the worst problem on the host (see :func:`judge`).  The state is read as the
agent's report wrote it (:class:`gpuagent.schema.State`), once :func:`malformed` has found
nothing wrong with it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from enum import IntEnum
from typing import TYPE_CHECKING, Any, TypeGuard, cast

from gpuagent.health import DRAIN_ASK, DRAIN_MODES, HEALTH, SEVERITIES, Health, Severity, ranked
from gpuagent.untrusted import printable

if TYPE_CHECKING:
    # Annotations only: the schema's classes cost this command 3 ms to make.
    from gpuagent.schema import State

__all__ = [
    "ExitCode",
    "ago",
    "checked",
    "clean",
    "conditions",
    "finite",
    "graded",
    "judge",
    "malformed",
    "since",
]


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


def finite(value: object) -> TypeGuard[int | float]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _time(value: object) -> bool:
    return value is None or finite(value)


def _problem_ok(p: object) -> bool:
    return (
        isinstance(p, dict)
        and isinstance(p.get("kind"), str)
        and p.get("severity") in SEVERITIES
        and isinstance(p.get("action"), str)
        and isinstance(p.get("message"), str)
        and finite(p.get("since"))
    )


def _count_ok(c: object, key: str) -> bool:
    return (
        isinstance(c, dict)
        and isinstance(c.get(key), int)
        and isinstance(c.get("count"), int)
        and finite(c.get("last"))
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
    )


def malformed(st: Mapping[str, Any]) -> str | None:
    """The first key of ``st`` that is not what the agent writes, or None if it is sound.

    A state file edited by hand (or by anything else) must give a clear exit 3, not a
    traceback that would read as exit 1, "degraded".
    """
    checks: list[tuple[str, bool]] = [
        ("pid", isinstance(st.get("pid"), int)),
        ("interval", finite(st.get("interval")) and st["interval"] > 0),
        ("started_at", finite(st.get("started_at"))),
        ("updated_at", finite(st.get("updated_at"))),
        ("ticks", isinstance(st.get("ticks"), int)),
        ("status", isinstance(st.get("status"), str)),
        ("history", isinstance(st.get("history", ""), str)),
        ("drain", st.get("drain", DRAIN_ASK) in DRAIN_MODES),
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
    return cast("State", st)  # malformed() has checked every key


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

    3 (unknown) when the agent is not running or has hung; else the worst of the problems
    the agent wrote, the host's and each GPU's (critical 2, warning 1), and the agent's own
    trouble (state file, metrics, sysfs: a warning).  The reason names the conditions of the
    exit status, the problems first, worst first (:func:`gpuagent.health.rank`)."""
    exit_info = st.get("exit")
    if exit_info is None or exit_info.get("reason") != "ticks":
        if exit_info is not None:
            return (
                ExitCode.UNKNOWN,
                f"gpuagent has been stopped since {since(exit_info['at'], now)}",
            )
        if not _pid_alive(st["pid"]):
            return ExitCode.UNKNOWN, f"gpuagent (pid {st['pid']}) died without finishing"
        age = now - st["updated_at"]
        if age > max(SILENT_INTERVALS * st["interval"], SILENT_MIN):
            return ExitCode.UNKNOWN, f"gpuagent has not updated its state for {age:.0f} s"
    found = graded(st)
    if not found:
        return ExitCode.OK, st["status"] or "ok"
    code = max(c for c, _ in found)
    return code, "; ".join(reason for c, reason in found if c == code)


def graded(st: State) -> list[tuple[ExitCode, str]]:
    """Every condition of ``st`` with its exit status: the problems first, worst first
    (``slot kind: action``), then the host's :func:`conditions`."""
    found = [
        (_CODE[Severity(p["severity"])], f"{slot or 'host'} {p['kind']}: {p['action']}")
        for slot, p in ranked(st)
    ]
    return found + conditions(st)


def conditions(st: State) -> list[tuple[ExitCode, str]]:
    """Each of the agent's own troubles (``kind: reason``, a warning): the state's
    ``problems``, no GPU's nor the host's.  Every condition of the GPUs and the host is a
    problem the agent wrote with its severity (nvidia-smi failing, missing or stuck, a GPU
    missing from it): no reader decides one."""
    trouble = sorted(st["problems"].items())
    return [(ExitCode.WARNING, f"{kind}: {reason}") for kind, reason in trouble]


def since(at: object, now: float) -> str:
    """``at`` (wall s) as local time and how long ago; "an unknown time" if it is not one."""
    if not finite(at):
        return "an unknown time"
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))
    except (OverflowError, OSError, ValueError):
        return "an unknown time"
    return f"{stamp} ({ago(now - at)} ago)"


def ago(seconds: float) -> str:
    """A duration as ``45s``, ``12m``, ``3h05m``."""
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def clean(value: object) -> str:
    """Text from the state (nvidia-smi's words) made safe to print on a terminal."""
    return printable(value)
