"""NVIDIA's units as a source: the tick's ``services``, read before the probe.

Before the probe, so that nvidia-smi's fabric findings are folded under the fabric manager's
state (the view's ``host`` findings); the persistence findings are judged on the last
samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpuagent.config import Config
from gpuagent.logs import EventLog
from gpuagent.sources import Outcome, Source
from gpuagent.sources.services.services import Reader, ServicesSource
from gpuagent.views import Tick

__all__ = ["Services"]


class Services(Source):
    """The units as ``reader`` (systemd over the system bus) reads them."""

    name = "services"

    def __init__(
        self, config: Config, log: EventLog, *, reader: Reader, monotonic: Callable[[], float]
    ) -> None:
        self.units = ServicesSource(config.sysfs_root, log, reader=reader, monotonic=monotonic)

    def reset(self, old: Config, new: Config) -> None:
        self.units.configure(new.sysfs_root)

    def close(self) -> None:
        self.units.close()

    def step(self, tick: Tick) -> Outcome:
        rows = {slot: s.fields for slot, s in tick.last.probe.samples.samples.items()}
        persistence = self.units.step(rows)
        host = self.units.host
        return Outcome(
            replace(self.units.view, host=tuple(host)),
            {"persistence": persistence, "services": {"": host}},
            {"system_bus": self.units.error},
        )
