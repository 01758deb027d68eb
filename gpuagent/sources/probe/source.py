"""nvidia-smi as a source: the tick's ``probe``, with the GPUs' samples.

The gates and the probe (:class:`Probing`), then the samples (:class:`Samples`) that an answer
brings: each GPU's row, the GPUs it does not report, every health rule on them; and the
probe's own host problems (:func:`outage`: nvidia-smi missing or failing).  Its findings
are escalated where they recur across boots (the kernel's earlier boots) and their ``fabric``
ones folded under the fabric manager's state (the services, read before).
"""

from __future__ import annotations

from dataclasses import replace

from gpuagent.config import Config
from gpuagent.health import CRITICAL
from gpuagent.schema import ProbeState
from gpuagent.sources import EVERY, Findings, Outcome, Source, Unread
from gpuagent.sources.driver.driver import NvmlLibrary
from gpuagent.sources.kernel.recurrence import recurring, swaps
from gpuagent.sources.probe.driverwatch import DriverWatch, read_signs
from gpuagent.sources.probe.outage import outage
from gpuagent.sources.probe.probing import Probing
from gpuagent.sources.probe.samples import Samples
from gpuagent.sources.services.nvservices import fold_fabric
from gpuagent.views import Gate, ProbeView, Tick, uuid_of

__all__ = ["Probe"]

# Why nvidia-smi's findings are not read again, by the gate that keeps it off.
_GATED = {
    Gate.NO_GPU: "no GPU it could answer for is on the PCI bus",
    Gate.NVIDIA_SMI_MISSING: "nvidia-smi is not found",
    Gate.DRIVER_NOT_LOADED: "the nvidia module is not loaded",
}
# The probe's states in which it read nothing.
_DARK = (ProbeState.FAILING, ProbeState.STUCK)


class Probe(Source):
    """The gates and the probe (``probing``), then what its answers bring (``samples``)."""

    name = "probe"

    def __init__(self, probing: Probing, samples: Samples) -> None:
        self.probing = probing
        self.samples = samples
        # Whether the driver is being changed, read while nvidia-smi's loop may hold it.
        self.watch = DriverWatch()
        self._library: NvmlLibrary | None = None

    def reset(self, old: Config, new: Config) -> None:
        """The outage's failure count, the backoff and the samples survive a reload."""
        self._library = None  # found again, as the driver source does
        self.probing.configure(new)
        self.samples.configure(new.throttle_window, new.throttle_fraction, new.interval)

    def expedite(self) -> None:
        self.probing.expedite()

    def standing(self) -> ProbeView:
        """After a reload: the new cap and a look now count."""
        return replace(self._view(), samples=self.samples.view)

    def close(self) -> None:
        self.probing.sampler.release()

    def step(self, tick: Tick) -> Outcome:
        gpus = tick.bus.gpus
        if tick.config.sampler == "loop":
            # Before the probe: a loop lets go of the driver in the tick a change shows.
            if self._library is None:
                self._library = NvmlLibrary(tick.config.nvml_library)
            signs = read_signs(
                tick.config.sysfs_root, self._library, tick.services, tick.bus.module_loaded
            )
            self.probing.sampler.hold(self.watch.why(signs))
            # A loop that may answer for a GPU a fresh start would call lost is started afresh.
            bus = frozenset((g.slot, g.driver) for g in tick.bus.gpus)
            fault = any(h.severity == CRITICAL for h in tick.kernel.heard)
            self.probing.sampler.verify(bus, fault)
        answer = self.probing.step(tick.bus)
        findings: dict[str, Findings] = {}
        # No read, no change: what nvidia-smi said of a GPU it cannot answer for now holds as
        # last seen; a GPU root said left for good is forgotten.
        read: dict[str, str] = dict.fromkeys(tick.bus.removed, "")
        unread: dict[str, Unread] = {}
        if self.probing.gated:
            unread["smi"] = {EVERY: _GATED[self.probing.view.gate or Gate.NO_GPU], **read}
            self.samples.forget()
        elif answer is None and self.probing.view.state in _DARK:
            state = self.probing.view
            failure = state.failure.value if state.failure else "no answer"
            why = (
                "stuck in the driver" if state.state is ProbeState.STUCK else f"failing ({failure})"
            )
            unread["smi"] = {EVERY: f"nvidia-smi {why}", **read}
        elif answer is not None:
            found = self.samples.take(answer, gpus)
            # A GPU is its board's UUID where known (a replaced board's earlier boots are
            # another board's), the driver's else nvidia-smi's.
            now = self.samples.view
            uuids = {s: u for s in found if (u := uuid_of(s, tick.kernel, now)) is not None}
            found = recurring(
                found, tick.kernel.recurrence, uuids, swaps(tick.bus, uuids, tick.now)
            )
            findings["smi"] = fold_fabric(tick.services.host, found)
            read.update(dict.fromkeys([*self.samples.reported, ""], ""))
            unread["smi"] = {EVERY: "nvidia-smi does not report it", **read}
        samples = self.samples.mark_stale(gpus, tick.config.interval)
        view = self._view()
        down = outage(view, tick.config.backoff_after) if tick.bus.probeable else []
        findings["outage"] = {"": down} if down else {}
        return Outcome(replace(view, samples=samples), findings, unread=unread)

    def _view(self) -> ProbeView:
        return replace(self.probing.view, binary=self.probing.binary)
