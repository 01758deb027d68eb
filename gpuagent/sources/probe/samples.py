"""What nvidia-smi last answered for each GPU: its sample, whether it is stale, and the GPUs
bound to nvidia that it does not report.

A GPU nvidia-smi no longer answers for keeps its last sample, stale, under its slot; one that
is handed to another driver (vfio-pci for a VM) loses it, since it is not nvidia-smi's to
answer for.  A GPU missing from nvidia-smi is a critical problem of kind ``missing``, logged
by the verdict like every other.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuagent.logs import EventLog
from gpuagent.sources.probe import rules, smi
from gpuagent.sources.probe.pages import PageRetirements
from gpuagent.sources.probe.probe import ProbeResult
from gpuagent.sources.probe.throttle import ThrottleWindow
from gpuagent.views import Finding, PciGpu, Row, Sample, SamplesView

__all__ = ["STALE_AFTER_INTERVALS", "Samples"]

# Samples older than this many intervals are stale (never shown as current); the extra half
# keeps a sample taken two grid points ago from flapping on timer jitter.
STALE_AFTER_INTERVALS = 2.5


class Samples:
    """Keeps each GPU's last sample and finds the GPUs nvidia-smi stops reporting."""

    def __init__(
        self,
        log: EventLog,
        *,
        monotonic: Callable[[], float],
        wall: Callable[[], float],
        throttle: ThrottleWindow | None = None,
    ) -> None:
        self.log = log
        # Throttling is judged over a window of samples, not one.
        self.throttle = throttle or ThrottleWindow()
        # Retired pages are judged on their count and its rise over days.
        self.pages = PageRetirements()
        self.monotonic = monotonic
        self.wall = wall
        self._samples: dict[str, Sample] = {}
        self._reported: set[str] = set()
        self._missing: list[str] = []
        self._stale: set[str] = set()

    def take(self, answer: ProbeResult, gpus: tuple[PciGpu, ...]) -> dict[str, list[Finding]]:
        """Keep a probe's rows (``answer.rows`` must be set), cross-check them against the bus
        and return everything the answer says about each GPU's health, by slot."""
        now, mono = self.wall(), self.monotonic()
        by_slot: dict[str, Row] = {}
        for row in answer.rows or []:
            key = smi.key(row)
            by_slot[key] = row
            self._samples[key] = Sample(row, now, mono)
            self.throttle.add(key, mono, rules.throttle_reasons(row))
            self.pages.add(key, mono, row)
        self._reported = set(by_slot)
        silent = self._cross_check(gpus, set(answer.gpu_errors))
        throttled = self.throttle.findings(mono)
        out = rules.smi_findings(
            by_slot, answer.requires_reset, answer.gpu_errors, answer.inforom, throttled
        )
        for slot, found in self.pages.findings(set(by_slot)).items():
            out.setdefault(slot, []).extend(found)
        for slot in silent:
            out.setdefault(slot, []).append(rules.missing_finding())
        return out

    @property
    def reported(self) -> frozenset[str]:
        """The slots the last answer reported (none while a gate holds)."""
        return frozenset(self._reported)

    @property
    def named(self) -> frozenset[str]:
        """Every slot nvidia-smi has answered for since the agent started (or forgot)."""
        return frozenset(self._samples)

    def configure(self, window: float, fraction: float, interval: float) -> None:
        """Judge throttling over ``window`` s, at ``fraction`` of the samples taken every
        ``interval`` s, from now on (:meth:`ThrottleWindow.configure`)."""
        self.throttle.configure(window, fraction, interval)

    def forget(self) -> None:
        """nvidia-smi cannot be asked (a gate holds): no sample is current any more, and the
        throttle and retired-page verdicts it gave end with its other findings; nor is any GPU
        missing from an answer that no longer holds (a reader would take it for one missing now)."""
        self._reported = set()
        self._missing = []
        self.throttle.forget()
        self.pages.forget()

    def _cross_check(self, gpus: tuple[PciGpu, ...], lost: set[str]) -> list[str]:
        """The GPUs bound to nvidia that the answer does not report and that nvidia-smi did
        not name in an error line (those are ``lost``: one problem, not two)."""
        bound = [g.slot for g in gpus if g.driver == "nvidia"]
        self._missing = [slot for slot in bound if slot not in self._reported]
        return [slot for slot in self._missing if slot not in lost]

    def mark_stale(self, gpus: tuple[PciGpu, ...], interval: float) -> SamplesView:
        """Judge each sample's age at the end of a tick of ``interval`` s; returns the view."""
        for gpu in gpus:
            if not gpu.probeable:
                self._samples.pop(gpu.slot, None)
        limit = STALE_AFTER_INTERVALS * interval
        mono = self.monotonic()
        self._stale = {
            slot
            for slot, s in self._samples.items()
            if mono - s.sampled_mono > limit or slot not in self._reported
        }
        return self.view

    @property
    def view(self) -> SamplesView:
        """The samples as of the last :meth:`mark_stale`."""
        return SamplesView(
            dict(self._samples),
            frozenset(self._reported - self._stale),
            tuple(self._missing),
        )
