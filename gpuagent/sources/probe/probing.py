"""Whether, when and how the agent asks nvidia-smi: the gates, the backoff, the probe and the
lines an outage makes.

Each tick :meth:`Probing.step` looks at the bus: no GPU nvidia-smi could answer for, no
nvidia-smi, or the ``nvidia`` module not loaded (never autoloaded) keep the probe off; a
child stuck in the driver keeps the next one off; otherwise the probe's
:class:`~gpuagent.edges.cadence.Cadence` (every tick, and the tick-counted backoff while it
fails) says whether this tick probes.  An outage is one warning once the backoff starts and
one line when it clears; nvidia-smi or the driver going and coming back are one line each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from gpuagent.condition import Condition, Edge
from gpuagent.config import Config
from gpuagent.edges.cadence import Cadence
from gpuagent.logs import Event, EventLog
from gpuagent.schema import ProbeState
from gpuagent.sources.probe.loop import LoopSampler
from gpuagent.sources.probe.probe import Prober, ProbeResult
from gpuagent.sources.probe.smi import HINTS, classify
from gpuagent.views import BusView, Failure, Gate, ProbeView, Row, plural

__all__ = ["Probing", "gate"]

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR
# The failures that GPUs' error lines may name which are not a lost GPU.
_NOT_LOST = (Failure.PERMISSION_DENIED, Failure.BLOCKED_BY_OS)


def gate(bus: BusView, smi: str | None, load_driver: bool) -> Gate | None:
    """The gate that keeps nvidia-smi from running (pure), in the agent's order: no GPU on
    ``bus`` it could answer for, nvidia-smi not found (``smi``, its path, ``None``), the
    nvidia module not loaded (nvidia-smi would load it, unless ``load_driver``); ``None``
    where none holds."""
    if not bus.probeable:
        return Gate.NO_GPU
    if smi is None:
        return Gate.NVIDIA_SMI_MISSING
    if not bus.module_loaded and not load_driver:
        return Gate.DRIVER_NOT_LOADED
    return None


class Probing:
    """Owns the prober, its cadence and every line about nvidia-smi and the driver."""

    def __init__(
        self,
        config: Config,
        prober: Prober,
        log: EventLog,
        *,
        which: Callable[[str], str | None],
        wall: Callable[[], float],
    ) -> None:
        self.prober = prober
        self.log = log
        self.which = which
        self.wall = wall
        self.config = config
        self.cadence = Cadence(
            config.interval, config.interval, config.backoff_after, config.retry_max
        )
        self.prober.configure(config.probe_timeout)
        # The probe by spawn or by nvidia-smi's loop (sampler).
        self.sampler = LoopSampler(prober, log)
        self.sampler.configure(config.sampler, config.interval)
        self._view = ProbeView(fields=prober.fields)
        # nvidia-smi's path as the last tick's gates found it (None: not looked up, or not
        # found): the NVLink reads use the same.
        self.binary: str | None = None
        self._smi_missing: Condition[bool] = Condition()
        self._unloaded: Condition[bool] = Condition()
        self._hinted: Condition[bool] = Condition()

    def configure(self, config: Config) -> None:
        """Apply a reloaded config; the outage's failure count and the backoff survive it."""
        self.cadence.configure(
            config.interval, config.interval, config.backoff_after, config.retry_max
        )
        self.prober.configure(config.probe_timeout)
        self.sampler.configure(config.sampler, config.interval)
        self.config = config

    def expedite(self) -> None:
        """Probe on the next tick, whatever the backoff had counted ("look now")."""
        self.cadence.expedite()

    @property
    def view(self) -> ProbeView:
        """The probe's state for the report."""
        return replace(
            self._view,
            failures=self.cadence.failures,
            next_in_ticks=self.cadence.next_in_ticks,
            fields=self.prober.fields,
        )

    def step(self, bus: BusView) -> ProbeResult | None:
        """Gate, and probe if due; returns the answer of a probe that gave rows (or errors
        naming GPUs), else None.  Never raises for anything nvidia-smi does."""
        was_gated = self._view.gate is not None
        gate, path = self._gate(bus)
        self.binary = path
        if gate is None and was_gated:
            # Whatever kept the probe off has cleared (a GPU appeared, the driver or
            # nvidia-smi came back): look now, not when the old backoff says.
            self.cadence.expedite()
        # Counted on every tick, gated or not: a gate that clears looks now anyway, and the
        # ticks a stuck child holds the probe off count toward the gap.
        due = self.cadence.due() and self.cadence.start()
        if gate is not None:
            self.sampler.release()  # no nvidia-smi at all while a gate holds
            state = ProbeState.IDLE if gate is Gate.NO_GPU else ProbeState.GATED
            self._view = replace(self._view, state=state, gate=gate)
        elif self.prober.busy():
            self._view = replace(self._view, state=ProbeState.STUCK, gate=None)
        elif due and path is not None:
            result = self.sampler.probe(path)
            return None if result is None else self._apply(result, bus)
        return None

    @property
    def gated(self) -> bool:
        """Whether a gate kept the probe off on the last tick."""
        return self._view.gate is not None

    # Gates -----------------------------------------------------------------------------------

    def _gate(self, bus: BusView) -> tuple[Gate | None, str | None]:
        """The reason not to probe on this tick, if any, and nvidia-smi's path."""
        probeable = bus.probeable
        if not probeable:
            return Gate.NO_GPU, None
        path = self.which(self.config.nvidia_smi)
        edge = self._smi_missing.update(True if path is None else None)
        if edge is Edge.STARTED:
            self.log(
                WARNING,
                Event.NVIDIA_SMI_MISSING,
                f"nvidia-smi not found ({self.config.nvidia_smi!r}); GPUs are on the PCI bus "
                f"but will not be sampled until it is installed; {HINTS[Failure.NOT_FOUND]}",
            )
        elif edge is Edge.ENDED:
            self.log(INFO, Event.NVIDIA_SMI_FOUND, f"nvidia-smi found at {path}")
            self.cadence.expedite()
        if path is None:
            return gate(bus, path, self.config.load_driver), None
        edge = self._unloaded.update(None if bus.module_loaded else True)
        if edge is Edge.STARTED:
            action = (
                "probing anyway (load_driver = true)"
                if self.config.load_driver
                else "not probing (nvidia-smi would load it)"
            )
            self.log(
                WARNING,
                Event.DRIVER_UNLOADED,
                f"NVIDIA kernel module not loaded with {plural(len(probeable), 'GPU')} on the "
                f"PCI bus; {action}",
            )
        elif edge is Edge.ENDED:
            self.log(INFO, Event.DRIVER_LOADED, "NVIDIA kernel module loaded; probing now")
            self.cadence.expedite()
        return gate(bus, path, self.config.load_driver), path

    # The probe's outcome ---------------------------------------------------------------------

    def _apply(self, result: ProbeResult, bus: BusView) -> ProbeResult | None:
        view = replace(
            self._view,
            gate=None,
            spawns_total=self._view.spawns_total + result.spawns,
            probes_total=self._view.probes_total + 1,
            timed_out=result.failure is Failure.TIMEOUT,
        )
        if result.spawns:
            view = replace(view, duration=result.duration)
        self._view = view
        for field in result.rejected:
            self.log(DEBUG, None, f"nvidia-smi rejected field {field!r}; querying without it")
        if result.interrupted:
            return None
        if result.rows == [] and {g.slot for g in bus.gpus if g.driver == "nvidia"} - set(
            result.gpu_errors
        ):
            # Errors alone, and GPUs bound to nvidia that they do not name: nvidia-smi gave up
            # on every GPU after one (as its table view does), so this says nothing of the
            # others.  An outage, not one lost GPU and the rest missing.
            named = "; ".join(f"GPU {s}: {e}" for s, e in sorted(result.gpu_errors.items()))
            error = f"exit {result.exit_code}: {named}"
            # The GPUs' words say why: a handle refused for want of permission is the
            # sandbox's doing, no lost GPU.
            failure = classify(result.exit_code or 0, named)
            failure = failure if failure in _NOT_LOST else Failure.GPU_LOST
            result = replace(result, rows=None, failure=failure, error=error)
        if result.rows is None:
            self._failed(result)
            return None
        self._succeeded(result.rows, result)
        return result

    def _failed(self, result: ProbeResult) -> None:
        failure = result.failure or Failure.OTHER
        started = self.cadence.failed()
        state = ProbeState.STUCK if self.prober.busy() else ProbeState.FAILING
        self._view = replace(self._view, state=state, failure=failure, last_error=result.error)
        n = self.cadence.failures
        fields = {"failure_class": failure.value, "exit_code": result.exit_code}
        if result.detail:
            self.log(DEBUG, None, f"nvidia-smi output not understood: {result.detail!r}")
        if started and failure is Failure.VERSION_MISMATCH:
            # driver_mismatch (the driver's problem) tells this outage, and whether a reboot
            # helps: this line would say it twice, the second time without knowing.
            self.log(DEBUG, None, f"nvidia-smi failing ({failure.value}): {result.error}", **fields)
        elif started:
            self.log(
                WARNING,
                Event.failing(failure.value),
                f"nvidia-smi failing ({failure.value}): {result.error}; "
                f"{HINTS[failure]}; retrying with backoff up to every "
                f"{self.cadence.cap * self.config.interval:g} s",
                **fields,
            )
        else:
            self.log(DEBUG, None, f"probe failed ({failure.value}), failure {n}", **fields)
        if state is ProbeState.STUCK:
            self.log(
                ERROR,
                Event.PROBE_STUCK,
                "nvidia-smi did not exit after SIGKILL (stuck in the driver); no new probe "
                "until it exits",
            )

    def _succeeded(self, rows: list[Row], result: ProbeResult) -> None:
        n = self.cadence.failures
        if self.cadence.succeeded():
            if self._view.failure is Failure.VERSION_MISMATCH:  # driver_mismatch's end says it
                self.log(DEBUG, None, "nvidia-smi is answering again", failures=n)
            else:
                self.log(INFO, Event.RECOVERED, "nvidia-smi is answering again", failures=n)
        elif n:
            self.log(DEBUG, None, f"probe succeeded after {n} failures")
        self._view = replace(
            self._view,
            state=ProbeState.OK,
            failure=None,
            last_error=None,
            last_success_at=self.wall(),
        )
        for warning in result.warnings:
            self.log(DEBUG, None, f"nvidia-smi: {warning}")
        self._hint_persistence(rows, result.duration)

    def _hint_persistence(self, rows: list[Row], duration: float) -> None:
        slow = duration > self.config.probe_timeout / 2
        off = any(r.get("persistence_mode") == "Disabled" for r in rows)
        if slow and off and self._hinted.update(True) is Edge.STARTED:
            self.log(
                INFO,
                None,
                f"nvidia-smi took {duration:.1f} s of the {self.config.probe_timeout:g} s "
                "probe_timeout: without persistence mode every probe re-initialises the "
                "GPUs (NVIDIA documents 1-3 s per GPU); enable nvidia-persistenced "
                "(systemctl enable --now nvidia-persistenced)",
            )
