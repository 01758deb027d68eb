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
from gpuagent.sources import Findings, Outcome, Source
from gpuagent.sources.kernel.recurrence import recurring, swaps
from gpuagent.sources.probe.outage import outage
from gpuagent.sources.probe.probing import Probing
from gpuagent.sources.probe.samples import Samples
from gpuagent.sources.services.nvservices import fold_fabric
from gpuagent.views import ProbeView, Tick, uuid_of

__all__ = ["Probe"]


class Probe(Source):
    """The gates and the probe (``probing``), then what its answers bring (``samples``)."""

    name = "probe"

    def __init__(self, probing: Probing, samples: Samples) -> None:
        self.probing = probing
        self.samples = samples

    def reset(self, old: Config, new: Config) -> None:
        """The outage's failure count, the backoff and the samples survive a reload."""
        self.probing.configure(new)
        self.samples.configure(new.throttle_window, new.throttle_fraction, new.interval)

    def expedite(self) -> None:
        self.probing.expedite()

    def standing(self) -> ProbeView:
        """After a reload: the new cap and a look now count."""
        return replace(self._view(), samples=self.samples.view)

    def step(self, tick: Tick) -> Outcome:
        gpus = tick.bus.gpus
        answer = self.probing.step(tick.bus)
        findings: dict[str, Findings] = {}
        if self.probing.gated:
            # What nvidia-smi said no longer holds once it cannot be asked.
            findings["smi"] = {}
            self.samples.forget()
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
        samples = self.samples.mark_stale(gpus, tick.config.interval)
        view = self._view()
        down = outage(view, tick.config.backoff_after) if tick.bus.probeable else []
        findings["outage"] = {"": down} if down else {}
        return Outcome(replace(view, samples=samples), findings)

    def _view(self) -> ProbeView:
        return replace(self.probing.view, binary=self.probing.binary)
