"""What the read of the earlier boots found: each boot's facts (the critical hits, root's
clears, the boards replaced, each board's first wear record), the recurrence they feed, and
what of them is kept across restarts (:mod:`~gpuagent.sources.kernel.earlierfile`).

:class:`BootFacts` takes the entries :class:`~gpuagent.sources.kernel.earlier.EarlierBoots`
reads, in journal order (:meth:`BootFacts.take`); it reads no journal itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuagent.health import CRITICAL
from gpuagent.sources.kernel import timeline
from gpuagent.sources.kernel.earlierfile import BootRead, Kept, KeptFile
from gpuagent.sources.kernel.recurrence import Hit, Recurrence

__all__ = ["BootFacts"]


class BootFacts:
    """The facts of the earlier boots of the journal in ``directory`` (``""``: the system
    journal) since ``since`` (s since the epoch), feeding a :class:`Recurrence` of ``needed``
    boots; ``file`` keeps them across restarts (None: nothing is kept).  :attr:`this` is this
    boot's ``_BOOT_ID`` in the journal, set once it is opened (``""`` until then): its entries
    are the kernel source's, never taken here."""

    def __init__(self, directory: str, since: float, needed: int, file: KeptFile | None) -> None:
        self.needed = needed
        self.recurrence = Recurrence(needed)
        self._wore: dict[str, tuple[Mapping[str, int], ...]] | None = None
        # The Xids already stepped, by (boot, device, code): a fall-off's companions are one.
        self._told: set[tuple[str, str, int]] = set()
        self._directory = directory
        self.since = since
        self._file = file
        found = file.read() if file is not None else None
        # A file of another journal, or begun later than this read begins, is not used.
        usable = found is not None and found.journal == directory and found.since <= since
        self.kept = found if found is not None and usable else Kept(directory, since)
        self.this = ""

    def restart(self) -> None:
        """What was kept cannot be gone on from (a cursor sd-journal does not take): the read
        starts over, from nothing."""
        self.kept, self._told = Kept(self._directory, self.since), set()
        self.recurrence = Recurrence(self.needed)

    def unchecked(self) -> None:
        """The journal never opened: nothing kept was checked against it, none counts."""
        self.kept = Kept(self._directory, self.since)

    def save(self) -> None:
        """Keep what was read for the next start (where a file keeps it)."""
        if self._file is None:
            return
        for boot, read in self.kept.boots.items():
            read.told = {(d, c) for b, d, c in self._told if b == boot}
        self._file.write(self.kept)

    def prune(self, present: set[str]) -> None:
        """Drop what was kept of boots not in ``present``, of this boot, or wholly before the
        read's start, and the facts from before it; then count what is left."""
        since = self.since
        for boot, read in list(self.kept.boots.items()):
            if boot not in present or boot == self.this or read.last < since * 1e6:
                del self.kept.boots[boot]
                continue
            read.hits = [h for h in read.hits if h.at >= since]
            read.clears = [c for c in read.clears if c[0] >= since]
            read.swaps = [s for s in read.swaps if s[0] >= since]
            for h in read.hits:
                self.recurrence.add(h)
            for at, slot, kind in read.clears:
                self.recurrence.clear(at, slot, kind)
            for at, slot in read.swaps:
                self.recurrence.swap(at, slot)
            self._told |= {(boot, d, c) for d, c in read.told}
        self.kept.since = since

    def take(self, at: float, entry: Mapping[str, bytes]) -> bool:
        """Take the journal ``entry`` logged at ``at`` (s since the epoch); False, taking
        nothing, where it is this boot's (the read is done)."""
        boot = entry.get("_BOOT_ID", b"").decode("ascii", "replace")
        if boot == self.this:
            return False  # this boot is the kernel source's
        read = self.kept.boots.get(boot)
        if read is None:
            read = self.kept.boots[boot] = BootRead()
        read.last = max(read.last, int(at * 1e6))
        for s in timeline.steps(boot, at, entry, read.uuids, self._told):
            if s.event == "clear" and s.pci_slot and s.kind:
                self.recurrence.clear(at, s.pci_slot, s.kind)
                read.clears.append((at, s.pci_slot, s.kind))
            elif s.event == "board_replaced" and s.pci_slot:
                self.recurrence.swap(at, s.pci_slot)
                read.swaps.append((at, s.pci_slot))
            elif s.event == "wear" and s.uuid and s.wear:
                read.wear.setdefault(s.uuid.lower(), s.wear)
            elif s.severity == CRITICAL and s.pci_slot and s.kind:
                if s.event == "problem_start" and s.kind == "xid":
                    continue  # counted from the kernel's own records
                hit = Hit(boot, at, s.pci_slot, s.uuid, s.kind, s.xid or 0)
                self.recurrence.add(hit)
                read.hits.append(hit)
        return True

    def wear(self) -> dict[str, tuple[Mapping[str, int], ...]]:
        """The earlier boots' wear records by board UUID (lower case), each boot's first,
        oldest first (worked out once: asked only when the read is done)."""
        if self._wore is None:
            by_board: dict[str, list[Mapping[str, int]]] = {}
            for read in self.kept.boots.values():
                for uuid, counts in read.wear.items():
                    by_board.setdefault(uuid, []).append(counts)
            self._wore = {u: tuple(w) for u, w in by_board.items()}
        return self._wore
