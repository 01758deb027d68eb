"""Who is on the GPUs, as a source: the tick's ``processes``, read after the probe.

Read only while the probe answers for every GPU (as NVLink); while it fails or a gate holds,
the processes cannot be known and the view says so.  The view also keeps where each process
was last seen on a GPU, for the next tick's Xids that name one.
"""

from __future__ import annotations

from dataclasses import replace

from gpuagent.config import Config
from gpuagent.edges.runner import Runner
from gpuagent.logs import EventLog
from gpuagent.schema import ProbeState
from gpuagent.sources import Outcome, Source
from gpuagent.sources.processes.owners import PidLookup
from gpuagent.sources.processes.processes import ProcessesSource
from gpuagent.views import ProcessesView, Tick

__all__ = ["Processes"]


class Processes(Source):
    """Reads through ``runner`` (the probe's); ``lookup`` asks systemd for each unit."""

    name = "processes"

    def __init__(self, config: Config, runner: Runner, log: EventLog, *, lookup: PidLookup):
        self.reader = ProcessesSource(config, runner, log, lookup=lookup)
        self._read = self.reader.view
        self._view = ProcessesView()

    def reset(self, old: Config, new: Config) -> None:
        self.reader.configure(new)

    def expedite(self) -> None:
        self.reader.expedite()

    def step(self, tick: Tick) -> Outcome:
        probe = tick.probe
        if probe.gate is not None or probe.state is not ProbeState.OK:
            self.reader.forget()
        elif not probe.samples.missing:
            self.reader.step(probe.binary, [s.fields for s in probe.samples.samples.values()])
        if self.reader.view is not self._read:
            # Copied when a read (or forgetting) made a new view, not every tick.
            self._read = self.reader.view
            self._view = replace(self._read, last_seen=self.reader.owners.history())
        return Outcome(self._view)
