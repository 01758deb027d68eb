"""The driver's state as a source: its host-level problems, after the probe.

From the bus (the module loaded or not, GPUs waiting for it), the probe (its hangs) and what
the kernel's records said of the driver (:class:`DriverState`); it has no view of its own.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuagent.config import Config
from gpuagent.sources import Outcome, Source
from gpuagent.sources.driver.driverstate import DriverState
from gpuagent.views import Tick

__all__ = ["Driver"]


class Driver(Source):
    """``monotonic`` is the clock of the module's grace and of the hangs; ``absent_for``
    how long (s) ``no_driver_module`` had held before a restart (None: it did not)."""

    name = "driver"

    def __init__(
        self, config: Config, *, monotonic: Callable[[], float], absent_for: float | None = None
    ) -> None:
        self.state = DriverState(config, monotonic=monotonic)
        if absent_for is not None:
            self.state.absence.resume(monotonic(), absent_for)

    def reset(self, old: Config, new: Config) -> None:
        self.state.configure(new)

    def step(self, tick: Tick) -> Outcome:
        return Outcome(
            findings={
                "driver": self.state.findings(
                    tick.bus, tick.probe, tick.kernel.driver, tick.services
                )
            }
        )
