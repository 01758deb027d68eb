"""An Xid 79 blamed on the GPU's PCIe path: this boot's AER records, the AER counters' rises
the PCIe source saw, and each GPU's path, resolved once it names bridges
(:func:`.aerrecord.fallen_off` decides)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpuagent.configkeys import Override
from gpuagent.sources.kernel import aerrecord
from gpuagent.views import AerHeard, XidCount, XidInfo

__all__ = ["PathBlame"]


class PathBlame:
    """Fed every kernel record in journal order (:meth:`add`); :attr:`path_of` gives a GPU's
    PCIe path, root port first (:func:`gpuagent.sources.bus.pci.path_of`), and :attr:`rose`
    the AER counters' last rise of each function (wall s, kind), as the PCIe source saw it."""

    def __init__(self) -> None:
        # The AER records read with the rest, for the PCIe source and an Xid 79's path.
        self._aer = aerrecord.Heard()
        self.path_of: Callable[[str], tuple[str, ...]] = lambda slot: ()
        self.rose: Mapping[str, tuple[float, str]] = {}
        # The GPUs' paths, each kept once it names bridges.
        self._paths: dict[str, tuple[str, ...]] = {}

    @property
    def heard(self) -> AerHeard:
        """The AER records so far (:attr:`.aerrecord.Heard.view`)."""
        return self._aer.view

    def add(self, time: float, message: str) -> None:
        """One kernel record logged at ``time`` (wall s)."""
        self._aer.add(time, message)

    def afresh(self) -> None:
        """Another journal: its AER records are read afresh (the paths stay)."""
        self._aer = aerrecord.Heard()

    def blame(self, slot: str, count: XidCount, site: Override | None) -> XidInfo | None:
        """An Xid 79 on ``slot`` blamed on its PCIe path (:func:`.aerrecord.fallen_off`), or
        None (as where the site's ``[xid]`` entry for the code, ``site``, sets its action).  A
        path of bridges, once resolved, is the slot's for the boot: a GPU fallen off the bus
        may leave sysfs after its record."""
        recent = self._aer.view.recent
        if (
            count.code != aerrecord.FALLEN_OFF
            or not (recent or self.rose)
            or (site and site.action)
        ):
            return None  # the site's action has the last word
        path = self._paths.get(slot)
        if path is None:
            path = self.path_of(slot)
            if len(path) > 1:
                self._paths[slot] = path
        return aerrecord.fallen_off(count.info, path, recent, count.first, self.rose)
