"""The probe by nvidia-smi's own loop (``sampler = "loop"``): one NVML start for many ticks.

A probe is first one spawn (:class:`~gpuagent.sources.probe.probe.Prober`: it settles the
fields this driver knows and answers at once); once it answers, the same query runs as one
long-lived child in its own process group, ``-lms <interval in ms>``, and each later probe
takes, without waiting, the newest complete sample it printed
(:class:`~gpuagent.sources.probe.blocks.Blocks`), or nothing (``None``: no news, the last
answer holds) where none came since.

The seed's semantics hold: a loop that exits, prints what cannot be parsed (or an error
instead of every row), or stalls (no sample within ``interval + probe_timeout`` of the last)
is a failed probe, with the failure and backoff a spawn's would have, and is stopped; a loop
child that outlives SIGKILL is handed to the runner as its stuck child (``driver_hung`` at
once, no child while it lives).  After two such failures the agent samples by spawn until it
exits, and says so once.  While the driver is being changed
(:class:`~gpuagent.sources.probe.driverwatch.DriverWatch`) the loop is stopped and each probe
is a spawn.  A loop that may answer for a GPU a fresh NVML start would call lost is started
afresh (:meth:`LoopSampler.verify`): when the GPUs on the PCI bus change, on a critical Xid,
and every :data:`REFRESH` s.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from gpuagent.condition import Condition, Edge
from gpuagent.edges import smirun
from gpuagent.edges.loopchild import LoopChild
from gpuagent.logs import EventLog
from gpuagent.sources.probe.blocks import Blocks
from gpuagent.sources.probe.probe import Prober, ProbeResult
from gpuagent.sources.probe.smi import classify, command
from gpuagent.views import Failure

__all__ = ["FAULT_AGE", "MISBEHAVED", "REFRESH", "LoopSampler", "loop_command"]

# Failed loops before the agent samples by spawn for the rest of its run.
MISBEHAVED = 2
# A loop may keep answering for a GPU a fresh NVML start would call lost (StatCan/aaw#1952):
# one is started afresh after this long (s), and on a critical Xid once it is this old (s),
# so an Xid storm restarts it at most once a minute (docs/sampler.md).
REFRESH = 1800.0
FAULT_AGE = 60.0
_ERROR_CHARS = 300


def loop_command(binary: str, fields: tuple[str, ...], interval: float) -> list[str]:
    """The argv of the loop: the probe's query, a sample every ``interval`` s (in ms)."""
    return [*command(binary, fields), "-lms", str(max(1, round(interval * 1000)))]


