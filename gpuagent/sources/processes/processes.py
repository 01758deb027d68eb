"""The processes source: who is on each GPU, and in which systemd unit.

After a successful probe, every ``processes_interval`` (in whole ticks; unset: every tick,
or every 3 minutes and on a tick that hears a critical Xid under ``sampler = "loop"``), one
``nvidia-smi --query-compute-apps`` runs through the probe's runner (its own process group,
its timeout); a failing read is retried on its
:class:`~gpuagent.edges.cadence.Cadence`'s backoff, counted in reads, and an outage is one
warning and its end one line.  Lines that are no process are one warning
while reads keep having them (again after a read without any).  Each process's name comes
from ``<proc_root>/<pid>/comm`` (:mod:`gpuagent.sources.processes.comm`), its unit from systemd
(:class:`gpuagent.sources.processes.owners.Owners`), which also names a process whose ``comm`` is
hidden.
Between reads the last one holds; while the processes cannot be known (the read failing,
the probe failing or gated) the view says so.  The tick's ``processes``, read after the probe
and only while it answers; a GPU missing from its answer stops only its own read (as NVLink):
its last processes are kept, stale (:mod:`gpuagent.sources.partial`).  The view also keeps
where each process was last seen on a GPU, for the next tick's Xids that name one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from logging import INFO, WARNING

from gpuagent.condition import Condition, Edge
from gpuagent.config import Config
from gpuagent.edges import smirun
from gpuagent.edges.cadence import Cadence
from gpuagent.edges.runner import Runner
from gpuagent.health import CRITICAL
from gpuagent.logs import Event, EventLog
from gpuagent.schema import ProbeState
from gpuagent.sources import Outcome, Source, partial
from gpuagent.sources.nvlink import nvlink
from gpuagent.sources.processes import apps, comm
from gpuagent.sources.processes.owners import Owners, PidLookup
from gpuagent.views import ProcessesView, ProcessView, Row, Tick

__all__ = ["LOOP_PERIOD", "ProcessesSource"]

_LINE_CHARS = 300
# The read's period (s) under nvidia-smi's loop with processes_interval unset: every 3 minutes
# (docs/sampler.md), and at once on a tick that hears a critical Xid.
LOOP_PERIOD = 180.0


def _cadence(config: Config) -> tuple[float, float, int, float]:
    """The read's period (``processes_interval``; unset: every tick, :data:`LOOP_PERIOD`
    under ``sampler = "loop"``; below a tick: every tick), the tick, the failures before the
    backoff and the longest gap."""
    unset = LOOP_PERIOD if config.sampler == "loop" else config.interval
    period = max(config.processes_interval or unset, config.interval)
    return period, config.interval, config.backoff_after, config.retry_max


class ProcessesSource(Source):
    """Reads through ``runner`` (the probe's); ``lookup`` asks systemd for each unit."""

    name = "processes"

    def __init__(self, config: Config, runner: Runner, log: EventLog, *, lookup: PidLookup):
        self.runner = runner
        self.log = log
        self.cadence = Cadence(*_cadence(config))
        self.owners = Owners(lookup)
        self.proc_root = config.proc_root
        self.on_fault = config.sampler == "loop"
        self._unreadable: Condition[str] = Condition()
        self._bus: Condition[str] = Condition()
        self._view = ProcessesView()
        self._carried: frozenset[str] = frozenset()

    def reset(self, old: Config, new: Config) -> None:
        """A reload: the new cadence and ``proc_root``; what was read and the units known
        stay."""
        config = new
        self.cadence.configure(*_cadence(config))
        self.proc_root = config.proc_root
        self.on_fault = config.sampler == "loop"

    def expedite(self) -> None:
        """Read on the next tick, whatever the cadence and the backoff had counted."""
        self.cadence.expedite()

    @property
    def view(self) -> ProcessesView:
        return self._view

    def step(self, tick: Tick) -> Outcome:
        probe = tick.probe
        if probe.gate is not None or probe.state is not ProbeState.OK:
            self.forget()
            return Outcome(self._view)
        if self.on_fault and any(h.severity == CRITICAL for h in tick.kernel.heard):
            # The victims source, next, names who was on the faulted GPU: read them now.
            self.cadence.expedite()
        # A GPU missing from the answer stops only its own read: the others go on.  One the
        # answer left out for any reason (gone from the bus too) has no current processes.
        samples = probe.samples
        missing = (*samples.missing, *sorted(set(samples.samples) - samples.fresh))
        self.read(probe.binary, [s.fields for s in probe.samples.samples.values()], missing)
        if self._view.gpus is not None:
            stale = partial.stale(self._view.gpus, self._carried, missing)
            if stale != self._view.stale:
                self._view = replace(self._view, stale=stale)
        return Outcome(self._view)

    def forget(self) -> None:
        """The processes cannot be known now (the probe failing or gated)."""
        self._view = replace(self._view, gpus=None, stale=frozenset())
        self._carried = frozenset()

    def read(self, binary: str | None, rows: Iterable[Row], missing: Iterable[str] = ()) -> None:
        """This tick's read, when due, with nvidia-smi at ``binary``; ``rows`` are the GPUs'
        last samples (each GPU's UUID to its slot), ``missing`` the GPUs the probe's answer
        left out (their last processes are kept, stale)."""
        if not self.cadence.due():
            return
        if binary is None or self.runner.busy():
            return  # due again on the next tick
        if not self.cadence.start():
            return
        spawns = self._view.spawns_total
        try:
            text = smirun.run(self.runner, binary, apps.ARGS)
        except smirun.Failed as e:
            self._failed(str(e), spawns + e.spawned)
            return
        spawns += 1
        if text is None:
            self._view = replace(self._view, spawns_total=spawns)
            return  # interrupted: shutting down
        if self.cadence.succeeded():
            self.log(INFO, Event.PROCESSES_READ_RECOVERED, "the GPUs' processes are read again")
        self._read(apps.parse(text), list(rows), spawns, frozenset(missing))

    def _failed(self, reason: str, spawns: int) -> None:
        if self.cadence.failed():
            self.log(
                WARNING, Event.PROCESSES_READ_FAILED, f"the GPUs' processes not read: {reason}"
            )
        # One failure is a blip (the last read holds); an outage is not knowing.
        gpus = None if self.cadence.outage else self._view.gpus
        self._view = replace(self._view, gpus=gpus, spawns_total=spawns)

    def _read(
        self, parsed: apps.Parsed, rows: list[Row], spawns: int, missing: frozenset[str]
    ) -> None:
        self._said(parsed.unreadable)
        slots = nvlink.slots_by_key(rows)
        found = [
            (a, comm.read(self.proc_root, a.pid), slots.get(a.gpu_uuid or "")) for a in parsed.apps
        ]
        seen = self.owners.resolve((a.pid, name, slot) for a, name, slot in found)
        self._units(self.owners.error)
        # A GPU left out of the probe's answer is left out of this read: none listed on it
        # is not "idle" (its processes are carried from the last read, stale).
        gpus: dict[str, list[ProcessView]] = {
            slot: [] for slot in slots.values() if slot not in missing
        }
        for app, _, slot in found:
            if slot is None:
                continue  # a GPU the probe did not sample: nothing to show it under
            s = seen[app.pid]
            owner = s.owner
            gpus.setdefault(slot, []).append(
                ProcessView(
                    app.pid,
                    s.name,
                    app.used_memory_mib,
                    s.unit,
                    owner.kind if owner else None,
                    owner.ref if owner else None,
                )
            )
        # Where each process was last seen, for the next tick's Xids: copied once a read.
        last = self.owners.history()
        read = {k: tuple(v) for k, v in sorted(gpus.items())}
        shown, self._carried = partial.carry(self._view.gpus or {}, read, missing)
        self._view = ProcessesView(shown, spawns, last, self._carried)

    def _said(self, unreadable: tuple[apps.Unreadable, ...]) -> None:
        """One warning when reads start having lines that are no process, naming the first;
        none while they go on, whatever the lines (their memory cell changes every read)."""
        if self._unreadable.update(unreadable[0].line if unreadable else None) is not Edge.STARTED:
            return
        first = unreadable[0]
        more = f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
        self.log(
            WARNING,
            Event.PROCESSES_UNREADABLE,
            f"nvidia-smi --query-compute-apps: cannot read the line "
            f"{first.line[:_LINE_CHARS]!r}{more}: {first.reason[:_LINE_CHARS]}; "
            "the other processes are read",
        )

    def _units(self, error: str | None) -> None:
        edge = self._bus.update(error)
        if edge is Edge.STARTED:
            self.log(
                WARNING,
                Event.PROCESS_UNITS_UNKNOWN,
                f"the systemd units of the GPUs' processes not known: {error}",
            )
        elif edge is Edge.ENDED:
            self.log(INFO, Event.PROCESS_UNITS_KNOWN, "the GPUs' processes' units known again")
