"""A stand-in for gpuagent.units.Units: the agent's units source without a system bus."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuagent.units import Result, Unit, Watch

__all__ = ["FakeUnits", "unit"]


def unit(
    name: str,
    active: str = "active",
    sub: str = "running",
    *,
    load: str = "loaded",
    result: str = "success",
    restarts: int | None = 0,
) -> Unit:
    return Unit(name, load, active, sub, result, restarts)


@dataclass
class FakeUnits:
    """Answers each read with ``result`` (by default: watched, no unit of NVIDIA's known to
    systemd, so no problem and no line); counts the reads."""

    result: Result = field(default_factory=lambda: Result(Watch.OK))
    reads: int = 0
    closed: bool = False

    def set(self, *units: Unit) -> None:
        self.result = Result(Watch.OK, {u.name: u for u in units})

    def read(self, names: Sequence[str] = ()) -> Result:
        self.reads += 1
        return self.result

    def close(self) -> None:
        self.closed = True
