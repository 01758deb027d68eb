"""Throttling judged over a window of samples rather than one (pure).

:class:`ThrottleWindow`: a GPU is ``throttled`` when the hardware slows it down in at least
``throttle_fraction`` of its samples over the last ``throttle_window`` seconds, so that a
single sample's slowdown neither starts nor ends a problem.  It takes monotonic times in
seconds and keeps a bounded amount of history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from gpuagent.health import WARNING, Finding
from gpuagent.sources.probe.rules import THROTTLE_BITS

__all__ = ["ThrottleWindow"]


# A window's samples are kept in this many buckets, however short the interval: a GPU costs
# a few kilobytes whatever throttle_window and interval say.
_BUCKETS = 60


class _Bucket:
    """Samples within one 60th of a window: the last one's time, how many, how many
    throttled, and the reasons seen."""

    __slots__ = ("held", "last", "reasons", "samples", "start")

    def __init__(self, now: float) -> None:
        self.start = self.last = now
        self.samples = self.held = 0
        self.reasons: set[str] = set()


class ThrottleWindow:
    """Each GPU's throttle reasons over the last ``window`` seconds.

    Feed :meth:`add` once per GPU row of each probe: the slot, the monotonic time of the
    sample and :func:`gpuagent.sources.probe.rules.throttle_reasons` of the row (``[]``: not
    throttled).
    :meth:`findings` then gives ``throttled`` (warning, ``check_host``) for each GPU whose
    throttled samples are at least ``fraction`` of its samples in the window; pass it to
    :func:`gpuagent.sources.probe.rules.smi_findings` as ``throttled``.  Samples are counted in 60
    buckets
    per window, so its edge is exact to a 60th of it.  A GPU with no sample in the window is
    forgotten.
    """

    def __init__(self, window: float = 600.0, fraction: float = 0.1) -> None:
        self.window = window
        self.fraction = fraction
        self._width = window / _BUCKETS
        self._buckets: dict[str, deque[_Bucket]] = {}

    def add(self, slot: str, now: float, reasons: Iterable[str]) -> None:
        """One sample of the GPU in ``slot`` at monotonic time ``now`` (s)."""
        buckets = self._buckets.setdefault(slot, deque())
        self._prune(buckets, now)
        if not buckets or now - buckets[-1].start >= self._width:
            buckets.append(_Bucket(now))
        bucket = buckets[-1]
        held = tuple(reasons)
        bucket.last = now
        bucket.samples += 1
        bucket.held += bool(held)
        bucket.reasons.update(held)

    def findings(self, now: float) -> dict[str, list[Finding]]:
        """``throttled`` by slot at monotonic time ``now``, from the samples of the last
        ``window`` seconds (older ones are dropped)."""
        out: dict[str, list[Finding]] = {}
        for slot in list(self._buckets):
            buckets = self._buckets[slot]
            self._prune(buckets, now)
            if not buckets:
                del self._buckets[slot]
                continue
            samples = sum(b.samples for b in buckets)
            held = sum(b.held for b in buckets)
            if not held or held < self.fraction * samples:
                continue
            seen = set().union(*(b.reasons for b in buckets))
            names = [name for name in THROTTLE_BITS.values() if name in seen]
            names += sorted(seen - set(names))
            out[slot] = [
                Finding(
                    "throttled",
                    WARNING,
                    "check_host",
                    f"clocks held down in {held} of {samples} samples over the last "
                    f"{self.window:g} s: {', '.join(names)}",
                    ends=f"when fewer than {self.fraction:.0%} of the last {self.window:g} s' "
                    "samples are held down",
                )
            ]
        return out

    def _prune(self, buckets: deque[_Bucket], now: float) -> None:
        while buckets and buckets[0].last <= now - self.window:
            buckets.popleft()