class LoopSampler:
    """Probes by spawn or by loop, as ``sampler`` says and the driver lets it."""

    def __init__(self, prober: Prober, log: EventLog, child: LoopChild | None = None) -> None:
        self.prober = prober
        self.log = log
        self.clock = prober.runner.clock
        self.child = child or LoopChild(clock=self.clock)
        self.sampler = "spawn"
        self.interval = 10.0
        self.misbehaved = 0
        self._blocks = Blocks(None, 0)
        self._since = 0.0
        self._started = 0.0
        self._bus: frozenset[tuple[str, str | None]] = frozenset()
        self._loop_bus = self._bus
        self._held: Condition[str] = Condition()

    def configure(self, sampler: str, interval: float) -> None:
        """``sampler`` (``loop`` or ``spawn``) and the interval (s) from now on; a loop of
        another interval stops (the next probe starts the new one)."""
        if (sampler, interval) != (self.sampler, self.interval):
            self.release()
        self.sampler, self.interval = sampler, interval

    @property
    def looping(self) -> bool:
        """Whether probes go to the loop now (its child may still have to start)."""
        return self.sampler == "loop" and self.misbehaved < MISBEHAVED and not self._held.holds

    def hold(self, why: str | None) -> None:
        """``why`` the driver is being changed (``None``: nothing says so): the loop lets go
        of the GPUs at once, and starts again once nothing does."""
        edge = self._held.update(why)
        if why is not None and self.child.running:
            self.release()
            self.log(
                logging.INFO,
                None,
                f"nvidia-smi's loop stopped: {why}; probing by spawn until the driver settles",
            )
        elif edge is Edge.ENDED and self.sampler == "loop":
            self.log(logging.INFO, None, "the driver has settled; nvidia-smi's loop may start")

    def verify(self, bus: frozenset[tuple[str, str | None]], fault: bool) -> None:
        """Before a probe: the GPUs on the PCI bus now (slot, bound driver) and whether this
        tick heard a critical Xid.  A loop started with other GPUs on the bus, one running
        :data:`REFRESH` s, or one :data:`FAULT_AGE` s old on a fault is stopped, no failure:
        the probe then is a spawn, a fresh NVML start, and the loop starts again after it."""
        self._bus = bus
        if not self.child.running:
            return
        age = self.clock() - self._started
        if bus != self._loop_bus:
            why = "the GPUs on the PCI bus changed"
        elif age >= REFRESH:
            why = f"it ran {REFRESH:g} s"
        elif fault and age >= FAULT_AGE:
            why = "a critical Xid"
        else:
            return
        self.release()
        self.log(logging.DEBUG, None, f"nvidia-smi's loop restarted: {why}")

    def release(self) -> None:
        """Stop the loop, if one runs; a child that outlives SIGKILL is the runner's stuck one."""
        stuck = self.child.stop(self.prober.runner.kill_grace)
        if stuck is not None:
            self.prober.runner.stuck = stuck

    def probe(self, binary: str) -> ProbeResult | None:
        """One probe of ``binary``: a spawn, or the loop's newest sample; ``None`` where the
        loop printed no new sample and has not stalled.  Never raises."""
        if not self.looping:
            self.release()
            return self.prober.probe(binary)
        if self.child.running:
            return self._read()
        result = self.prober.probe(binary)
        if result.rows and not self.prober.busy():
            return replace(result, spawns=result.spawns + self._start(binary, result))
        return result

    def _start(self, binary: str, answer: ProbeResult) -> int:
        """Start the loop after ``answer``; the processes started (0 or 1)."""
        argv = loop_command(binary, self.prober.fields, self.interval)
        error = self.child.start(argv, smirun.environment())
        if error is not None:
            self.log(logging.DEBUG, None, f"nvidia-smi's loop cannot start: {error}")
            return 0
        fields = self.prober.fields
        column = fields.index("pci.bus_id") if "pci.bus_id" in fields else None
        self._blocks = Blocks(column, len(answer.rows or ()) + len(answer.gpu_errors))
        self._since = self._started = self.clock()
        self._loop_bus = self._bus
        return 1

    def _read(self) -> ProbeResult | None:
        lines = self.child.lines()
        samples = self._blocks.feed(lines)
        if self.child.overflowed:
            return self._failed(Failure.UNPARSEABLE, "nvidia-smi's loop printed a line too long")
        if samples:
            result = self.prober.read("\n".join(samples[-1]) + "\n")
            if result.failure is not None:
                return self._failed(result.failure, result.error, result)
            self._since = self.clock()
            if not result.rows:
                # An error in place of every GPU's row: the GPUs' trouble, not the loop's;
                # the next probe asks afresh, by spawn.
                self.release()
            return result
        code = self.child.exit_code()
        if code is not None:
            text = " ".join(ln.strip() for ln in self._blocks.pending if ln.strip())
            failure = classify(code, text)
            return self._failed(failure, f"loop exit {code}: {text[:_ERROR_CHARS] or '(none)'}")
        limit = self.interval + self.prober.runner.timeout
        if self.clock() - self._since > limit:
            return self._failed(Failure.TIMEOUT, f"no sample from nvidia-smi's loop in {limit:g} s")
        return None

    def _failed(
        self, failure: Failure, error: str, result: ProbeResult | None = None
    ) -> ProbeResult:
        """The loop misbehaved: stop it, count it, and say so once where it is the last."""
        self.release()
        if self.prober.busy():
            error += "; it did not exit after SIGKILL"
        self.misbehaved += 1
        if self.misbehaved == MISBEHAVED:
            self.log(
                logging.WARNING,
                None,
                f"nvidia-smi's loop failed {MISBEHAVED} times ({failure.value}: {error}); "
                "probing by spawn until the agent restarts",
            )
        base = result or ProbeResult()
        return replace(base, rows=None, failure=failure, error=error, spawns=0)
