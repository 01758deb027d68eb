"""The GPUs this host had, as a source: the tick's ``bus``, the scan with what it remembers.

Its view is the scan (:mod:`gpuagent.sources.bus.bus`) with every slot seen on the bus since
the agent started, those that did not come back after a reboot, and since when the missing
ones are missing, less those root said left for good (``gpuagent clear --gone``, read by the
kernel source).  It keeps them across restarts in ``$STATE_DIRECTORY``
(:class:`gpuagent.sources.bus.known.KnownGpus`), and hands its view to the next tick's scan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gpuagent.logs import EventLog
from gpuagent.sources import Outcome, Source
from gpuagent.sources.bus.known import Gpu, KnownGpus
from gpuagent.views import BusView, Tick

__all__ = ["GpusHad"]


class GpusHad(Source):
    """The GPUs remembered in ``directory`` (``None``: none are), ``boot`` this boot's id."""

    name = "bus"

    def __init__(self, directory: str | None, log: EventLog, boot: str) -> None:
        self.known = KnownGpus(directory, log, boot)
        self._stepped = False

    def standing(self) -> BusView | None:
        """Before the first tick, what the bus had before this agent started (its first
        scan's memory)."""
        if self._stepped:
            return None
        return BusView(
            seen=frozenset(self.known.gpus),
            not_back=frozenset(self.known.not_back),
            gone_since=self.known.gone_since,
            removed=dict(self.known.removed),
        )

    def step(self, tick: Tick) -> Outcome:
        self._stepped = True
        bus = tick.scan
        gone = tick.kernel.forgotten
        if gone:
            self.known.forget(gone, tick.config.expected_gpus)
            bus = _forget(bus, gone)
        rows = tick.last.probe.samples.samples
        present: dict[str, Gpu] = {}
        for slot in bus.slots:
            row = rows[slot].fields if slot in rows else {}
            uuid, name = row.get("uuid") or tick.kernel.uuids.get(slot), row.get("name")
            present[slot] = {
                "uuid": uuid if isinstance(uuid, str) else None,
                "name": name if isinstance(name, str) else None,
            }
        self.known.update(present, tick.now)
        bus = replace(bus, removed=dict(self.known.removed))
        return Outcome(bus, trouble={"known_gpus": self.known.error})


def _forget(bus: BusView, slots: Iterable[str]) -> BusView:
    """``bus`` without ``slots`` ever seen on it (they left for good)."""
    gone = frozenset(slots)
    return replace(
        bus,
        seen=bus.seen - gone,
        not_back=bus.not_back - gone,
        gone_since={s: t for s, t in bus.gone_since.items() if s not in gone},
    )
