"""The NVIDIA driver on this host as a source of facts: the module absent, the driver not the
one installed, the driver hung.  All three are host-level problems (slot ``""``).

Each tick :meth:`DriverState.findings` takes the bus as scanned, the probe's view and what
the kernel's records of the tick said about the driver (:class:`DriverRecords`, gathered by
:class:`~gpuagent.sources.kernel.kernel.KernelRecords`), and returns:

* ``no_driver_module`` (:class:`gpuagent.sources.driver.driver.ModuleAbsence`): GPUs wait for
  the nvidia module, a warning within ``driver_absent_grace``, critical after it, with the
  reasons the journal gave;
* ``driver_mismatch`` (:func:`gpuagent.sources.driver.driver.driver_mismatch`): the installed
  NVML library is not the loaded module's version, nvidia-smi said so (exit 18), or the
  kernel refused a client of the installed version;
* ``driver_hung`` (:class:`gpuagent.sources.driver.hangs.ProbeHangs`): a probe child stuck in
  the driver with the module loaded; ``smi_timeout``: nvidia-smi timing out, a warning with
  what explains it (:mod:`gpuagent.sources.driver.slowness`).

The decisions are the pure blocks'; this module holds them and their clock, and is rebuilt
from the new config on a reload.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuagent.config import Config
from gpuagent.schema import ProbeState
from gpuagent.sources.driver import slowness
from gpuagent.sources.driver.driver import (
    ModuleAbsence,
    NvmlLibrary,
    boot_time,
    driver_mismatch,
    loaded_version,
    mismatch_evidence,
)
from gpuagent.sources.driver.hangs import ProbeHangs
from gpuagent.views import BusView, DriverRecords, Failure, Finding, Gate, ProbeView, ServicesView

__all__ = ["DriverState"]


class DriverState:
    """The driver's host-level problems; ``monotonic`` is the clock of the grace and hangs."""

    def __init__(self, config: Config, *, monotonic: Callable[[], float]) -> None:
        self.monotonic = monotonic
        self.absence = ModuleAbsence(config.driver_absent_grace)
        self.hangs = ProbeHangs(config.driver_hung_after)
        self._probes = 0
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Apply a (reloaded) config: the grace, the hangs' limit, the NVML library (found
        again), the sysfs and proc roots, the failures an outage starts after.  A wait for
        the module or a hang under way keeps its start and its reasons."""
        self.absence.grace = config.driver_absent_grace
        self.hangs.after = config.driver_hung_after
        self.library = NvmlLibrary(config.nvml_library)
        self.sysfs_root = config.sysfs_root
        self.proc_root = config.proc_root
        self.backoff_after = config.backoff_after

    def findings(
        self,
        bus: BusView,
        probe: ProbeView,
        records: DriverRecords,
        services: ServicesView | None = None,
    ) -> dict[str, list[Finding]]:
        """The host's driver problems this tick (``{"": [...]}``, empty without one);
        ``services`` (NVIDIA's units, read before) explains a slow nvidia-smi."""
        now = self.monotonic()
        probed = probe.probes_total != self._probes
        self._probes = probe.probes_total
        self.hangs.observe(
            now,
            module_loaded=bus.module_loaded,
            stuck=probe.state is ProbeState.STUCK,
            timed_out=probed and probe.timed_out,
            answered=probed and probe.state is ProbeState.OK,
            failed=probed and probe.state is ProbeState.FAILING,
        )
        wanted = bool(bus.probeable)
        hung = self.hangs.hung
        # The module as the bus scan found it: without it there is no loaded version, and
        # no mismatch (driver_mismatch needs one), so neither file is looked at.
        loaded = loaded_version(self.sysfs_root) if bus.module_loaded else None
        installed = self.library.version() if loaded is not None else None
        # nvidia-smi's exit 18 from the outage's start on, as smi_failing: a blip is none.
        refused = (
            bool(bus.probeable)
            and probe.state is ProbeState.FAILING
            and probe.failure is Failure.VERSION_MISMATCH
            and probe.failures >= self.backoff_after
        )
        evidence = mismatch_evidence(installed, loaded, records.mismatch, refused=refused)
        after = self._installed_after_boot() if evidence else None
        found = [
            self.absence.update(
                now,
                loaded=bus.module_loaded,
                wanted=wanted,
                reasons=records.reasons,
                # The gate looks for nvidia-smi before the module: without it, no line of
                # the gate's says the module is missing.
                told=probe.gate is not Gate.NVIDIA_SMI_MISSING,
            ),
            driver_mismatch(evidence, after),
            self.hangs.finding(now, self._slowness(probe, services) if hung else None),
        ]
        host = [f for f in found if f is not None]
        return {"": host} if host else {}

    def _slowness(self, probe: ProbeView, services: ServicesView | None) -> tuple[str, str] | None:
        """What explains nvidia-smi timing out (read only while it does)."""
        rows = {slot: s.fields for slot, s in probe.samples.samples.items()}
        host = services.host if services is not None else ()
        return slowness.explain(host, rows, slowness.cpu_pressure(self.sysfs_root, self.proc_root))

    def _installed_after_boot(self) -> bool | None:
        """Whether the installed NVML library was written after this boot began (a reboot
        would load it), or ``None`` where either time is unknown; read only on a mismatch."""
        written, booted = self.library.mtime(), boot_time(self.proc_root)
        if written is None or booted is None:
            return None
        return written > booted
