"""The order of a tick, declared once: every source, each after those whose views it reads.

=========== ================================================ ==============================
source      reads                                            why here
=========== ================================================ ==============================
scan        the last tick's ``bus`` (what the bus had)        first: every other reads it
kernel      ``scan``; the last tick's samples, processes and whatever the probe's gates say
            ``pcie`` (its counters' rises)
bus         ``scan``, ``kernel`` (root's clears, UUIDs)       the GPUs this host had
pcie        ``bus``, ``kernel`` (its AER records, clears)     sysfs only: before any spawn
services    the last tick's samples                           before the probe: fabric
probe       ``bus``, ``kernel``, ``services``                 the gates, nvidia-smi, samples
board       ``probe`` (the answering GPUs' UUIDs)             the serials, when boards change
wear        ``probe``, ``board``, ``kernel`` (earlier boots)  once a boot: the boards' wear
driver      ``bus``, ``probe``, ``kernel``                    after the probe: its hangs
nvlink      ``bus``, ``probe``                                for the GPUs the probe answers
processes   ``probe``                                         for the GPUs the probe answers
victims     ``kernel`` (the Xids heard), ``processes``        who a critical Xid hit
vgpu        ``bus``, ``probe``                                a guest's: for the GPUs answered
imex        ``services`` (nvidia-imex's state)                the host's IMEX domain
retention   the config (the journal's directory)              the journal's reach
=========== ================================================ ==============================

The first tick's READY=1 goes after ``bus`` (:data:`READY_AFTER`): before a probe that may
hang.  An event step (news between ticks: :mod:`gpuagent.events`) runs, in the same order,
only the sources of :data:`EVENT_STEP`, which spawn nothing: those that wait on news (kernel,
services), the PCI scan (cheap, and it tells a GPU gone from the bus), ``bus`` after it,
``pcie`` (an AER record is the kernel's news), ``driver``, which judges what the kernel's
records said of the driver, and ``victims``, which takes the Xids the kernel heard; the
others' views are the last tick's.  Adding a source: one
folder under ``sources/``, one entry here, and where it has a view, one field of
:class:`gpuagent.views.Tick`, its key in the state (:mod:`gpuagent.report`) and its events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from gpuagent.config import Config
from gpuagent.logs import EventLog
from gpuagent.sources import Source
from gpuagent.sources.board.source import BoardSource
from gpuagent.sources.bus.bus import BusScan
from gpuagent.sources.bus.had import GpusHad
from gpuagent.sources.driver.source import Driver
from gpuagent.sources.imex.source import ImexSource
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.sources.kernel.source import Kernel
from gpuagent.sources.nvlink.nvlinksource import NvlinkSource
from gpuagent.sources.pcie.source import PcieSource
from gpuagent.sources.probe.probe import Prober
from gpuagent.sources.probe.probing import Probing
from gpuagent.sources.probe.samples import Samples
from gpuagent.sources.probe.source import Probe
from gpuagent.sources.probe.throttle import ThrottleWindow
from gpuagent.sources.processes.owners import PidLookup
from gpuagent.sources.processes.processes import ProcessesSource
from gpuagent.sources.retention.source import Retention
from gpuagent.sources.services.services import Reader as UnitsReader
from gpuagent.sources.services.services import ServicesSource, fm_config_text
from gpuagent.sources.services.unitlog import unit_messages
from gpuagent.sources.vgpu.source import VgpuSource
from gpuagent.sources.victims.source import VictimsSource
from gpuagent.sources.wear.source import WearSource

__all__ = ["EVENT_STEP", "READY_AFTER", "Systemd", "sources", "system_units"]

READY_AFTER = "bus"
EVENT_STEP = frozenset({"scan", "kernel", "bus", "pcie", "services", "driver", "victims"})


class Systemd(UnitsReader, PidLookup, Protocol):
    """What answers for systemd (:class:`gpuagent.edges.systemd.units.Units`): NVIDIA's
    units' states and the unit of each process on a GPU."""


def sources(
    config: Config,
    prober: Prober,
    log: EventLog,
    *,
    systemd: Systemd,
    monotonic: Callable[[], float],
    wall: Callable[[], float],
    which: Callable[[str], str | None],
    kernel_log: Callable[[str], KernelLog],
    state_directory: str | None,
    boot: str,
    absent_for: float | None = None,
    told: Iterable[tuple[str, str, int]] = (),
) -> tuple[Source, ...]:
    """Every source, in the tick's order, on the agent's injected edges; ``absent_for`` is
    how long (s) ``no_driver_module`` had held before a restart (None: it did not), ``told``
    the counted Xids' lines logged before it (:class:`~gpuagent.held.HeldProblems`)."""
    # Made in the order their files are read at start (a bad one's line comes in that order).
    scan = BusScan(config.sysfs_root, log)
    kernel = Kernel(
        config,
        log,
        open_log=kernel_log,
        wall=wall,
        monotonic=monotonic,
        told=told,
        state_directory=state_directory,
    )
    window = ThrottleWindow(config.throttle_window, config.throttle_fraction, config.interval)
    board = BoardSource(config, prober.runner, log)
    wear = WearSource(config, prober.runner, log, state_directory=state_directory, boot=boot)
    probe = Probe(
        Probing(config, prober, log, which=which, wall=wall),
        Samples(log, monotonic=monotonic, wall=wall, throttle=window),
    )
    driver = Driver(config, monotonic=monotonic, absent_for=absent_for)
    nvlink = NvlinkSource(
        config, prober.runner, log, monotonic=monotonic, state_directory=state_directory, boot=boot
    )
    services = ServicesSource(
        config.sysfs_root,
        log,
        reader=systemd,
        monotonic=monotonic,
        unit_log=lambda directory, unit: unit_messages(directory, unit, boot),
        journal_directory=config.journal_directory,
        fm_config=fm_config_text,
    )
    processes = ProcessesSource(config, prober.runner, log, lookup=systemd)
    had = GpusHad(state_directory, log, boot)
    pcie = PcieSource(config.sysfs_root, log)
    vgpu = VgpuSource(config, prober.runner, log, which=which)
    imex = ImexSource(config, prober.runner, log, which=which)
    retention = Retention(log, monotonic=monotonic)
    return (
        *(scan, kernel, had, pcie, services, probe, board, wear, driver),
        *(nvlink, processes, VictimsSource(log), vgpu, imex, retention),
    )


def system_units(ping: Callable[[], None]) -> Systemd:
    """systemd over the system bus, ``ping`` (the watchdog's) before each call."""
    from gpuagent.edges.systemd.units import Units  # noqa: PLC0415 - a run by hand needs no D-Bus

    return Units(ping=ping)
