"""Signs that the NVIDIA driver is being changed, so that nvidia-smi's loop lets go of it.

A loop holds ``/dev/nvidia*`` open, so the nvidia module cannot be unloaded while it runs.
Each sign alone releases it (:meth:`DriverWatch.why`, pure over what :func:`read_signs`
read this tick):

* ``nvidia-persistenced.service`` stopping, or stopped after it ran (an upgrade stops it
  first: it holds the GPUs open for the same reason);
* the installed driver (the NVML library's version) no longer the loaded module's;
* a module that held ``nvidia`` (``nvidia_uvm``, ``nvidia_drm``, ``nvidia_modeset``) gone
  while ``nvidia`` stays, or ``nvidia`` itself going (``initstate``): its users are being
  removed, the unload is under way;
* the module not loaded (the probe's gate: no nvidia-smi at all then).

The loop resumes once no sign holds: persistenced active again, the versions one, the
holders back or the module loaded afresh.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuagent.sources.driver.driver import NvmlLibrary, loaded_version
from gpuagent.sources.services.nvservices import PERSISTENCED
from gpuagent.views import ServicesView

__all__ = ["DriverSigns", "DriverWatch", "read_signs"]

_RUNNING = ("active", "activating", "reloading")


@dataclass(frozen=True)
class DriverSigns:
    """One tick's look at the driver: nvidia-persistenced's ``ActiveState`` (``None``: not
    known), the loaded and the installed driver's versions (``None``: not known), the modules
    holding ``nvidia``, whether ``nvidia`` is loaded and whether it is going away."""

    persistenced: str | None = None
    loaded: str | None = None
    installed: str | None = None
    holders: frozenset[str] = frozenset()
    module_loaded: bool = True
    going: bool = False


class DriverWatch:
    """Remembers what the signs need across ticks: whether persistenced ran, and the modules
    that held ``nvidia`` since it was loaded."""

    def __init__(self) -> None:
        self._persisted = False
        self._holders: frozenset[str] = frozenset()

    def why(self, signs: DriverSigns) -> str | None:
        """Why the loop must let go of the driver now, in words; ``None``: nothing says the
        driver is being changed."""
        if not signs.module_loaded:
            self._holders = frozenset()  # a reload starts the holders afresh
            return "the nvidia module is not loaded"
        state = signs.persistenced
        if state in _RUNNING:
            self._persisted = True
        gone = self._holders - signs.holders
        self._holders |= signs.holders
        if signs.going:
            return "the nvidia module is being unloaded"
        if self._persisted and state is not None and state not in _RUNNING:
            return f"nvidia-persistenced is {state}"
        if signs.installed and signs.loaded and signs.installed != signs.loaded:
            return f"driver {signs.installed} is installed, {signs.loaded} loaded"
        if gone:
            return f"{', '.join(sorted(gone))} unloaded from the nvidia module"
        return None


def read_signs(
    sysfs_root: str, library: NvmlLibrary, services: ServicesView, module_loaded: bool
) -> DriverSigns:
    """This tick's signs: sysfs under ``sysfs_root`` (a few small reads), the ``library``'s
    version (a few stats), NVIDIA's units as the services source last read them and whether
    the bus scan found the module loaded."""
    unit = services.units.get(PERSISTENCED)
    module = os.path.join(sysfs_root, "module", "nvidia")
    try:
        holders = frozenset(os.listdir(os.path.join(module, "holders")))
    except OSError:
        holders = frozenset()
    try:
        with open(os.path.join(module, "initstate"), "rb") as f:
            going = f.read(16).strip() == b"going"
    except OSError:
        going = False
    loaded = loaded_version(sysfs_root)
    return DriverSigns(
        persistenced=unit.active_state if unit is not None else None,
        loaded=loaded,
        installed=library.version() if loaded is not None else None,
        holders=holders,
        module_loaded=module_loaded,
        going=going,
    )
