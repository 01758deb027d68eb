"""A hung driver or a slow nvidia-smi (pure).  nvidia-smi stuck in the driver (it outlived
SIGKILL) with the nvidia module loaded is ``driver_hung`` (NVIDIA/nvidia-docker#377); timing
out is ``smi_timeout``, a warning whatever it lasts: timeouts alone are no evidence about the
driver (nvidia-smi takes 30 s instead of 2 s without nvidia-persistenced on 8-GPU A100 VMs,
Azure/aks-gpu#105; a CPU-starved agent times out as well), so they never drain
(NVIDIA/NVSentinel#1748 is the field's complaint of the opposite).

It takes monotonic times in seconds and keeps a few numbers, never a history.
"""

from __future__ import annotations

from gpuagent.health import CRITICAL, WARNING
from gpuagent.views import Finding

__all__ = ["GOOD_PROBES", "ProbeHangs"]

# The normal answers in a row that end a hang: one answer between timeouts is a degrading GPU
# idle for a moment (NVIDIA/NVSentinel#1748), not a driver that answers again.
GOOD_PROBES = 3
# What to do where nothing explains the timeouts: nvidia-smi's own time, by hand.
_UNEXPLAINED = (
    "run `time nvidia-smi` by hand: if it is slow there too, see dmesg for Xid errors; if "
    "not, raise probe_timeout"
)


class ProbeHangs:
    """nvidia-smi's hangs while the nvidia module is loaded: one episode at a time.

    Feed :meth:`observe` on every tick with the monotonic time and what the probe did: a
    child that outlived SIGKILL (``stuck``, the runner says so) is a hung driver at once,
    critical; a probe that timed out (and was reaped) starts a warning, which says so once
    the episode has lasted ``after`` seconds (``Config.driver_hung_after``) and never drains.
    The episode ends once nvidia-smi has answered normally :data:`GOOD_PROBES` probes in a
    row, or when the module is unloaded.
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

    @property
    def hung(self) -> bool:
        """Whether an episode is under way (a child stuck, or timeouts)."""
        return self._since is not None

    def finding(self, now: float, slow: tuple[str, str] | None = None) -> Finding | None:
        """At monotonic time ``now``: ``driver_hung`` (critical) for a child that outlived
        SIGKILL, the driver's own evidence; ``smi_timeout`` (a warning, never more) for
        timeouts alone, the agent's trouble: nvidia-smi too slow for ``probe_timeout``.
        ``slow`` is what explains the slowness where something does (nvidia-persistenced
        down, persistence off, a CPU-starved agent), with its action
        (:func:`gpuagent.sources.driver.slowness.explain`); None where nothing is hung."""
        if self._since is None:
            return None
        ends = (
            f"once nvidia-smi has answered normally {GOOD_PROBES} probes in a row, or the "
            "nvidia module is unloaded"
        )
        if self._stuck:
            text = (
                "nvidia-smi did not exit after SIGKILL (stuck in the driver) with the nvidia "
                "module loaded: the driver no longer answers"
            )
            return Finding("driver_hung", CRITICAL, "reboot", text, ends=ends)
        times = "once" if self._timeouts == 1 else f"{self._timeouts} times"
        text = f"nvidia-smi timed out {times} with the nvidia module loaded"
        if now - self._since >= self.after:
            text += f", for {self.after:g} s and more"
        why, action = slow or (_UNEXPLAINED, "check_host")
        text += f"; the GPUs are not read; {why}"
        return Finding("smi_timeout", WARNING, action, text, ends=ends)
