"""The GPUs this host has had, remembered on disk across restarts, upgrades and reboots.

The file is ``gpus.json`` in the directory systemd names in ``$STATE_DIRECTORY``
(:class:`gpuagent.edges.statedir.StateFile`); a hand run without that variable remembers
nothing.  Each GPU is its slot, UUID, name and its board's serial number; another UUID in a
slot is another board there (:class:`Swap`), and the board that left is remembered
(:attr:`KnownGpus.departed`; not one that only moved to another slot): one back in this host
later, after an RMA, is known by its UUID or serial (:mod:`gpuagent.sources.bus.had` has its
problems say so).  A known GPU missing from the bus is
``gone_from_bus`` until it returns or root's ``gpuagent clear SLOT gone_from_bus`` forgets
it; a GPU so forgotten is one less for ``expected_gpus`` (:attr:`KnownGpus.removed`) until a
GPU is on its slot again.  Each also notes the boot it was last on the bus in
(:mod:`gpuagent.edges.bootid`): one last seen in an earlier boot did not come back after the
reboot (:attr:`KnownGpus.not_back`).  A file that cannot be read or written is one warning
(the state's ``problems["known_gpus"]``) and the agent goes on with what it sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from gpuagent.edges import safefile
from gpuagent.edges.statedir import StateFile
from gpuagent.logs import EventLog

__all__ = ["FILE", "KnownGpus", "Swap", "boards_with", "entries_of"]

FILE = "gpus.json"
Gpu = dict[str, str | None]
# A GPU as the file keeps it: Gpu's keys, ``boot`` and ``gone_at``.
Entry = dict[str, str | float | None]
# What the file keeps of each GPU beside its slot (``serial``: its board's serial number,
# absent in an older agent's file); ``boot``: the boot it was last on the bus in;
# ``gone_at``: when it was first found missing from it (s since the epoch; None while on it).
_KEYS = ("uuid", "name", "serial", "boot", "gone_at")
# What the file says of a GPU itself (the rest is of its time on the bus).
_BOARD = ("uuid", "name", "serial")
# The file holds a few hundred bytes a GPU: more than this is not the agent's.
MAX_SIZE = 1024 * 1024
# After the last time the file may hold (s since the epoch; 2514): a date of it can be made.
_LAST = 2.0**34
# The boards replaced out of this host that are remembered, the newest: a host's lifetime of
# RMAs, a few hundred bytes each.
DEPARTED = 256


class Swap(NamedTuple):
    """A board replaced in ``slot``: the ``old`` entry the file had (``uuid``, ``serial`` …)
    and the ``new`` GPU present there; ``real`` False where no swap can have happened (the
    slot never left the bus this boot): inconsistent input, the old entry kept."""

    slot: str
    old: Mapping[str, str | float | None]
    new: Mapping[str, str | None]
    real: bool = True


class KnownGpus:
    """The GPUs remembered in ``directory`` (None or ``""``: none are remembered); ``boot``
    is this boot's id (``""``: unknown, no GPU is said not to have come back)."""

    def __init__(self, directory: str | None, log: EventLog, boot: str = "") -> None:
        self.boot = boot
        self.file = StateFile(directory, FILE, log, limit=MAX_SIZE, otherwise="the GPUs on the bus")
        known = self.file.read(_parsed, "the GPUs this host had") or ({}, {}, [])
        self.gpus: dict[str, Entry] = known[0]
        # The boards replaced out of a slot, oldest first: their slot, UUID, serial and
        # when the swap was seen (``at``, s since the epoch).
        self.departed: list[Entry] = known[2]
        # The slots root said left for good, with the expected_gpus of the clear: one GPU
        # less to expect while that setting stands (an operator who lowers it has counted it).
        self.removed: dict[str, int | None] = known[1]

    @property
    def error(self) -> str | None:
        """Why the file cannot be read or written, while it cannot."""
        return self.file.error

    @property
    def not_back(self) -> list[str]:
        """The slots of the GPUs last on the bus in an earlier boot, not in this one (yet)."""
        return sorted(
            slot
            for slot, g in self.gpus.items()
            if self.boot and g.get("boot") and g.get("boot") != self.boot
        )

    @property
    def replaced(self) -> dict[str, float]:
        """The slots whose board was replaced this boot (the file's departures of this boot),
        and when (s since the epoch): a restart in the swap's boot still knows it."""
        return {
            str(d["pci_slot"]): float(at)
            for d in self.departed
            if self.boot
            and d.get("boot") == self.boot
            and isinstance(at := d.get("at"), int | float)
        }

    @property
    def gone_since(self) -> dict[str, float]:
        """When each GPU missing from the bus was first found missing (s since the epoch)."""
        out: dict[str, float] = {}
        for slot, g in self.gpus.items():
            at = g.get("gone_at")
            if isinstance(at, int | float) and not isinstance(at, bool):
                out[slot] = float(at)
        return out

    def update(self, present: Mapping[str, Gpu], now: float | None = None) -> list[Swap]:
        """Remember the GPUs ``present`` on the bus now (slot: uuid, name and serial, None if
        not known), on the bus in this boot, and when (wall time ``now``) each of the others
        was first found missing; writes the file when that changes what it holds.  Returns
        the boards replaced: a slot whose remembered UUID and present one differ, with the
        old board's entry (its serial, not the new board's); one whose slot never left the
        bus this boot is no swap (``real`` False) and the file keeps the old board."""
        merged = dict(self.gpus)
        back = [s for s in self.removed if s in present]
        for slot in back:
            del self.removed[slot]
        swaps: list[Swap] = []
        for slot, gpu in present.items():
            old = merged.get(slot, {})
            if old.get("uuid") and gpu.get("uuid") and old.get("uuid") != gpu.get("uuid"):
                if self._stayed(old):
                    # A board is changed only off the bus: a reboot, or a hot-plug that the
                    # slot's gone_at records.  Another UUID without either is no swap.
                    swaps.append(Swap(slot, old, gpu, real=False))
                    continue
                swaps.append(Swap(slot, old, gpu))
                if not _moved(old, present):
                    left = {"pci_slot": slot, "uuid": old.get("uuid"), "serial": old.get("serial")}
                    left = {**left, "at": now, "boot": self.boot or None}
                    self.departed = [*self.departed, left][-DEPARTED:]
                old = {}
            merged[slot] = {k: gpu.get(k) or old.get(k) for k in _BOARD}
            # The remembered board is known on the bus this boot once its UUID is read there:
            # before that the slot holds some board, maybe another (a swap at the reboot).
            known = gpu.get("uuid") or not old.get("uuid")
            merged[slot]["boot"] = (self.boot or old.get("boot")) if known else old.get("boot")
            # And that it left the bus is kept until then: what came back may be another.
            merged[slot]["gone_at"] = None if known else old.get("gone_at")
        for slot in set(merged) - set(present):
            if now is not None and merged[slot].get("gone_at") is None:
                merged[slot] = {**merged[slot], "gone_at": now}
        if merged != self.gpus or back or swaps:
            self.gpus = merged
            self._write()
        return swaps

    def _stayed(self, old: Mapping[str, object]) -> bool:
        """Whether the board ``old`` was on the bus in this boot and never left it."""
        return bool(self.boot) and old.get("boot") == self.boot and old.get("gone_at") is None

    def moved(self, present: Mapping[str, Gpu]) -> dict[str, str]:
        """The remembered boards not in their slot that are on the bus in another (``present``
        by slot, with the UUIDs read): old slot to new.  A renumbered bus (a BIOS or kernel
        change) moves every board; none of them left."""
        if self.gpus.keys() <= present.keys():
            return {}  # every remembered slot is on the bus: nothing moved out of one
        here = {u.lower(): s for s, g in present.items() if isinstance(u := g.get("uuid"), str)}
        return {
            slot: here[b.lower()]
            for slot, g in self.gpus.items()
            if slot not in present and isinstance(b := g.get("uuid"), str) and b.lower() in here
        }

    def moved_away(self, slots: Iterable[str]) -> None:
        """Forget ``slots``: their boards are on the bus elsewhere (:meth:`moved`)."""
        if self._drop(slots):
            self._write()

    def forget(self, slots: Iterable[str], expected: int | None = None) -> None:
        """Forget ``slots`` (root cleared their ``gone_from_bus``: they left for good), each
        one GPU less to expect while ``expected_gpus`` is ``expected``."""
        gone = self._drop(slots)
        for slot in gone:
            self.removed[slot] = expected
        if gone:
            self._write()

    def _drop(self, slots: Iterable[str]) -> list[str]:
        """Forget the GPUs of ``slots`` remembered; returns those slots."""
        gone = [s for s in slots if s in self.gpus]
        for slot in gone:
            del self.gpus[slot]
        return gone

    def _write(self) -> None:
        gpus = [{"pci_slot": s, **g} for s, g in sorted(self.gpus.items())]
        removed = [{"pci_slot": s, "expected_gpus": n} for s, n in sorted(self.removed.items())]
        data = {"gpus": gpus, "removed": removed, "departed": self.departed}
        self.file.write(data, "the GPUs this host has")


