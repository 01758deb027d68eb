"""The services source: NVIDIA's systemd units, read from systemd over D-Bus every tick; the
tick's ``services``, read before the probe (so that nvidia-smi's fabric findings are folded
under the fabric manager's state: the view's ``host`` findings).

Owns the connection (:class:`gpuagent.edges.systemd.units.Units`), the NVSwitch list, the
fabric manager's restart watch and what its journal said when it stopped (``unit_log``, read
once per change of its state while it is down and NVSwitches need it: a version the driver
refuses), and says once that the units are not watched (no system bus socket), or once per
outage that the bus fails (then ``error`` is the state's ``system_bus`` trouble).  Its findings
go to the verdict: the host's (``fabricmanager_down`` or ``fabricmanager_mismatch``,
``fabricmanager_flapping``, ``fabricmanager_restarted`` (until root's clear, which the kernel
source reads), ``persistenced_down``, ``imex_down``) as source ``services``, each GPU's
``persistence_off`` (judged on the last tick's samples) as ``persistence``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from logging import INFO, WARNING
from typing import Protocol

from gpuagent.condition import Condition, Edge
from gpuagent.config import Config
from gpuagent.edges.safefile import read_regular
from gpuagent.edges.systemd.units import Result, Watch
from gpuagent.logs import Event, EventLog
from gpuagent.sources import EVERY, Outcome, Source
from gpuagent.sources.bus import pci
from gpuagent.sources.services import nvservices
from gpuagent.views import Finding, Row, ServicesView, Tick, UnitView

__all__ = ["Reader", "ServicesSource", "fm_config_text"]

# The most of the fabric manager's config read (the shipped one is under 8 KiB).
_FM_CONFIG_MAX = 256 * 1024


def fm_config_text(path: str = nvservices.FM_CONFIG) -> str | None:
    """The text of the fabric manager's config, or None where it cannot be read (not
    installed: bare metal, its default mode)."""
    try:
        return read_regular(path, _FM_CONFIG_MAX).decode("utf-8", "replace")
    except OSError:
        return None


class Reader(Protocol):
    """What reads the units (:class:`gpuagent.edges.systemd.units.Units`; tests give a fake)."""

    def read(self, names: Sequence[str] = ...) -> Result: ...

    def fileno(self) -> int | None: ...

    def news(self) -> bool: ...

    def close(self) -> None: ...


class ServicesSource(Source):
    """NVIDIA's units as ``reader`` (systemd over the system bus) reads them."""

    name = "services"

    def __init__(
        self,
        sysfs_root: str,
        log: EventLog,
        *,
        reader: Reader,
        monotonic: Callable[[], float],
        unit_log: Callable[[str, str], list[str]] | None = None,
        journal_directory: str = "",
        fm_config: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.log = log
        self.reader = reader
        # A unit's journal records of this boot (unitlog.unit_messages: the journal directory,
        # "" the system journal, and the unit); None: not read.
        self.unit_log = unit_log
        self.journal_directory = journal_directory
        # The fabric manager's config text (nvservices.FM_CONFIG; None: not read), read once
        # per restart of it: whether that restart resumes its fabric.
        self.fm_config = fm_config
        self._fm_resumes: tuple[float, bool] | None = None
        self._fm_seen: tuple[object, ...] | None = None
        self._fm_mismatch: tuple[str, str] | None = None
        self.monotonic = monotonic
        self.sysfs_root = sysfs_root
        self.nvswitches = pci.nvswitches(sysfs_root)[0]
        self.flapping = nvservices.RestartWatch()
        self.host: list[Finding] = []
        self.error: str | None = None
        self._failing: Condition[bool] = Condition()
        self._not_watched = False
        self._view = ServicesView({})

    def reset(self, old: Config, new: Config) -> None:
        self.journal_directory = new.journal_directory
        if new.sysfs_root != self.sysfs_root:
            self.sysfs_root = new.sysfs_root
            self.nvswitches = pci.nvswitches(new.sysfs_root)[0]

    def step(self, tick: Tick) -> Outcome:
        rows = {slot: s.fields for slot, s in tick.last.probe.samples.samples.items()}
        # Root's clear of the host's fabricmanager_restarted (the kernel source reads clears).
        clear = tick.kernel.cleared.get("")
        cleared = clear.at if clear is not None and clear.kind == nvservices.RESTARTED else None
        persistence = self.read(rows, cleared)
        view = replace(self._view, host=tuple(self.host))
        if self.error is not None:
            # A read that failed is no unit state: what the units were holds as last seen.
            dark = {EVERY: f"systemd's units not read: {self.error}"}
            trouble = {"system_bus": self.error}
            return Outcome(view, trouble=trouble, unread={"persistence": dark, "services": dark})
        return Outcome(
            view,
            {"persistence": persistence, "services": {"": self.host}},
            {"system_bus": self.error},
        )

    def waits_on(self) -> int | None:
        return self.reader.fileno()

    def news(self) -> bool:
        return self.reader.news()

    @property
    def view(self) -> ServicesView:
        return self._view

    def read(
        self, rows: Mapping[str, Row], cleared: float | None = None
    ) -> dict[str, list[Finding]]:
        """Read the units; sets the host's findings and returns each GPU's (by slot; ``rows``
        the GPUs' last samples; ``cleared``: when root last cleared ``fabricmanager_restarted``,
        wall s)."""
        result = self.reader.read(nvservices.UNITS)
        self._edges(result)
        if result.watch is Watch.ERROR:
            return {}
        units = result.units if result.watch is Watch.OK else {}
        self._view = ServicesView(
            {
                name: UnitView(
                    u.load_state, u.active_state, u.sub_state, u.result, u.n_restarts, u.file_state
                )
                for name, u in units.items()
            }
        )
        fm = units.get(nvservices.FABRICMANAGER)
        pd = units.get(nvservices.PERSISTENCED)
        mismatch = self._mismatch(fm)
        if mismatch is not None:
            # Restarts of a version the driver refuses are that one cause, said once, and no
            # flapping once the matching version runs: the watch starts over from them.
            self.flapping = nvservices.RestartWatch()
        flapping = self.flapping.update(self.monotonic(), fm.n_restarts if fm else None)
        self.host = [
            *nvservices.fabricmanager_findings(self.nvswitches, fm, mismatch),
            *nvservices.fabricmanager_rerun_findings(
                self.nvswitches, fm, resumes=self._resumes(fm), cleared=cleared
            ),
            *(flapping if mismatch is None else []),
            *nvservices.persistenced_findings(pd),
            *nvservices.imex_findings(units.get(nvservices.IMEX)),
        ]
        return nvservices.persistence_findings(rows, pd)

    def _resumes(self, fm: nvservices.UnitFacts | None) -> bool:
        """Whether the fabric manager's restart resumes its fabric (its config says so), read
        once per restart, and only where it restarted with NVSwitches that need it."""
        if fm is None or fm.rerun is None or not self.nvswitches:
            return False
        if self._fm_resumes is None or self._fm_resumes[0] != fm.rerun:
            self._fm_resumes = (fm.rerun, nvservices.fm_resumes(self.fm_config()))
        return self._fm_resumes[1]

    def _mismatch(self, fm: nvservices.UnitFacts | None) -> tuple[str, str] | None:
        """The versions of the driver's refusal of the fabric manager, from its journal, read
        again only when its state changed; None while it runs or nothing needs it."""
        if fm is None or fm.running or not self.nvswitches or self.unit_log is None:
            self._fm_seen, self._fm_mismatch = None, None
            return None
        seen = (fm.load_state, fm.active_state, fm.sub_state, fm.result, fm.n_restarts)
        if seen != self._fm_seen:
            self._fm_seen = seen
            said = self.unit_log(self.journal_directory, nvservices.FABRICMANAGER)
            self._fm_mismatch = nvservices.fm_mismatch(said)
        return self._fm_mismatch

    def close(self) -> None:
        """Close the connection to the system bus (the agent's end)."""
        self.reader.close()

    def _edges(self, result: Result) -> None:
        if result.watch is Watch.NOT_WATCHED and not self._not_watched:
            self._not_watched = True
            self.log(
                INFO, Event.SYSTEM_BUS_MISSING, "no system bus: NVIDIA's units are not watched"
            )
        failing = result.watch is Watch.ERROR
        self.error = result.error if failing else None
        edge = self._failing.update(True if failing else None)
        if edge is Edge.STARTED:
            self.log(WARNING, Event.SYSTEM_BUS_FAILED, f"NVIDIA's units not read: {result.error}")
        elif edge is Edge.ENDED:
            self.log(INFO, Event.SYSTEM_BUS_RECOVERED, "NVIDIA's units read again")
