"""The vGPU source: each GPU's licence on a vGPU guest, on its own cadence; the tick's
``vgpu``, read after the probe and only while it answers.

Only a guest reads it: one where NVIDIA's licensing daemon ``nvidia-gridd`` is installed (the
guest driver's; a stat on ``$PATH``, never a spawn), so bare metal and a plain VM cost
nothing.  There, every ``vgpu_interval`` (in whole ticks, by its
:class:`~gpuagent.edges.cadence.Cadence`) one ``nvidia-smi -q`` runs through the probe's
runner; an answer in which no GPU has a licensed product (a GRID driver on a GPU it does
not license) is learnt once per set of GPUs, and nothing more runs for it.  A failing read is
retried on the cadence's backoff; an outage is one warning and its end one line.  Its
findings (``vgpu_unlicensed``, ``vgpu_license_grace``: :mod:`gpuagent.sources.vgpu.licence`)
go to the verdict as source ``vgpu`` after each read that answered; between reads the last
ones hold, and once a gate keeps the probe off they no longer do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO, WARNING

from gpuagent.config import Config
from gpuagent.edges import smirun
from gpuagent.edges.cadence import Cadence
from gpuagent.edges.runner import Runner
from gpuagent.logs import Event, EventLog
from gpuagent.schema import ProbeState
from gpuagent.sources import Findings, Outcome, Source, partial
from gpuagent.sources.vgpu import gridd, licence
from gpuagent.views import Finding, Tick, VgpuGpu, VgpuView

__all__ = ["GRIDD", "VgpuSource"]

# The guest driver's licensing daemon: installed only where the driver licenses a GPU.
GRIDD = "nvidia-gridd"


def _cadence(config: Config) -> tuple[float, float, int, float]:
    """The read's period, the tick, the failures before the backoff and the longest gap."""
    return config.vgpu_interval, config.interval, config.backoff_after, config.retry_max


class VgpuSource(Source):
    """Reads through ``runner`` (the probe's); ``which`` finds ``nvidia-gridd`` on ``$PATH``,
    ``gridd_conf`` reads its config (the licence server, for the message)."""

    name = "vgpu"

    def __init__(
        self,
        config: Config,
        runner: Runner,
        log: EventLog,
        *,
        which: Callable[[str], str | None],
        gridd_conf: Callable[[], str | None] = gridd.read,
    ) -> None:
        self.runner = runner
        self.log = log
        self.which = which
        self.gridd_conf = gridd_conf
        self.cadence = Cadence(*_cadence(config))
        self._not_licensed: frozenset[str] | None = None
        self._view = VgpuView()

    def reset(self, old: Config, new: Config) -> None:
        """A reload: the new cadence; what was read stays."""
        self.cadence.configure(*_cadence(new))

    def expedite(self) -> None:
        self.cadence.expedite()

    @property
    def view(self) -> VgpuView:
        return self._view

    def step(self, tick: Tick) -> Outcome:
        probe = tick.probe
        if probe.gate is not None:
            return Outcome(self._view, {"vgpu": {}})
        if probe.state is not ProbeState.OK:
            return Outcome(self._view)
        slots = frozenset(partial.answering(tick.bus, probe.samples.missing))
        found = self.read(probe.binary, slots)
        return Outcome(self._view, {} if found is None else {"vgpu": found})

    def read(self, binary: str | None, slots: Iterable[str]) -> Findings | None:
        """This tick's read, when due, with nvidia-smi at ``binary`` for the GPUs at
        ``slots``; the findings by slot after a read that answered, else None (the last
        findings hold)."""
        gpus = frozenset(slots)
        if not gpus or self._not_licensed == gpus or not self.cadence.due():
            return None
        if self.which(GRIDD) is None:
            # Not a guest (or no longer one): nothing holds, and the next look is a period
            # away (a due read stays due until it starts: a stat of $PATH every tick else).
            self.cadence.start()
            return {}
        if binary is None or self.runner.busy():
            return None  # due again on the next tick
        if not self.cadence.start():
            return None
        spawns = self._view.spawns_total
        try:
            text = smirun.run(self.runner, binary, licence.ARGS)
        except smirun.Failed as e:
            self._view = VgpuView(self._view.gpus, spawns + e.spawned)
            if self.cadence.failed():
                self.log(WARNING, Event.VGPU_READ_FAILED, f"vGPU licences not read: {e}")
            return None
        self._view = VgpuView(self._view.gpus, spawns + 1)
        if text is None:
            return None  # interrupted: shutting down
        if self.cadence.succeeded():
            self.log(INFO, Event.VGPU_READ_RECOVERED, "vGPU licences read again")
        return self._judge(licence.parse(text), gpus)

    def _judge(self, read: tuple[licence.Licence, ...], gpus: frozenset[str]) -> Findings:
        # Only the GPUs on the bus that answer: a slot the answer names that is none of them
        # would be a phantom GPU, critical for a licence no GPU lacks.
        licensed = {g.slot: g for g in read if g.licensed_product and g.slot in gpus}
        if not licensed:
            self._not_licensed = gpus
        shown = {slot: VgpuGpu(g.mode, g.product, g.status) for slot, g in sorted(licensed.items())}
        self._view = VgpuView(shown, self._view.spawns_total)
        # The licence server's name is read only for a message that names it.
        unlicensed = any(not (g.status or "").startswith("Licensed") for g in licensed.values())
        server = gridd.server(self.gridd_conf()) if unlicensed else ""
        out: dict[str, list[Finding]] = {}
        for slot, g in licensed.items():
            f = licence.finding(g, server)
            if f is not None:
                out[slot] = [f]
        return out