def _parsed(data: Any) -> tuple[dict[str, Entry], dict[str, int | None], list[Entry]]:
    """The GPUs of the file's JSON ``{"gpus": [{"pci_slot": str, "uuid": str|null, "name":
    str|null, "serial": str|null, "boot": str|null, "gone_at": finite number|null}, ...],
    "removed": [{"pci_slot": str, "expected_gpus": int|null}, ...], "departed":
    [{"pci_slot": str, "uuid": str|null, "serial": str|null, "at": finite number|null, "boot":
    str|null}, ...]}`` (``serial``, ``removed``, ``departed`` and its ``boot`` absent in an
    older agent's file), those removed and those departed; raises TypeError naming what is
    not so."""
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, list):
        raise TypeError('expected {"gpus": [...]}')
    out: dict[str, Entry] = {}
    for i, g in enumerate(gpus):
        if not isinstance(g, dict) or not isinstance(g.get("pci_slot"), str):
            raise TypeError(f"gpus[{i}]: expected an object with a pci_slot string")
        entry = {k: g.get(k) for k in _KEYS}
        if not all(isinstance(entry[k], str | None) for k in ("uuid", "name", "serial", "boot")):
            raise TypeError(f"gpus[{i}]: uuid, name, serial and boot must be strings or null")
        if not _time(entry["gone_at"]):
            raise TypeError(f"gpus[{i}]: gone_at must be a number or null")
        out[g["pci_slot"]] = entry
    return out, _removed(data.get("removed", [])), _departed(data.get("departed", []))


