"""The wear source: each board's wear counters recorded once a boot, and their trend.

At the first answer of a boot that names a board (its UUID), one ``nvidia-smi --query-gpu``
(:mod:`gpuagent.sources.wear.counters`) reads the counters of the boards not yet recorded
this boot, through the probe's runner, after the probe and the boards' serials; the read is
one journal record (``wear_recorded``, info), its ``WEAR_BOARDS`` field each board's counters
where it offers any, with its slot, UUID and serial (:mod:`.boards`), once a boot
(:mod:`.recorded`).  A failing read is retried on the next ticks with the probe's backoff; an
outage is one warning and its end one line; a field the driver rejects is dropped from the
next read (all of them: one warning); a board whose row three answers lacked is not asked
for again in this run.  Once the kernel source has read the earlier boots (their records, by
UUID), each board's records judge its trend (:mod:`.trend`): the verdict source ``wear``.
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import INFO, WARNING

from gpuagent.config import Config
from gpuagent.edges import smirun
from gpuagent.edges.cadence import Cadence
from gpuagent.edges.runner import Runner
from gpuagent.logs import Event, EventLog
from gpuagent.schema import ProbeState
from gpuagent.sources import Findings, Outcome, Source
from gpuagent.sources.probe.smi import invalid_field
from gpuagent.sources.wear import boards, counters, trend
from gpuagent.sources.wear.recorded import Recorded
from gpuagent.views import Finding, Tick

__all__ = ["MISSES", "WearSource"]

# The answers without a board's row (nvidia-smi's error for it instead) after which this run
# asks no more for it.
MISSES = 3


def _cadence(config: Config) -> tuple[float, float, int, float]:
    """Every tick while a read is wanted; the probe's failures and longest gap."""
    return config.interval, config.interval, config.backoff_after, config.retry_max


class WearSource(Source):
    """Reads through ``runner`` (the probe's); remembers this boot's records in
    ``state_directory`` (None: a hand run, which records nothing)."""

    name = "wear"

    def __init__(
        self,
        config: Config,
        runner: Runner,
        log: EventLog,
        *,
        state_directory: str | None,
        boot: str,
    ) -> None:
        self.runner = runner
        self.log = log
        self.cadence = Cadence(*_cadence(config))
        self.recorded = Recorded(state_directory, log, boot=boot)
        # What this driver is asked: a field it rejects is dropped.
        self.fields = tuple(counters.FIELDS)
        # The reads that answered without a board's row, by its UUID.
        self._misses: dict[str, int] = {}
        # The last judgement and what it was of (the earlier records, the boards recorded,
        # the boards on the bus by slot).
        self._judged: tuple[tuple[object, int, Mapping[str, str]], Findings] | None = None

    def reset(self, old: Config, new: Config) -> None:
        """A reload: the new backoff; what was recorded stays."""
        self.cadence.configure(*_cadence(new))

    def step(self, tick: Tick) -> Outcome:
        # The board in each slot on the bus now (its UUID; "": not known), looked up once:
        # what is read, and what the judgement is of.
        uuids = {s: tick.uuid(s) or "" for s in tick.bus.slots}
        if self.recorded.enabled:
            self._record(tick, uuids)
        trouble = {"wear_records": self.recorded.error}
        if tick.kernel.wear is None:
            # The earlier boots are not read yet: what was judged (before a restart) holds.
            return Outcome(None, {}, trouble)
        return Outcome(None, {"wear": self._judge(tick.kernel.wear, uuids)}, trouble)

    def _record(self, tick: Tick, uuids: Mapping[str, str]) -> None:
        probe = tick.probe
        if probe.gate is not None or probe.state is not ProbeState.OK or probe.binary is None:
            return
        todo = {
            s: u
            for s in sorted(probe.samples.fresh)
            if (u := uuids.get(s, ""))
            and u.lower() not in self.recorded.boards
            and self._misses.get(u, 0) < MISSES
        }
        if not todo or not self.fields or self.runner.busy():
            return
        if not (self.cadence.due() and self.cadence.start()):
            return
        args = counters.args(self.fields)
        try:
            text = smirun.run(self.runner, probe.binary, args, answers=counters.ANSWERS)
            found = counters.parse(text, self.fields) if text is not None else None
        except (smirun.Failed, ValueError) as e:
            rejected = invalid_field(str(e))
            if rejected in self.fields:
                self.fields = tuple(f for f in self.fields if f != rejected)
                if not self.fields:
                    said = f"this driver rejects every wear field, the last {rejected}"
                    self.log(WARNING, Event.WEAR_READ_FAILED, f"boards' wear not read: {said}")
                return  # asked again without it, nothing counted
            said = str(e) if isinstance(e, smirun.Failed) else f"nvidia-smi {args[0]}: {e}"
            if self.cadence.failed():
                self.log(WARNING, Event.WEAR_READ_FAILED, f"boards' wear not read: {said}")
            return
        if found is None:
            return  # interrupted: shutting down
        if self.cadence.succeeded():
            self.log(INFO, Event.WEAR_READ_RECOVERED, "boards' wear read again")
        records: dict[str, tuple[str, counters.Counters]] = {}
        wore: list[boards.Board] = []
        for slot, uuid in todo.items():
            if (counts := found.get(slot)) is None:
                self._misses[uuid] = self._misses.get(uuid, 0) + 1
                continue  # not in this answer: asked again, MISSES times in all
            if counts:
                wore.append(boards.Board(slot, uuid, tick.serial(slot), counts))
            records[uuid] = (slot, counts)
        # One record a read (a host of more than BOARDS_MAX boards: a few), not one a board.
        for said, value in boards.records(wore):
            self.log(INFO, Event.WEAR_RECORDED, said, **{boards.FIELD: value})
        if records:
            self.recorded.add(records)

    def _judge(
        self, earlier: Mapping[str, tuple[Mapping[str, int], ...]], boards: Mapping[str, str]
    ) -> Findings:
        key = (earlier, len(self.recorded.boards), boards)
        if self._judged is not None and self._judged[0] == key:
            return self._judged[1]  # a tick like the last: the last judgement
        out: dict[str, list[Finding]] = {}
        for uuid, (slot, counts) in self.recorded.boards.items():
            now = boards.get(slot)
            if now is None or now.lower() not in (uuid, ""):
                continue  # gone, or another board in its slot now
            if (found := trend.rising([*earlier.get(uuid, ()), counts])) is not None:
                out.setdefault(slot, []).append(found)
        self._judged = (key, out)
        return out
