"""Throttling judged over a window of samples rather than one (pure).

:class:`ThrottleWindow`: a GPU is ``throttled`` when the hardware slows it down in at least
``throttle_fraction`` of its samples over the last ``throttle_window`` seconds.  The window
is judged only on evidence: at least :data:`MIN_SAMPLES` samples, from its oldest to its newest
covering at least :data:`MIN_COVERAGE` of ``throttle_window``, with no gap between them.  While
the evidence falls short (the agent has just started, or sampling resumed after a gap) the
verdict stands as it was: nothing starts and nothing ends.  Of the evidence, the problem
holds while at least :data:`MIN_SLOWED` samples and ``throttle_fraction`` of them are slowed,
and ends on the first sample of enough evidence that leaves fewer (it also ends when the GPU
is forgotten, or nvidia-smi cannot be asked).  So a single slowed sample starts nothing,
whatever the interval and the fraction, and a single healthy one ends nothing the window
still holds against it.

A *gap* is two samples of a GPU further apart than ``max(GAP_INTERVALS * interval, window /
60)`` (:attr:`ThrottleWindow.gap`): the samples before it are dropped, the window starts over
(a reload with a new ``throttle_window`` does the same).  Where the interval is half the window
or more, no three samples fit in it: the window then stretches back to hold the last
:data:`MIN_SAMPLES` samples since the last gap, and its message gives the seconds they span.

It takes monotonic times in seconds and keeps a bounded amount of history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from gpuagent.health import WARNING
from gpuagent.sources.probe.rules import THROTTLE_BITS, throttle_fix
from gpuagent.views import Finding

__all__ = ["GAP_INTERVALS", "MIN_COVERAGE", "MIN_SAMPLES", "MIN_SLOWED", "ThrottleWindow"]


# A window's samples are kept in this many buckets, however short the interval: a GPU costs
# a few kilobytes whatever throttle_window and interval say.
_BUCKETS = 60

# The evidence a verdict needs: three samples and half the window from the oldest to the
# newest.  One sample is one read of a register; at the start (1 of 1 is "all of them") and
# after a gap (what the window held is gone) it would otherwise decide alone.
MIN_SAMPLES = 3
MIN_COVERAGE = 0.5
# However few samples the window holds (a long interval) and however low the fraction, one
# slowed sample alone is no problem.
MIN_SLOWED = 2

# A gap is longer than this many intervals between two samples, the time a sample takes to go
# stale (gpuagent.sources.probe.samples.STALE_AFTER_INTERVALS): one missed probe is no gap,
# two in a row are, and so is every outage, whatever backoff_after says: the outage starts
# with the backoff, which skips at least the next tick (gpuagent.edges.backoff), so its
# samples are 3 intervals apart or more.  The half interval keeps timer jitter from making
# one.  A hole shorter than one bucket (a 60th of the window) is below the resolution the
# window keeps, so at short intervals a slow nvidia-smi stretching a tick is no gap either.
GAP_INTERVALS = 2.5


class _Bucket:
    """Samples within one 60th of a window: the first and last one's time, how many, how many
    throttled, and the reasons seen."""

    __slots__ = ("held", "last", "reasons", "samples", "start")

    def __init__(self, now: float) -> None:
        self.start = self.last = now
        self.samples = self.held = 0
        self.reasons: set[str] = set()


class _Gpu:
    """One GPU's samples since its last gap, their totals, the verdict they last gave and the
    time of its newest sample (kept across a restart)."""

    __slots__ = ("buckets", "finding", "held", "newest", "samples")

    def __init__(self, now: float) -> None:
        self.buckets: deque[_Bucket] = deque()
        self.samples = self.held = 0
        self.finding: Finding | None = None
        self.newest = now

    def restart(self) -> None:
        """A gap: the samples go, the verdict stands."""
        self.buckets.clear()
        self.samples = self.held = 0


class ThrottleWindow:
    """Each GPU's throttle reasons over the last ``window`` seconds, sampled every
    ``interval`` seconds.

    Feed :meth:`add` once per GPU row of each probe: the slot, the monotonic time of the
    sample and :func:`gpuagent.sources.probe.rules.throttle_reasons` of the row (``[]``: not
    throttled); each sample with enough evidence in the window judges the GPU again.
    :meth:`findings` then gives ``throttled`` (warning, ``check_host``) for each GPU judged
    throttled; pass it to :func:`gpuagent.sources.probe.rules.smi_findings` as ``throttled``.
    Samples are counted in 60 buckets per window, so its edge is exact to a 60th of it.  A GPU
    with no sample in the window and a gap under way is forgotten (its problem ends).
    """

    def __init__(
        self, window: float = 600.0, fraction: float = 0.1, interval: float = 10.0
    ) -> None:
        self.window = window
        self.fraction = fraction
        self.interval = interval
        self._gpus: dict[str, _Gpu] = {}

    @property
    def gap(self) -> float:
        """Seconds between two samples of a GPU beyond which its window starts over."""
        return max(GAP_INTERVALS * self.interval, self.window / _BUCKETS)

    def configure(self, window: float, fraction: float, interval: float) -> None:
        """A reload: the new settings from the next sample on.  A new ``window`` starts every
        GPU's window over, as a gap does (its buckets were cut for the old one)."""
        if window != self.window:
            for gpu in self._gpus.values():
                gpu.restart()
        self.window, self.fraction, self.interval = window, fraction, interval

    def forget(self) -> None:
        """Every GPU's samples and verdict: nvidia-smi cannot be asked, its findings end."""
        self._gpus.clear()

    def add(self, slot: str, now: float, reasons: Iterable[str]) -> None:
        """One sample of the GPU in ``slot`` at monotonic time ``now`` (s)."""
        gpu = self._gpus.setdefault(slot, _Gpu(now))
        buckets = gpu.buckets
        if now - gpu.newest > self.gap:
            gpu.restart()
        gpu.newest = now
        if not buckets or now - buckets[-1].start >= self.window / _BUCKETS:
            buckets.append(_Bucket(now))
        bucket = buckets[-1]
        held = tuple(reasons)
        bucket.last = now
        bucket.samples += 1
        bucket.held += bool(held)
        bucket.reasons.update(held)
        gpu.samples += 1
        gpu.held += bool(held)
        self._prune(gpu, now)
        span = now - buckets[0].start
        if gpu.samples >= MIN_SAMPLES and span >= MIN_COVERAGE * self.window:
            gpu.finding = self._judge(gpu, span)

    def findings(self, now: float) -> dict[str, list[Finding]]:
        """``throttled`` by slot at monotonic time ``now``: each GPU's verdict as of its last
        sample (GPUs without a sample in the window and a gap under way are dropped)."""
        out: dict[str, list[Finding]] = {}
        for slot in list(self._gpus):
            gpu = self._gpus[slot]
            age = now - gpu.newest
            if age >= self.window and age > self.gap:
                del self._gpus[slot]
            elif gpu.finding is not None:
                out[slot] = [gpu.finding]
        return out

    def _judge(self, gpu: _Gpu, span: float) -> Finding | None:
        """The verdict of a window with enough evidence; ``span`` its oldest to newest (s)."""
        if gpu.held < max(MIN_SLOWED, self.fraction * gpu.samples):
            return None
        seen = set().union(*(b.reasons for b in gpu.buckets))
        names = [name for name, _ in THROTTLE_BITS.values() if name in seen]
        names += sorted(seen - set(names))
        return Finding(
            "throttled",
            WARNING,
            "check_host",
            f"clocks held down in {gpu.held} of {gpu.samples} samples over the last "
            f"{max(self.window, span):g} s: {', '.join(names)}; {throttle_fix(names)}",
            ends=f"when fewer than {self.fraction:.0%} of at least {MIN_SAMPLES} samples over "
            f"the last {self.window:g} s are held down",
        )

    def _prune(self, gpu: _Gpu, now: float) -> None:
        """Drop the buckets older than the window, but keep MIN_SAMPLES samples (the stretch
        for an interval of half the window or more)."""
        buckets = gpu.buckets
        while (
            buckets[0].last <= now - self.window and gpu.samples - buckets[0].samples >= MIN_SAMPLES
        ):
            old = buckets.popleft()
            gpu.samples -= old.samples
            gpu.held -= old.held
