"""The PCIe source: each GPU's path up to its root port, its AER counters read every tick
(:mod:`gpuagent.sources.pcie.counters`) and the kernel's AER records, judged into the GPU's
problems ``pcie_error`` (:mod:`gpuagent.sources.pcie.aer`); read after ``bus`` (its GPUs) and
``kernel`` (the records), in the event step too.

A GPU's path is resolved once while it stays on the bus (``realpath`` of its sysfs entry);
a function shared by several GPUs (a root port, a PCIe switch) is read once.  A counter's rise
is counted from the agent's first read: what it counted before is only known through the
boot's records, which the kernel source reads from the boot's start.  A tick on which no file
reads otherwise than on the last, no record came and no clear, is the last judgement again.
An error latches until the next boot or ``gpuagent clear SLOT pcie_error``, after which the
GPU's counts start again from there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from gpuagent.config import Config
from gpuagent.logs import EventLog
from gpuagent.sources import Outcome, Source
from gpuagent.sources.bus.pci import path_of
from gpuagent.sources.bus.pciaddr import path_role
from gpuagent.sources.kernel.clears import covers
from gpuagent.sources.pcie import aer
from gpuagent.sources.pcie.counters import CounterFiles, Counters, read_text
from gpuagent.views import AerHeard, Clear, Finding, PcieView, Tick

__all__ = ["PcieSource"]

# A GPU's counts of one kind at one device: (slot, device, kind).
_Key = tuple[str, str, str]


class PcieSource(Source):
    """Reads under ``sysfs_root``; ``read`` (:func:`read_text`) and ``resolve``
    (``os.path.realpath``) are injectable for tests."""

    name = "pcie"

    def __init__(
        self,
        sysfs_root: str,
        log: EventLog,
        *,
        read: Callable[[str], str | None] = read_text,
        resolve: Callable[[str], str] = os.path.realpath,
    ) -> None:
        self.log = log
        self._read = read
        self._resolve = resolve
        self._start(sysfs_root)

    def _start(self, sysfs_root: str) -> None:
        self.root = sysfs_root
        self.files = CounterFiles(
            os.path.join(sysfs_root, "bus", "pci", "devices"), self.log, self._read
        )
        # Each GPU's path, root port first, the GPU last, for the GPUs on the bus now.
        self._paths: dict[str, tuple[str, ...]] = {}
        # Each GPU's counts at the start (the first read, or its last clear): counters by
        # error type, and the records naming the device then; its clear's time.
        self._base: dict[_Key, dict[str, int]] = {}
        self._heard: dict[_Key, int] = {}
        self._cleared: dict[str, float] = {}
        # What the last judgement was made of (the files' texts, the records, the clears)
        # and its findings.
        self._judged: tuple[dict[str, tuple[str | None, ...]], AerHeard, object] | None = None
        self._found: dict[str, list[Finding]] = {}
        # Each function's counters' rise so far by kind, and when it last grew (wall s).
        self._risen: dict[_Key, int] = {}
        self._rose: dict[str, tuple[float, str]] = {}
        self._view = PcieView()
        self._now = 0.0

    def reset(self, old: Config, new: Config) -> None:
        """A reload onto another sysfs root starts afresh; otherwise what was read stays."""
        if new.sysfs_root != old.sysfs_root:
            self._start(new.sysfs_root)

    def step(self, tick: Tick) -> Outcome:
        self._now = tick.now
        slots = tick.bus.slots
        judged = self._judged
        if slots != list(self._paths):
            known = self._paths
            self._paths = {s: known.get(s) or path_of(self.root, s, self._resolve) for s in slots}
            new = [d for s, p in self._paths.items() if s not in known for d in p]
            self.files.arrange((d for p in self._paths.values() for d in p), new)
            judged = None
        texts = self.files.read()
        heard, cleared = tick.kernel.aer, tick.kernel.cleared
        if judged is None or judged[1] is not heard or judged[2] != cleared:
            self._judge(list(self._paths), heard, cleared)
        else:
            # Only the GPUs with a function whose files read otherwise than on the last tick.
            changed = {d for d, t in texts.items() if judged[0].get(d) != t}
            if changed:
                self._judge(
                    [s for s, p in self._paths.items() if changed.intersection(p)], heard, cleared
                )
        self._judged = (texts, heard, dict(cleared))
        if self._view.rose != self._rose:
            self._view = PcieView(dict(self._rose))
        return Outcome(self._view, {"pcie": self._found})

    def _judge(self, slots: list[str], heard: AerHeard, cleared: Mapping[str, Clear]) -> None:
        """Judge the GPUs in ``slots`` afresh; the others' findings stay."""
        read = self.files.counts({d for s in slots for d in self._paths[s]})
        found = {s: fs for s, fs in self._found.items() if s in self._paths and s not in slots}
        for slot in slots:
            path = self._paths[slot]
            self._clear(slot, path, read, heard, cleared.get(slot))
            mine = [self._finding(slot, i, path, read, heard) for i in range(len(path))]
            if any(mine):
                found[slot] = [f for f in reversed(mine) if f is not None]
        self._found = dict(sorted(found.items()))

    def _clear(
        self,
        slot: str,
        path: tuple[str, ...],
        read: dict[str, Counters],
        heard: AerHeard,
        clear: Clear | None,
    ) -> None:
        """Start the GPU's counts afresh after a clear of its ``pcie_error`` (once each)."""
        if clear is None or not covers(clear.kind, aer.KIND):
            return
        if self._cleared.get(slot, -1.0) >= clear.at:
            return
        self._cleared[slot] = clear.at
        for device in path:
            for kind, _ in aer.FILES:
                if kind in read[device]:
                    self._base[slot, device, kind] = read[device][kind]
                # The records up to the clear; one read with it but logged after it counts.
                count = heard.counts.get((device, kind), (0, 0.0))[0]
                after = sum(
                    r.source == device and r.kind == kind and r.time > clear.at
                    for r in heard.recent
                )
                self._heard[slot, device, kind] = max(count - after, 0)

    def _finding(
        self,
        slot: str,
        position: int,
        path: tuple[str, ...],
        read: dict[str, Counters],
        heard: AerHeard,
    ) -> Finding | None:
        device = path[position]
        errors: dict[str, aer.Errors] = {}
        for kind, _ in aer.FILES:
            key = (slot, device, kind)
            now = read[device].get(kind)
            rise: dict[str, int] = {}
            if now is not None:
                base = self._base.setdefault(key, now)
                if any(now.get(n, 0) < c for n, c in base.items()):
                    # Fewer than before: the device was enumerated again (a reset, a rescan).
                    base = self._base[key] = dict.fromkeys(now, 0)
                rise = {n: c - base.get(n, 0) for n, c in now.items() if c > base.get(n, 0)}
                if sum(rise.values()) > self._risen.get(key, 0):
                    self._rose[device] = (self._now, kind)
                self._risen[key] = sum(rise.values())
            records, last = heard.counts.get((device, kind), (0, 0.0))
            records -= self._heard.get(key, 0)
            errors[kind] = aer.Errors(rise, records, last if records else None)
        return aer.finding(
            device, path_role(position, len(path)), errors, _recovered(path, errors, heard)
        )


def _recovered(
    path: tuple[str, ...], errors: Mapping[str, aer.Errors], heard: AerHeard
) -> tuple[str, bool] | None:
    """The kernel's latest word on a recovery run by a port on ``path`` since the last of
    ``errors``' records (its port, and whether it succeeded); None where it said none."""
    times = [e.last for e in errors.values() if e.last is not None]
    if not times:
        return None
    said = {p: heard.recoveries[p] for p in path if p in heard.recoveries}
    after = [(at, port, ok) for port, (at, ok) in said.items() if at >= max(times)]
    if not after:
        return None
    _, port, ok = max(after)
    return port, ok
