"""Recurrence across boots: the same critical problem on the same GPU in earlier boots (pure).

Recurrence is the RMA signal: a critical Xid that a reboot "fixed" and that came back after
``needed`` earlier boots (``recurrence_boots``) asks for the GPU's replacement, not another
reboot.  :class:`Recurrence` is fed the earlier boots' facts in journal order — the kernel's
critical Xids, the agent's own problem starts, root's clears — and counts *boots*, not
records.  A GPU is its UUID where both sides know one, else its slot; a clear of a kind on
a GPU means the boots before it no longer count (the operator repaired it).

:mod:`gpuagent.sources.kernel.earlier` reads the earlier boots into it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from gpuagent.health import CRITICAL
from gpuagent.views import Finding, Recurring

__all__ = ["Hit", "Recurrence", "recurring"]


@dataclass(frozen=True)
class Hit:
    """A problem of ``kind`` (``code``: the Xid, 0 for other kinds) on a GPU in a boot."""

    boot: str
    at: float
    slot: str
    uuid: str | None
    kind: str
    code: int


def _same_gpu(slot: str, uuid: str | None, hit: Hit) -> bool:
    if uuid and hit.uuid:
        return uuid == hit.uuid
    return slot == hit.slot


class Recurrence:
    """Earlier boots' hits; a problem recurs once it hit the GPU in ``needed`` earlier boots."""

    def __init__(self, needed: int = 2) -> None:
        self.needed = needed
        self._hits: list[Hit] = []
        self._clears: dict[tuple[str, str], float] = {}  # (slot, kind or "all"): last at

    def add(self, hit: Hit) -> None:
        """One critical problem seen in an earlier boot (any number per boot)."""
        self._hits.append(hit)

    def clear(self, at: float, slot: str, kind: str) -> None:
        """Root cleared ``kind`` (``all``: every kind) on ``slot`` at ``at``."""
        self._clears[slot, kind] = max(at, self._clears.get((slot, kind), at))

    def boots(self, slot: str, uuid: str | None, kind: str, code: int) -> list[tuple[str, float]]:
        """The earlier boots (and each one's first hit) in which the GPU had the problem since
        its last clear, oldest first."""
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
            first[h.boot] = min(first.get(h.boot, h.at), h.at)
        return sorted(first.items(), key=lambda b: b[1])

    def escalate(self, slot: str, uuid: str | None, finding: Finding) -> Finding:
        """``finding`` (this boot's) with action ``drain_and_rma`` when it recurs."""
        if finding.severity != CRITICAL:
            return finding
        code = dict(finding.extra).get("xid", 0)
        earlier = self.boots(slot, uuid, finding.kind, code if isinstance(code, int) else 0)
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
    findings: Mapping[str, list[Finding]], recurrence: Recurring | None, uuids: Mapping[str, str]
) -> dict[str, list[Finding]]:
    """This boot's ``findings`` (by slot; ``uuids`` the GPUs' UUIDs by slot) with the
    recurring ones escalated by ``recurrence`` (``None``: the earlier boots are not read yet,
    nothing is)."""
    if recurrence is None:
        return dict(findings)
    return {
        slot: [recurrence.escalate(slot, uuids.get(slot), f) for f in fs]
        for slot, fs in findings.items()
    }