def _moved(old: Mapping[str, object], present: Mapping[str, Gpu]) -> bool:
    """Whether the board ``old`` is still on the bus, in another slot (boards swapped between
    slots, buses renumbered): moved, not departed."""
    uuid, serial = old.get("uuid"), old.get("serial")
    return any(
        (uuid and g.get("uuid") == uuid) or (serial and g.get("serial") == serial)
        for g in present.values()
    )


def _departed(data: Any) -> list[Entry]:
    if not isinstance(data, list):
        raise TypeError('expected "departed": [...]')
    out: list[Entry] = []
    for i, d in enumerate(data):
        if not isinstance(d, dict) or not isinstance(d.get("pci_slot"), str):
            raise TypeError(f"departed[{i}]: expected an object with a pci_slot string")
        entry = {k: d.get(k) for k in ("pci_slot", "uuid", "serial", "at", "boot")}
        if not all(isinstance(entry[k], str | None) for k in ("uuid", "serial", "boot")):
            raise TypeError(f"departed[{i}]: uuid, serial and boot must be strings or null")
        if not _time(entry["at"]):
            raise TypeError(f"departed[{i}]: at must be a number or null")
        out.append(entry)
    return out[-DEPARTED:]


def _time(at: object) -> bool:
    """Whether ``at`` is a time (s since the epoch, from 1970 to 2514: one a date can be
    made of) or None."""
    if at is None:
        return True
    return not isinstance(at, bool) and isinstance(at, int | float) and 0 <= at < _LAST


def _removed(data: Any) -> dict[str, int | None]:
    if not isinstance(data, list):
        raise TypeError('expected "removed": [...]')
    out: dict[str, int | None] = {}
    for i, r in enumerate(data):
        n = r.get("expected_gpus") if isinstance(r, dict) else None
        if not isinstance(r, dict) or not isinstance(r.get("pci_slot"), str):
            raise TypeError(f"removed[{i}]: expected an object with a pci_slot string")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
            raise TypeError(f"removed[{i}]: expected_gpus must be a whole number or null")
        out[r["pci_slot"]] = n
    return out


def boards_with(path: str, serial: str) -> set[str]:
    """The UUIDs of the GPUs that the file at ``path`` remembers with the board serial
    ``serial``, in a slot now or replaced out of one (``gpuagent history SERIAL``); raises
    OSError (as :func:`gpuagent.edges.safefile.load_json`: a symlink, a FIFO, a file over
    :data:`MAX_SIZE`), and ValueError or TypeError for a file that is not the agent's."""
    return {
        g["uuid"]
        for g in entries_of(path)
        if g.get("serial") == serial and isinstance(g["uuid"], str)
    }


def entries_of(path: str) -> list[Entry]:
    """Every GPU the file at ``path`` remembers: those in a slot (``pci_slot``, ``uuid``,
    ``name``, ``serial``, ``boot``, ``gone_at``), then those replaced out of one
    (``pci_slot``, ``uuid``, ``serial``, ``at``, ``boot``; ``gpuagent rma``); raises as
    :func:`boards_with`."""
    gpus, _, departed = _parsed(safefile.load_json(path, MAX_SIZE))
    return [*({"pci_slot": s, **g} for s, g in gpus.items()), *departed]
