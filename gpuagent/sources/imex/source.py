"""The IMEX source: the IMEX domain's readiness, on its own cadence, where the host uses IMEX.

It reads only where ``nvidia-imex.service`` is enabled and running (the ``services`` view of
this tick: :func:`~gpuagent.sources.services.nvservices.imex_runs`), so a host without IMEX,
or with the unit installed and disabled (a single tray, or IMEX in Kubernetes' ComputeDomain
pods), spawns nothing; the daemon down there is ``imex_down``, the services source's.  Where
it runs, every ``imex_interval`` (in whole ticks, by its
:class:`~gpuagent.edges.cadence.Cadence`) one ``nvidia-imex-ctl -N`` runs through the probe's
runner (its timeout, its output cap).  The tool missing from ``$PATH``, failing or printing no
``Domain State`` is a failed read: retried on the cadence's backoff, an outage one warning and
its end one line, never a problem of the host or its GPUs.  Its finding
(``imex_domain_not_ready``: :mod:`gpuagent.sources.imex.domain`) goes to the verdict as source
``imex`` (the host's) after each read that answered, but for the first not ready (a domain
coming up); between reads the last one holds, and it ends once the unit no longer runs or is
disabled (while NVIDIA's units are not known, no system bus, it holds too).
"""

from __future__ import annotations

from collections.abc import Callable
from logging import INFO, WARNING

from gpuagent.config import Config
from gpuagent.edges import smirun
from gpuagent.edges.cadence import Cadence
from gpuagent.edges.runner import Runner
from gpuagent.logs import Event, EventLog
from gpuagent.sources import Findings, Outcome, Source
from gpuagent.sources.imex import domain
from gpuagent.sources.services.nvservices import IMEX, imex_runs
from gpuagent.views import Tick

__all__ = ["CTL", "ImexSource"]

CTL = "nvidia-imex-ctl"


def _cadence(config: Config) -> tuple[float, float, int, float]:
    """The read's period, the tick, the failures before the backoff and the longest gap."""
    return config.imex_interval, config.interval, config.backoff_after, config.retry_max


class ImexSource(Source):
    """Reads through ``runner`` (the probe's); ``which`` finds ``nvidia-imex-ctl`` on
    ``$PATH``.  It has no view of its own: the state shows its problem."""

    name = "imex"

    def __init__(
        self,
        config: Config,
        runner: Runner,
        log: EventLog,
        *,
        which: Callable[[str], str | None],
    ) -> None:
        self.runner = runner
        self.log = log
        self.which = which
        self.cadence = Cadence(*_cadence(config))
        self.readiness = domain.Readiness()
        self.spawns_total = 0

    def reset(self, old: Config, new: Config) -> None:
        """A reload: the new cadence; what was read stays."""
        self.cadence.configure(*_cadence(new))

    def expedite(self) -> None:
        self.cadence.expedite()

    def step(self, tick: Tick) -> Outcome:
        units = tick.services.units
        if not units:
            # NVIDIA's units not known (no system bus, or it failed): what held holds.
            return Outcome(None)
        unit = units.get(IMEX)
        if unit is None or not imex_runs(unit.file_state, unit.active_state):
            # Not used here, or its daemon down (imex_down says so): nothing holds.
            self.readiness.reset()
            return Outcome(None, {"imex": {}})
        found = self.read()
        return Outcome(None, {} if found is None else {"imex": found})

    def read(self) -> Findings | None:
        """This tick's read, when due; the host's findings after a read that answered, else
        None (the last findings hold)."""
        if not self.cadence.due() or self.runner.busy():
            return None  # a due read stays due to the next tick
        if not self.cadence.start():
            return None
        binary = self.which(CTL)
        if binary is None:
            self._failed(f"{CTL} not found on $PATH")
            return None
        try:
            text = smirun.run(self.runner, binary, domain.ARGS, name=CTL)
        except smirun.Failed as e:
            self.spawns_total += e.spawned
            self._failed(str(e))
            return None
        self.spawns_total += 1
        if text is None:
            return None  # interrupted: shutting down
        read = domain.parse(text)
        if read is None:
            self._failed(f"{CTL} -N: no Domain State in its output")
            return None
        if self.cadence.succeeded():
            self.log(INFO, Event.IMEX_READ_RECOVERED, "the IMEX domain is read again")
        found = self.readiness.update(read)
        return None if found is None else {"": found}

    def _failed(self, reason: str) -> None:
        if self.cadence.failed():
            self.log(WARNING, Event.IMEX_READ_FAILED, f"IMEX domain not read: {reason}")
