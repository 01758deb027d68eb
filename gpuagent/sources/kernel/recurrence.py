"""Recurrence across boots: the same critical problem on the same GPU in earlier boots (pure).

Recurrence is the RMA signal: a critical Xid that a reboot "fixed" and that came back after
``needed`` earlier boots (``recurrence_boots``) asks for the GPU's replacement, not another
reboot.  :class:`Recurrence` is fed the earlier boots' facts in journal order — the kernel's
critical Xids, the agent's own problem starts, root's clears — and counts *boots*, not
records.  A GPU is its UUID where both sides know one, else its slot; a clear of a kind on
a GPU means the boots before it no longer count (the operator repaired it), and a board
replaced in a slot that the hits matched by the slot alone before it were another board's.

:mod:`gpuagent.sources.kernel.earlier` reads the earlier boots into it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from gpuagent.health import CRITICAL
from gpuagent.views import BusView, Finding, Recurring

__all__ = ["Hit", "Recurrence", "recurring", "swaps"]


@dataclass(frozen=True)
class Hit:
    """A problem of ``kind`` (``code``: the Xid, 0 for other kinds) on a GPU in a boot."""

    boot: str
    at: float
    slot: str
    uuid: str | None
    kind: str
    code: int


def _by_uuid(uuid: str | None, hit: Hit) -> bool:
    """Whether the GPU and the hit are matched by their UUIDs (else by the slot)."""
    return bool(uuid and hit.uuid)


def _same_gpu(slot: str, uuid: str | None, hit: Hit) -> bool:
    if _by_uuid(uuid, hit):
        return uuid == hit.uuid
    return slot == hit.slot


class Recurrence:
    """Earlier boots' hits; a problem recurs once it hit the GPU in ``needed`` earlier boots."""

    def __init__(self, needed: int = 2) -> None:
        self.needed = needed
        self._hits: list[Hit] = []
        self._clears: dict[tuple[str, str], float] = {}  # (slot, kind or "all"): last at
        self._swaps: dict[str, float] = {}  # slot: when its board was last replaced

    def add(self, hit: Hit) -> None:
        """One critical problem seen in an earlier boot (any number per boot)."""
        self._hits.append(hit)

    def clear(self, at: float, slot: str, kind: str) -> None:
        """Root cleared ``kind`` (``all``: every kind) on ``slot`` at ``at``."""
        self._clears[slot, kind] = max(at, self._clears.get((slot, kind), at))

    def swap(self, at: float, slot: str) -> None:
        """The board in ``slot`` was replaced at ``at``: the hits matched by the slot alone
        (no UUID on one side) before it were another board's; those matched by the new
        board's UUID, wherever it was, still count."""
        self._swaps[slot] = max(at, self._swaps.get(slot, at))

    def boots(
        self, slot: str, uuid: str | None, kind: str, code: int, swapped: float | None = None
    ) -> list[tuple[str, float]]:
        """The earlier boots (and each one's first hit) in which the GPU had the problem since
        its last clear, oldest first; ``swapped``: when its board came into the slot, where
        that is known and not yet :meth:`swap` (wall s)."""
        swap = max(self._swaps.get(slot, -1.0), -1.0 if swapped is None else swapped)
        cleared = max(
            (at for (s, k), at in self._clears.items() if s == slot and k in (kind, "all")),
            default=None,
        )
        first: dict[str, float] = {}
        for h in self._hits:
            if (h.kind, h.code) != (kind, code) or not _same_gpu(slot, uuid, h):
                continue
            if cleared is not None and h.at <= cleared:
                continue
            if not _by_uuid(uuid, h) and h.at <= swap:
                continue
            first[h.boot] = min(first.get(h.boot, h.at), h.at)
        return sorted(first.items(), key=lambda b: b[1])

    def escalate(
        self, slot: str, uuid: str | None, finding: Finding, swapped: float | None = None
    ) -> Finding:
        """``finding`` (this boot's) with action ``drain_and_rma`` when it recurs
        (``swapped``: as :meth:`boots`)."""
        if finding.severity != CRITICAL:
            return finding
        code = dict(finding.extra).get("xid", 0)
        code = code if isinstance(code, int) else 0
        earlier = self.boots(slot, uuid, finding.kind, code, swapped)
        if len(earlier) < self.needed:
            return finding
        since = time.strftime("%Y-%m-%d", time.localtime(earlier[0][1]))
        said = f"{finding.name} on {slot} in {len(earlier) + 1} boots since {since}"
        return Finding(
            finding.kind,
            CRITICAL,
            "drain_and_rma",
            f"{said}; {finding.message}",
            finding.extra,
            ends=finding.ends,
        )


def recurring(
    findings: Mapping[str, list[Finding]],
    recurrence: Recurring | None,
    uuids: Mapping[str, str],
    swapped: Mapping[str, float] | None = None,
) -> dict[str, list[Finding]]:
    """This boot's ``findings`` (by slot; ``uuids`` the GPUs' UUIDs by slot) with the
    recurring ones escalated by ``recurrence`` (``None``: the earlier boots are not read yet,
    nothing is); ``swapped``: the slots whose board was replaced this boot, and when."""
    if recurrence is None:
        return dict(findings)
    swaps = swapped or {}
    return {
        slot: [recurrence.escalate(slot, uuids.get(slot), f, swaps.get(slot)) for f in fs]
        for slot, fs in findings.items()
    }


def swaps(bus: BusView, uuids: Mapping[str, str], now: float) -> dict[str, float]:
    """The slots whose board was replaced this boot, and when (wall s): those the GPUs this
    host had say (``bus.replaced``), and those whose UUID now is not the one remembered
    (``bus.boards``: seen at ``now``, before they say so)."""
    out = {s: now for s, u in uuids.items() if bus.boards.get(s) not in (None, u)}
    return {**out, **bus.replaced}
