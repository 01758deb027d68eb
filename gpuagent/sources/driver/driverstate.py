"""The NVIDIA driver on this host as a source of facts: the module absent, a reboot pending,
the driver hung.  All three are host-level problems (slot ``""``).

Each tick :meth:`DriverState.findings` takes the bus as scanned, the probe's view and what
the kernel's records of the tick said about the driver (:class:`DriverRecords`, gathered by
:class:`~gpuagent.sources.kernel.kernel.KernelRecords`), and returns:

* ``no_driver_module`` (:class:`gpuagent.sources.driver.driver.ModuleAbsence`): GPUs have waited for
the
  nvidia module for longer than ``driver_absent_grace``, with the reasons the journal gave;
* ``reboot_pending`` (:func:`gpuagent.sources.driver.driver.reboot_pending`): the installed NVML
library is
  not the loaded module's version, or the kernel refused a client of another version;
* ``driver_hung`` (:class:`gpuagent.sources.driver.hangs.ProbeHangs`): nvidia-smi timed out three
times
  within an hour with the module loaded.

The decisions are the pure blocks'; this module holds them and their clock, and is rebuilt
from the new config on a reload.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuagent.config import Config
from gpuagent.health import Finding
from gpuagent.sources.driver.driver import (
    ModuleAbsence,
    NvmlLibrary,
    loaded_version,
    reboot_pending,
)
from gpuagent.sources.driver.hangs import ProbeHangs
from gpuagent.views import BusView, DriverRecords, ProbeView

__all__ = ["DriverState"]


class DriverState:
    """The driver's host-level problems; ``monotonic`` is the clock of the grace and hangs."""

    def __init__(self, config: Config, *, monotonic: Callable[[], float]) -> None:
        self.monotonic = monotonic
        self.absence = ModuleAbsence(config.driver_absent_grace)
        self.hangs = ProbeHangs()
        self._probes = 0
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Apply a (reloaded) config: the grace, the NVML library (found again), the sysfs
        root.  A wait for the module under way keeps its start and its reasons."""
        self.absence.grace = config.driver_absent_grace
        self.library = NvmlLibrary(config.nvml_library)
        self.sysfs_root = config.sysfs_root

    def findings(
        self, bus: BusView, probe: ProbeView, records: DriverRecords
    ) -> dict[str, list[Finding]]:
        """The host's driver problems this tick (``{"": [...]}``, empty without one)."""
        now = self.monotonic()
        if probe.probes_total != self._probes:
            self._probes = probe.probes_total
            self.hangs.observe(now, timed_out=probe.timed_out, module_loaded=bus.module_loaded)
        elif not bus.module_loaded:
            self.hangs.observe(now, timed_out=False, module_loaded=False)
        wanted = bool(bus.probeable)
        # The module as the bus scan found it: without it there is no loaded version, and
        # nothing pending (reboot_pending needs one), so neither file is looked at.
        loaded = loaded_version(self.sysfs_root) if bus.module_loaded else None
        installed = self.library.version() if loaded is not None else None
        found = [
            self.absence.update(
                now, loaded=bus.module_loaded, wanted=wanted, reasons=records.reasons
            ),
            reboot_pending(installed, loaded, records.mismatch),
            self.hangs.finding(now),
        ]
        host = [f for f in found if f is not None]
        return {"": host} if host else {}
