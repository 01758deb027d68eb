"""A hung driver: nvidia-smi stuck in the driver, or timing out for long, with the nvidia
module loaded is ``driver_hung`` (NVIDIA/nvidia-docker#377, NVIDIA/NVSentinel#1748) (pure).

It takes monotonic times in seconds and keeps a few numbers, never a history.
"""

from __future__ import annotations

from gpuagent.health import CRITICAL, WARNING
from gpuagent.views import Finding

__all__ = ["GOOD_PROBES", "ProbeHangs"]

# The normal answers in a row that end a hang: one answer between timeouts is a degrading GPU
# idle for a moment (NVIDIA/NVSentinel#1748), not a driver that answers again.
GOOD_PROBES = 3


class ProbeHangs:
    """nvidia-smi's hangs while the nvidia module is loaded: one episode at a time.

    Feed :meth:`observe` on every tick with the monotonic time and what the probe did: a
    child that outlived SIGKILL (``stuck``, the runner says so) is a hung driver at once,
    critical; a probe that timed out (and was reaped) starts a warning that turns critical
    once the episode has lasted ``after`` seconds (``Config.driver_hung_after``: a 30 s blip
    never drains).  The episode ends once nvidia-smi has answered normally
    :data:`GOOD_PROBES` probes in a row, or when the module is unloaded.
    """

    def __init__(self, after: float = 300.0) -> None:
        self.after = after
        self._since: float | None = None
        self._stuck = False
        self._timeouts = 0
        self._good = 0

    def observe(
        self,
        now: float,
        *,
        module_loaded: bool,
        stuck: bool = False,
        timed_out: bool = False,
        answered: bool = False,
        failed: bool = False,
    ) -> None:
        """The probe at monotonic time ``now`` (s): ``stuck`` (a child will not exit),
        ``timed_out`` (a probe ran out of time this tick), ``answered`` (one answered
        normally this tick), ``failed`` (one failed otherwise: the row of answers breaks);
        none: no probe this tick."""
        if not module_loaded:
            self._since, self._stuck, self._timeouts, self._good = None, False, 0, 0
            return
        if stuck or timed_out:
            self._since = now if self._since is None else self._since
            self._stuck = self._stuck or stuck
            self._timeouts += int(timed_out)
            self._good = 0
        elif answered and self._since is not None:
            self._good += 1
            if self._good >= GOOD_PROBES:
                self._since, self._stuck, self._timeouts, self._good = None, False, 0, 0
        elif failed:
            self._good = 0

    def finding(self, now: float) -> Finding | None:
        """``driver_hung`` at monotonic time ``now``, or ``None``."""
        if self._since is None:
            return None
        lasted = now - self._since
        if self._stuck:
            text = (
                "nvidia-smi did not exit after SIGKILL (stuck in the driver) with the nvidia "
                "module loaded: the driver no longer answers"
            )
        else:
            times = "once" if self._timeouts == 1 else f"{self._timeouts} times"
            text = f"nvidia-smi timed out {times} with the nvidia module loaded"
            if lasted < self.after:
                text += f"; critical once this has lasted {self.after:g} s"
            else:
                text += f" for {self.after:g} s and more: the driver no longer answers"
        critical = self._stuck or lasted >= self.after
        return Finding(
            "driver_hung",
            CRITICAL if critical else WARNING,
            "reboot",
            text,
            ends=f"once nvidia-smi has answered normally {GOOD_PROBES} probes in a row, or "
            "the nvidia module is unloaded",
        )
