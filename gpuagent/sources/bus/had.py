"""The GPUs this host had, as a source: the tick's ``bus``, the scan with what it remembers.

Its view is the scan (:mod:`gpuagent.sources.bus.bus`) with every slot seen on the bus since
the agent started, those that did not come back after a reboot, and since when the missing
ones are missing, less those root said left for good (``gpuagent clear --gone``, read by the
kernel source).  It keeps them across restarts in ``$STATE_DIRECTORY``
(:class:`gpuagent.sources.bus.known.KnownGpus`), their boards' serials with them (the board
source's, :mod:`gpuagent.sources.board`), and hands its view to the next tick's scan.  Another
UUID in a slot than the file's is a board replaced: one line (``BOARD_REPLACED``, both
boards' UUIDs and serials), said once since the file then holds the new board, and the slot
in the view's ``replaced``, from which the slot's recurrence starts afresh; a board changes
only off the bus, so another UUID in a slot that never left it this boot is inconsistent
input, one warning (``BOARD_UUID_INCONSISTENT``) and no swap.  A board back in
this host after it was replaced out of it (an RMA'd board returned, known by its UUID or
serial) is in the view's ``departed``: each of its problems says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import replace

from gpuagent.logs import Event, EventLog
from gpuagent.sources import Outcome, Source
from gpuagent.sources.bus.known import Entry, Gpu, KnownGpus, Swap
from gpuagent.views import BusView, Tick

__all__ = ["GpusHad"]


class GpusHad(Source):
    """The GPUs remembered in ``directory`` (``None``: none are), ``boot`` this boot's id."""

    name = "bus"

    def __init__(self, directory: str | None, log: EventLog, boot: str) -> None:
        self.log = log
        self.known = KnownGpus(directory, log, boot)
        self._stepped = False
        # The slots whose board was replaced this boot, and when: those the agent before a
        # restart saw (the file's departures of this boot), and those this one sees.
        self._replaced: dict[str, float] = self.known.replaced
        # The departed boards' notes, made again when a board departs (each departure makes
        # a new list): (the list they were made of, the notes).
        self._notes: tuple[list[Entry], dict[str, str]] | None = None
        self._odd_told: set[tuple[str, object, object]] = set()

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
            replaced=dict(self._replaced),
            boards=self._boards(),
        )

    def step(self, tick: Tick) -> Outcome:
        self._stepped = True
        bus = tick.scan
        gone = tick.kernel.forgotten
        if gone:
            self.known.forget(gone, tick.config.expected_gpus)
            bus = _forget(bus, gone)
        samples = tick.last.probe.samples
        serials = tick.last.board.serials
        present: dict[str, Gpu] = {}
        for slot in bus.slots:
            # A stale sample is of the board that was there: none says who is there now.
            sample = samples.samples.get(slot) if slot in samples.fresh else None
            row = sample.fields if sample is not None else {}
            uuid, name = row.get("uuid") or tick.kernel.uuids.get(slot), row.get("name")
            uuid = uuid if isinstance(uuid, str) else None
            # A serial read for the board now in the slot, not for the one before it.
            read_for, serial = serials.get(slot, (None, None))
            present[slot] = {
                "uuid": uuid,
                "name": name if isinstance(name, str) else None,
                "serial": serial if read_for == uuid else None,
            }
        for swap in self.known.update(present, tick.now):
            if swap.real:
                self._replaced[swap.slot] = tick.now
                self._tell(swap)
            else:
                self._odd(swap)
        # A board is known by its UUID wherever the bus put it: one in another slot now left
        # no GPU gone from the bus behind it.
        moved = self.known.moved(present)
        if moved:
            self.known.moved_away(moved)
            bus = _forget(bus, moved)
            for old, new in sorted(moved.items()):
                self.log(
                    logging.INFO,
                    Event.BOARD_MOVED,
                    f"GPU {new}: its board ({present[new].get('uuid')}) was in {old}: moved, "
                    "or the PCI bus renumbered; its slot's past goes with it by its UUID",
                    pci_slot=new,
                    gpu_uuid=present[new].get("uuid"),
                    old_slot=old,
                )
        bus = replace(
            bus,
            removed=dict(self.known.removed),
            replaced=dict(self._replaced),
            boards=self._boards(),
            departed=self._departed(),
        )
        return Outcome(bus, trouble={"known_gpus": self.known.error})

    def _boards(self) -> dict[str, str]:
        """The UUID remembered in each slot."""
        return {s: u for s, g in self.known.gpus.items() if isinstance(u := g.get("uuid"), str)}

    def _departed(self) -> dict[str, str]:
        """What each problem of a board back in this host after it was replaced says of it,
        by the board's UUID (lower case) and serial number."""
        if self._notes is None or self._notes[0] is not self.known.departed:
            notes: dict[str, str] = {}
            for left in self.known.departed:
                uuid, serial, at = (left.get(k) for k in ("uuid", "serial", "at"))
                board = f"serial {serial}" if serial else f"{uuid}"
                when = (
                    f" on {time.strftime('%Y-%m-%d', time.localtime(at))}"
                    if isinstance(at, int | float)
                    else ""
                )
                note = f"this board ({board}) is back: it was replaced in {left['pci_slot']}{when}"
                for key in (str(uuid).lower() if uuid else None, serial):
                    if isinstance(key, str):
                        notes[key] = note
            self._notes = (self.known.departed, notes)
        return self._notes[1]

    def _odd(self, swap: Swap) -> None:
        """Another UUID in a slot that never left the bus this boot: inconsistent input, no
        board swap; said once a boot for each pair of UUIDs."""
        key = (swap.slot, swap.old.get("uuid"), swap.new.get("uuid"))
        if key in self._odd_told:
            return
        self._odd_told.add(key)
        self.log(
            logging.WARNING,
            Event.BOARD_UUID_INCONSISTENT,
            f"GPU {swap.slot}: reads UUID {key[2]} where its board had {key[1]} this boot, and "
            "the slot never left the PCI bus: inconsistent input, no board swap; the board is "
            f"kept as {key[1]} (check what reports this GPU)",
            pci_slot=swap.slot,
            gpu_uuid=key[1],
            read_uuid=key[2],
        )

    def _tell(self, swap: Swap) -> None:
        old_uuid, old_serial = swap.old.get("uuid"), swap.old.get("serial")
        new_uuid, new_serial = swap.new.get("uuid"), swap.new.get("serial")
        was = f"{old_uuid}" + (f" (serial {old_serial})" if old_serial else "")
        now = f"{new_uuid}" + (f" (serial {new_serial})" if new_serial else "")
        self.log(
            logging.INFO,
            Event.BOARD_REPLACED,
            f"GPU {swap.slot}: board replaced: {was} -> {now}; its slot's recurrence starts afresh",
            pci_slot=swap.slot,
            gpu_uuid=new_uuid,
            old_uuid=old_uuid,
            old_serial=old_serial,
            new_serial=new_serial,
        )


def _forget(bus: BusView, slots: Iterable[str]) -> BusView:
    """``bus`` without ``slots`` ever seen on it (they left for good)."""
    gone = frozenset(slots)
    return replace(
        bus,
        seen=bus.seen - gone,
        not_back=bus.not_back - gone,
        gone_since={s: t for s, t in bus.gone_since.items() if s not in gone},
    )
