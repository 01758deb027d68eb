"""One tick: PCI scan -> kernel log -> gates -> probe -> cross-check -> health -> state.

The agent owns "log once": every condition is logged when it starts and when it ends, never
per tick.  Clock, sysfs root, the nvidia-smi lookup and the prober are injected, so tests
drive ticks by hand.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from . import __version__, pci, rules
from .backoff import Backoff, cap_ticks
from .config import Config
from .kernel import KernelSource
from .kernlog import KernelLog
from .logs import Event, EventLog
from .probe import Prober, ProbeResult, lookup
from .smi import HINTS, Failure, Row, sysfs_slot
from .state import SCHEMA
from .verdict import Verdict

__all__ = ["Agent", "Sample"]

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR
# Samples older than this many intervals are stale (never shown as current); the extra half
# keeps a sample taken two grid points ago from flapping on timer jitter.
STALE_AFTER_INTERVALS = 2.5


@dataclass(frozen=True)
class Sample:
    """One GPU's row from one probe: ``fields`` by query field name, both clocks' times (s)."""

    fields: Row
    sampled_at: float
    sampled_mono: float


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class Agent:
    """Holds what the agent knows between ticks; :meth:`tick` advances it by one tick."""

    def __init__(
        self,
        config: Config,
        prober: Prober,
        log: EventLog,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        which: Callable[[str], str | None] = lookup,
        kernel_log: Callable[[str], KernelLog] = KernelLog,
    ) -> None:
        self.prober = prober
        self.log = log
        self.monotonic = monotonic
        self.wall = wall
        self.which = which
        self.started_at = wall()
        self.ticks = 0
        self.spawns_total = 0
        self.pci: list[pci.PciGpu] = []
        self.samples: dict[str, Sample] = {}
        self.missing: list[str] = []
        self.probe_state = "idle"
        self.gate: str | None = None
        self.failure: Failure | None = None
        self.last_error: str | None = None
        self.last_success_at: float | None = None
        self.warned_outage = False
        self.on_scanned: Callable[[], None] | None = None
        self.problems: dict[str, str] = {}
        self.stale: set[str] = set()
        self._sysfs_problems: set[str] = set()
        self._warned_missing: set[str] = set()
        self._smi_path: str | None = None
        self._smi_seen: bool | None = None
        self._module: bool | None = None
        # Health: every source's findings, the slots ever on the bus, those the last probe
        # answered for, and the last probe's wall time (s).
        self.verdict = Verdict(log)
        self.tracker = self.verdict.tracker
        self.kernel = KernelSource(config.journal_directory, log, open_log=kernel_log)
        self.seen_on_bus: set[str] = set()
        self.reported: set[str] = set()
        self.probe_duration: float | None = None
        self._hinted_persistence = False
        self.config = config
        self.scanner = pci.Scanner(config.sysfs_root)
        self.backoff = Backoff(config.backoff_after, cap_ticks(config.interval, config.retry_max))
        self.prober.runner.timeout = config.probe_timeout

    def configure(self, config: Config) -> None:
        """Apply a reloaded config; counters, samples and the outage's backoff survive it."""
        if config.sysfs_root != self.config.sysfs_root:
            self.scanner = pci.Scanner(config.sysfs_root)
            # Another bus: its GPUs are new, the old ones did not leave it.
            self.seen_on_bus.clear()
        self.backoff.after = config.backoff_after
        self.backoff.cap = cap_ticks(config.interval, config.retry_max)
        self.backoff.clamp()
        self.prober.runner.timeout = config.probe_timeout
        self.kernel.configure(config.journal_directory)
        self.config = config

    # The tick ------------------------------------------------------------------------------

    def tick(self) -> None:
        """Run one tick.  Never raises for bad sysfs or nvidia-smi input."""
        self.ticks += 1
        gpus = self._scan()
        self._read_kernel(gpus)
        if self.on_scanned is not None:
            self.on_scanned()
            self.on_scanned = None
        probeable = [g for g in gpus if g.probeable]
        gate = self._gate(probeable)
        if gate is None and self.gate is not None:
            # Whatever kept the probe off has cleared (a GPU appeared, the driver or
            # nvidia-smi came back): look now, not when the old backoff says.
            self.backoff.expedite()
        due = self.backoff.due()
        if gate is not None:
            self._set_gated(gate)
        elif self.prober.busy():
            self.probe_state = "stuck"
            self.gate = None
        elif due and self._smi_path is not None:
            self._apply(self.prober.probe(self._smi_path), gpus)
        self._mark_stale()
        self.verdict.judge(
            self.wall(),
            self.pci,
            self.seen_on_bus,
            bus_listed="sysfs" not in self.problems,
            sysfs_root=self.config.sysfs_root,
            expected_gpus=self.config.expected_gpus,
        )

    def _scan(self) -> list[pci.PciGpu]:
        gpus, problems = self.scanner.scan()
        for problem in sorted(set(problems) - self._sysfs_problems):
            self.log(ERROR, Event.SYSFS_PROBLEM, problem)
        self._sysfs_problems = set(problems)
        if problems:
            self.problems["sysfs"] = "; ".join(problems)
        else:
            self.problems.pop("sysfs", None)
        new = sorted(g.slot for g in gpus if g.slot not in self.seen_on_bus)
        if new and self.ticks > 1:
            self.log(
                INFO,
                None,
                f"{_plural(len(new), 'NVIDIA GPU')} appeared on the PCI bus ({', '.join(new)}); "
                f"{len(gpus)} on it now",
            )
        self.seen_on_bus.update(new)
        self.pci = gpus
        return gpus

    def _read_kernel(self, gpus: list[pci.PciGpu]) -> None:
        # Whatever the gates say: a GPU the driver cannot reach still has its Xids.
        self.tracker.report("xid", self.kernel.poll([g.slot for g in gpus]))
        if self.kernel.error is None:
            self.problems.pop("journal", None)
        else:
            self.problems["journal"] = self.kernel.error

    def _gate(self, probeable: list[pci.PciGpu]) -> str | None:
        """The reason not to probe on this tick, if any; logs each reason's start and end."""
        if not probeable:
            return "no_gpu"
        path = self.which(self.config.nvidia_smi)
        self._smi_path = path
        if (path is not None) != self._smi_seen:
            self._log_smi_change(path)
        if path is None:
            return "nvidia_smi_missing"
        loaded = pci.module_loaded(self.config.sysfs_root)
        if loaded != self._module:
            self._log_module_change(loaded, len(probeable))
        if not loaded and not self.config.load_driver:
            return "driver_not_loaded"
        return None

    def _log_smi_change(self, path: str | None) -> None:
        first = self._smi_seen is None
        self._smi_seen = path is not None
        if path is None:
            self.log(
                WARNING,
                Event.NVIDIA_SMI_MISSING,
                f"nvidia-smi not found ({self.config.nvidia_smi!r}); GPUs are on the PCI bus "
                f"but will not be sampled until it is installed; {HINTS[Failure.NOT_FOUND]}",
            )
        elif not first:
            self.log(INFO, Event.NVIDIA_SMI_FOUND, f"nvidia-smi found at {path}")
            self.backoff.expedite()

    def _log_module_change(self, loaded: bool, count: int) -> None:
        first = self._module is None
        self._module = loaded
        if not loaded:
            action = (
                "probing anyway (load_driver = true)"
                if self.config.load_driver
                else "not probing, so that nvidia-smi does not load it during a driver upgrade"
            )
            self.log(
                WARNING,
                Event.DRIVER_UNLOADED,
                f"NVIDIA kernel module not loaded with {_plural(count, 'GPU')} on the PCI bus; "
                f"{action}",
            )
        elif not first:
            self.log(INFO, Event.DRIVER_LOADED, "NVIDIA kernel module loaded; probing now")
            self.backoff.expedite()

    def _set_gated(self, gate: str) -> None:
        self.probe_state = "idle" if gate == "no_gpu" else "gated"
        self.gate = gate
        # What nvidia-smi said no longer holds once it cannot be asked.
        self.tracker.report("smi", {})
        self.reported = set()

    # Probe outcome ---------------------------------------------------------------------------

    def _apply(self, result: ProbeResult, gpus: list[pci.PciGpu]) -> None:
        self.spawns_total += result.spawns
        self.gate = None
        if result.spawns:
            self.probe_duration = result.duration
        for field in result.rejected:
            self.log(DEBUG, None, f"nvidia-smi rejected field {field!r}; querying without it")
        if result.interrupted:
            return
        if result.rows == [] and {g.slot for g in gpus if g.driver == "nvidia"} - set(
            result.gpu_errors
        ):
            # Errors alone, and GPUs bound to nvidia that they do not name: nvidia-smi gave up
            # on every GPU after one (as its table view does), so this says nothing of the
            # others.  An outage, not one lost GPU and the rest missing.
            named = "; ".join(f"GPU {s}: {e}" for s, e in sorted(result.gpu_errors.items()))
            error = f"exit {result.exit_code}: {named}"
            result = replace(result, rows=None, failure=Failure.GPU_LOST, error=error)
        if result.rows is None:
            self._failed(result)
        else:
            self._succeeded(result.rows, gpus, result)

    def _failed(self, result: ProbeResult) -> None:
        failure = result.failure or Failure.OTHER
        self.backoff.failure()
        self.probe_state = "stuck" if self.prober.busy() else "failing"
        self.failure = failure
        self.last_error = result.error
        n = self.backoff.failures
        fields = {"failure_class": failure.value, "exit_code": result.exit_code}
        if result.detail:
            self.log(DEBUG, None, f"nvidia-smi output not understood: {result.detail!r}")
        # ">=" and the flag, not "==": a reload may move the threshold mid-outage.
        if n >= self.backoff.after and not self.warned_outage:
            self.warned_outage = True
            self.log(
                WARNING,
                Event.failing(failure.value),
                f"nvidia-smi failing ({failure.value}): {result.error}; "
                f"{HINTS[failure]}; retrying with backoff up to every "
                f"{self.backoff.cap * self.config.interval:g} s",
                **fields,
            )
        else:
            self.log(DEBUG, None, f"probe failed ({failure.value}), failure {n}", **fields)
        if self.probe_state == "stuck":
            self.log(
                ERROR,
                Event.PROBE_STUCK,
                "nvidia-smi did not exit after SIGKILL (stuck in the driver); no new probe "
                "until it exits",
            )

    def _succeeded(self, rows: list[Row], gpus: list[pci.PciGpu], result: ProbeResult) -> None:
        if self.warned_outage:
            self.log(
                INFO,
                Event.RECOVERED,
                "nvidia-smi is answering again",
                failures=self.backoff.failures,
            )
        elif self.backoff.failures:
            self.log(DEBUG, None, f"probe succeeded after {self.backoff.failures} failures")
        self.warned_outage = False
        self.backoff.success()
        self.probe_state = "ok"
        self.failure = None
        self.last_error = None
        now, mono = self.wall(), self.monotonic()
        self.last_success_at = now
        # A GPU nvidia-smi no longer answers for keeps its last sample, stale, for its UUID.
        by_slot: dict[str, Row] = {}
        for row in rows:
            bus_id = row.get("pci.bus_id")
            key = sysfs_slot(bus_id) if isinstance(bus_id, str) else f"index:{row.get('index')}"
            by_slot[key] = row
            self.samples[key] = Sample(row, now, mono)
        self.reported = set(by_slot)
        self.tracker.report(
            "smi",
            rules.smi_findings(by_slot, result.requires_reset, result.gpu_errors, result.inforom),
        )
        for warning in result.warnings:
            self.log(DEBUG, None, f"nvidia-smi: {warning}")
        self._hint_persistence(rows, result.duration)
        self._cross_check(gpus, set(result.gpu_errors))

    def _hint_persistence(self, rows: list[Row], duration: float) -> None:
        slow = duration > self.config.probe_timeout / 2
        off = any(r.get("persistence_mode") == "Disabled" for r in rows)
        if slow and off and not self._hinted_persistence:
            self._hinted_persistence = True
            self.log(
                INFO,
                None,
                f"nvidia-smi took {duration:.1f} s of the {self.config.probe_timeout:g} s "
                "probe_timeout: without persistence mode every probe re-initialises the "
                "GPUs (NVIDIA documents 1-3 s per GPU); enable nvidia-persistenced "
                "(systemctl enable --now nvidia-persistenced)",
            )

    def _cross_check(self, gpus: list[pci.PciGpu], lost: set[str]) -> None:
        # A lost GPU is missing too, but its one journal line is the "lost" problem's.
        bound = [g.slot for g in gpus if g.driver == "nvidia"]
        self.missing = [slot for slot in bound if slot not in self.reported]
        for slot in self.missing:
            if slot not in self._warned_missing and slot not in lost:
                self.log(
                    WARNING,
                    Event.GPU_MISSING,
                    f"GPU {slot} is bound to nvidia on the PCI bus but nvidia-smi does not "
                    "report it",
                    pci_slot=slot,
                )
        # One that left the bus instead is not "back": its gone_from_bus problem says so.
        for slot in sorted((self._warned_missing - set(self.missing)) & self.reported):
            self.log(
                INFO, Event.GPU_BACK, f"GPU {slot} is reported by nvidia-smi again", pci_slot=slot
            )
        self._warned_missing = set(self.missing) - lost

    def _mark_stale(self) -> None:
        # A GPU handed to another driver (vfio-pci for a VM) is not nvidia-smi's to answer for:
        # its last sample is history, not a sample gone stale.
        for gpu in self.pci:
            if not gpu.probeable:
                self.samples.pop(gpu.slot, None)
        limit = STALE_AFTER_INTERVALS * self.config.interval
        mono = self.monotonic()
        self.stale = {
            slot
            for slot, s in self.samples.items()
            if mono - s.sampled_mono > limit or slot not in self.reported
        }

    # Reporting -------------------------------------------------------------------------------

    def status_line(self) -> str:
        """The one-line sd_notify STATUS."""
        n = len(self.pci)
        if n == 0:
            return "no NVIDIA GPU on the PCI bus"
        gpus = _plural(n, "GPU")
        if self.gate == "no_gpu":
            drivers = sorted({g.driver or "none" for g in self.pci})
            return f"{gpus}, all bound to {', '.join(drivers)}; not sampled"
        if self.gate == "nvidia_smi_missing":
            return f"{gpus}, nvidia-smi not found"
        if self.gate == "driver_not_loaded":
            return f"{gpus}, NVIDIA driver not loaded; not probing"
        if self.probe_state == "stuck":
            return f"{gpus}, nvidia-smi stuck in the driver; not probing"
        if self.probe_state == "failing":
            wait = self.backoff.next_in_ticks * self.config.interval
            return f"{gpus}, nvidia-smi failing ({self.failure}), next try in {wait:g} s"
        if self.probe_state == "ok":
            return self._ok_line(gpus)
        return f"{gpus}, starting"

    def _ok_line(self, gpus: str) -> str:
        sick = sorted(self.tracker.slots())
        silent = [s for s in self.missing if s not in sick]
        missing = f", {len(silent)} missing from nvidia-smi" if silent else ""
        if not sick:
            return f"{gpus}, sampling{missing}"
        named = [f"{s or 'host'} {self.tracker.problems(s)[0].finding.name}" for s in sick[:3]]
        more = ", ..." if len(sick) > 3 else ""
        verb = "needs" if len(sick) == 1 else "need"
        return f"{gpus}, {len(sick)} {verb} attention: {', '.join(named)}{more}{missing}"

    def snapshot(self) -> dict[str, Any]:
        """The state file's content (schema :data:`gpuagent.state.SCHEMA`)."""
        gated = self.probe_state in ("gated", "idle")
        slots = [g.slot for g in self.pci]
        return {
            "schema": SCHEMA,
            "version": __version__,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "updated_at": self.wall(),
            "ticks": self.ticks,
            "interval": self.config.interval,
            "exit": None,
            "status": self.status_line(),
            "pci": [
                {"slot": g.slot, "device_id": g.device_id, "class": g.pci_class, "driver": g.driver}
                for g in self.pci
            ],
            "probe": {
                "state": self.probe_state,
                "gate": self.gate,
                "failure_class": self.failure.value if self.failure else None,
                "consecutive_failures": self.backoff.failures,
                "next_probe_in_ticks": None if gated else self.backoff.next_in_ticks,
                "spawns_total": self.spawns_total,
                "last_error": self.last_error,
                "last_success_at": self.last_success_at,
                "fields": list(self.prober.fields),
                "duration": self.probe_duration,
            },
            "gpus": self.verdict.entries(
                self.pci,
                self.seen_on_bus,
                self.samples,
                fresh=self.reported - self.stale,
                xids=self.kernel.gpu_xids(slots),
                uuids=self.kernel.xids.uuids(slots),
            ),
            "sxids": self.kernel.sxids(),
            "host_problems": [p.as_dict() for p in self.tracker.problems("")],
            "missing": self.missing,
            "problems": dict(self.problems),
        }
