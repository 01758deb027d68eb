"""NVLink as a source: the tick's ``nvlink``, read after the probe and only while it answers.

A failing or stuck nvidia-smi gets no more children, nor one that cannot reach a GPU (lost):
the read would fail for the reason already said, and the last read holds.  Once a gate keeps
the probe off, what the links said no longer holds (as for nvidia-smi's own findings).
"""

from __future__ import annotations

from collections.abc import Callable

from gpuagent.config import Config
from gpuagent.edges.runner import Runner
from gpuagent.logs import EventLog
from gpuagent.schema import ProbeState
from gpuagent.sources import Findings, Outcome, Source
from gpuagent.sources.nvlink.nvlinksource import NvlinkSource
from gpuagent.views import Tick

__all__ = ["Nvlink"]


class Nvlink(Source):
    """Reads through ``runner`` (the probe's); the links up this boot kept in
    ``state_directory``."""

    name = "nvlink"

    def __init__(
        self,
        config: Config,
        runner: Runner,
        log: EventLog,
        *,
        monotonic: Callable[[], float],
        state_directory: str | None = None,
        boot: str = "",
    ) -> None:
        self.links = NvlinkSource(
            config, runner, log, monotonic=monotonic, state_directory=state_directory, boot=boot
        )

    def reset(self, old: Config, new: Config) -> None:
        self.links.configure(new)

    def expedite(self) -> None:
        self.links.expedite()

    def step(self, tick: Tick) -> Outcome:
        probe = tick.probe
        found: Findings | None = None
        if probe.gate is not None:
            found = {}
        elif probe.state is ProbeState.OK and not probe.samples.missing:
            rows = [s.fields for s in probe.samples.samples.values()]
            slots = [g.slot for g in tick.bus.probeable]
            found = self.links.step(probe.binary, slots, rows)
        return Outcome(
            self.links.view,
            {} if found is None else {"nvlink": found},
            {"nvlink_links": self.links.links_up.error},
        )
