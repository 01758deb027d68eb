"""A driver that keeps hanging: nvidia-smi timing out again and again while the nvidia module
is loaded is a hung driver, ``driver_hung`` (NVIDIA/NVSentinel#1748) (pure).

It takes monotonic times in seconds and keeps a bounded amount of history.
"""

from __future__ import annotations

from collections import deque

from gpuagent.health import CRITICAL, Finding

__all__ = ["ProbeHangs"]


class ProbeHangs:
    """nvidia-smi's timeouts while the nvidia module is loaded, over the last ``window`` s.

    Feed :meth:`observe` once per probe with its monotonic time, whether it timed out
    (``smi.Failure.TIMEOUT``) and whether the module was loaded; :meth:`finding` gives
    ``driver_hung`` (critical, ``reboot``, host-level) while at least ``count`` timeouts fall
    in the window.  A probe that answers does not end it (a degrading GPU hangs under load
    only, NVIDIA/NVSentinel#1748); the window does, and so does an unloaded module.
    """

    def __init__(self, count: int = 3, window: float = 3600.0) -> None:
        self.count = count
        self.window = window
        self._timeouts: deque[float] = deque(maxlen=count)

    def observe(self, now: float, *, timed_out: bool, module_loaded: bool) -> None:
        """One probe at monotonic time ``now`` (s)."""
        if not module_loaded:
            self._timeouts.clear()
        elif timed_out:
            self._timeouts.append(now)

    def finding(self, now: float) -> Finding | None:
        """``driver_hung`` at monotonic time ``now``, or ``None``."""
        recent = [t for t in self._timeouts if t > now - self.window]
        if len(recent) < self.count:
            return None
        return Finding(
            "driver_hung",
            CRITICAL,
            "reboot",
            f"nvidia-smi timed out {self.count} times within {self.window:g} s with the "
            "nvidia module loaded: the driver no longer answers",
            ends=f"{self.window:g} s after the last timeout, or when the module is unloaded",
        )
