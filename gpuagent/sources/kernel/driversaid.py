"""What this boot's records say about the driver, as the kernel source reads them: each GPU's
cause (the driver's own words on why it could not take it), why the module is absent (the
kernel's records and the module loaders'), and the latest API-mismatch record."""

from __future__ import annotations

from collections.abc import Mapping

from gpuagent.sources.driver.driver import absence_reason, api_mismatch, loader_reason
from gpuagent.sources.kernel.drivercatalog import Cause, Causes
from gpuagent.views import ApiMismatch, DriverRecords

__all__ = ["DriverSaid"]


class DriverSaid:
    """Fed the kernel's records (:meth:`add`) and the module loaders' (:meth:`loader`) in
    journal order."""

    def __init__(self) -> None:
        # The driver's own words on why it could not take each GPU (its init failures').
        self._causes = Causes()
        self._reasons: list[str] = []
        self._mismatch: ApiMismatch | None = None

    @property
    def by_slot(self) -> Mapping[str, Cause]:
        """Each GPU's cause, by slot (:attr:`.drivercatalog.Causes.by_slot`)."""
        return self._causes.by_slot

    def add(self, message: str) -> None:
        """One kernel record's ``message``."""
        self._causes.add(message)
        reason = absence_reason(message)
        if reason is not None:
            self._reasons.append(reason)
        mismatch = api_mismatch(message)
        if mismatch is not None:
            self._mismatch = mismatch

    def loader(self, message: str) -> None:
        """One module loader's record: modprobe's and systemd-modules-load's words say why the
        module is not there, and nothing else (never an Xid: only the kernel's records are
        the driver's)."""
        reason = loader_reason(message)
        if reason is not None:
            self._reasons.append(reason)

    def afresh(self) -> None:
        """Another journal: its causes and its API mismatch are read afresh (the absence
        reasons read stay to be handed on)."""
        self._causes = Causes()
        self._mismatch = None

    def records(self) -> DriverRecords:
        """What the records read since the last call said about the driver (for
        :class:`~gpuagent.sources.driver.driverstate.DriverState`): the absence reasons, and the
        boot's latest API-mismatch record."""
        reasons, self._reasons = self._reasons, []
        return DriverRecords(tuple(reasons), self._mismatch)
