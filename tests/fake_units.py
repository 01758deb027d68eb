"""A stand-in for gpuagent.edges.systemd.units.Units: the agent's units source without a system
bus."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuagent.edges.systemd.units import PidResult, Result, Unit, UnitProcess, Watch

__all__ = ["FakeUnits", "unit"]


def unit(
    name: str,
    active: str = "active",
    sub: str = "running",
    *,
    load: str = "loaded",
    result: str = "success",
    restarts: int | None = 0,
    file_state: str = "",
) -> Unit:
    return Unit(name, load, active, sub, result, restarts, file_state)


@dataclass
class FakeUnits:
    """Answers each read with ``result`` (by default: watched, no unit of NVIDIA's known to
    systemd, so no problem and no line); counts the reads.  ``pids`` is each known PID's unit,
    ``cgroups`` its control group and ``cmdlines`` its command line (as GetUnitProcesses
    lists them); ``pid_watch`` other than ``ok`` answers every PID so; ``pid_calls`` counts
    the PID lookups, ``process_calls`` those of a unit's processes."""

    result: Result = field(default_factory=lambda: Result(Watch.OK))
    reads: int = 0
    closed: bool = False
    pids: dict[int, str] = field(default_factory=dict)
    cgroups: dict[int, str] = field(default_factory=dict)
    pid_watch: Watch = Watch.OK
    cmdlines: dict[int, str] = field(default_factory=dict)
    pid_calls: int = 0
    process_calls: int = 0

    def set(self, *units: Unit) -> None:
        self.result = Result(Watch.OK, {u.name: u for u in units})

    def read(self, names: Sequence[str] = ()) -> Result:
        self.reads += 1
        return self.result

    def fileno(self) -> int | None:
        return None

    def news(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True

    def unit_for_pid(self, pid: int) -> PidResult:
        self.pid_calls += 1
        if self.pid_watch is not Watch.OK:
            error = "system bus: no answer within 2 s" if self.pid_watch is Watch.ERROR else ""
            return PidResult(self.pid_watch, error=error)
        return PidResult(Watch.OK, self.pids.get(pid))

    def process_in(self, unit: str, pid: int) -> UnitProcess | None:
        self.process_calls += 1
        if self.pids.get(pid) != unit:
            return None
        return UnitProcess(
            self.cgroups.get(pid, f"/system.slice/{unit}"), self.cmdlines.get(pid, "")
        )
