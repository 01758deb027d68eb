"""The board source: each GPU's board serial number, read beside the probe when the boards
change; the tick's ``board``, read after the probe and only while it answers.

A board is its UUID (every answer's ``uuid``) and its serial number, the one an RMA names,
which the tick's query does not ask for: one ``nvidia-smi --query-gpu=pci.bus_id,serial``
runs through the probe's runner at the first answer and whenever the answering GPUs or their
UUIDs change (a GPU back on the bus, a board replaced), never otherwise.  A failing read is
retried on the next ticks with the probe's backoff; an outage is one warning and its end one
line.  The GPUs this host had (:mod:`gpuagent.sources.bus.had`) remember the serials and say
when a slot's board was replaced.
"""

from __future__ import annotations

from logging import INFO, WARNING

from gpuagent.config import Config
from gpuagent.edges import smirun
from gpuagent.edges.cadence import Cadence
from gpuagent.edges.runner import Runner
from gpuagent.logs import Event, EventLog
from gpuagent.schema import ProbeState
from gpuagent.sources import Outcome, Source
from gpuagent.sources.board import serials
from gpuagent.views import BoardView, Tick

__all__ = ["BoardSource"]


def _cadence(config: Config) -> tuple[float, float, int, float]:
    """Every tick while a read is wanted; the probe's failures and longest gap."""
    return config.interval, config.interval, config.backoff_after, config.retry_max


class BoardSource(Source):
    """Reads through ``runner`` (the probe's)."""

    name = "board"

    def __init__(self, config: Config, runner: Runner, log: EventLog) -> None:
        self.runner = runner
        self.log = log
        self.cadence = Cadence(*_cadence(config))
        # The boards (slot, UUID) the last read that answered was for.
        self._read: frozenset[tuple[str, str | None]] | None = None
        self._view = BoardView()

    def reset(self, old: Config, new: Config) -> None:
        """A reload: the new backoff; what was read stays."""
        self.cadence.configure(*_cadence(new))

    def step(self, tick: Tick) -> Outcome:
        probe = tick.probe
        if probe.gate is not None or probe.state is not ProbeState.OK or probe.binary is None:
            return Outcome(self._view)
        boards = frozenset((s, tick.uuid(s)) for s in probe.samples.fresh)
        if not boards or boards == self._read or self.runner.busy():
            return Outcome(self._view)
        if not (self.cadence.due() and self.cadence.start()):
            return Outcome(self._view)
        try:
            text = smirun.run(self.runner, probe.binary, serials.ARGS, answers=serials.ANSWERS)
            found = serials.parse(text) if text is not None else None
        except (smirun.Failed, ValueError) as e:
            said = str(e) if isinstance(e, smirun.Failed) else f"nvidia-smi {serials.ARGS[0]}: {e}"
            if self.cadence.failed():
                self.log(
                    WARNING, Event.BOARD_READ_FAILED, f"boards' serial numbers not read: {said}"
                )
            return Outcome(self._view)
        if found is None:
            return Outcome(self._view)  # interrupted: shutting down
        if self.cadence.succeeded():
            self.log(INFO, Event.BOARD_READ_RECOVERED, "boards' serial numbers read again")
        self._read = boards
        uuids = dict(boards)
        self._view = BoardView(
            {s: (uuids.get(s), n) for s, n in sorted(found.items()) if n is not None}
        )
        return Outcome(self._view)
