"""What ``gpuagent probe`` makes of one nvidia-smi answer (pure): each GPU's findings by the
agent's own rules, and the short table a person reads when a GPU looks sick.

One answer is one sample: ``throttled`` is judged on it alone (the agent waits for a window of
samples), so the table says what this sample shows, not what the agent would page on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuagent.commands.status import clean
from gpuagent.health import rank
from gpuagent.sources.probe import rules, smi
from gpuagent.sources.probe.probe import ProbeResult
from gpuagent.untrusted import capped
from gpuagent.views import Finding, PciGpu

__all__ = ["HEADER", "findings", "full", "table"]

HEADER = ("SLOT", "NAME", "ACTION", "FINDING")


def findings(result: ProbeResult, gpus: Iterable[PciGpu]) -> dict[str, list[Finding]]:
    """Every GPU of the answer and of the bus (bound to nvidia) by slot, with what the
    answer says about it, worst first (``[]``: healthy); ``result.rows`` must be set."""
    rows = {smi.key(row): row for row in result.rows or []}
    out = rules.smi_findings(rows, result.requires_reset, result.gpu_errors, result.inforom)
    for slot in rows:
        out.setdefault(slot, [])
    for gpu in gpus:
        if gpu.driver == "nvidia" and gpu.slot not in out:
            out[gpu.slot] = [rules.missing_finding()]
    return {
        slot: sorted(found, key=lambda f: rank(f.severity, f.action, slot, f.kind))
        for slot, found in sorted(out.items())
    }


def table(result: ProbeResult, gpus: Iterable[PciGpu], width: int | None = None) -> list[str]:
    """The lines of the table: a header, then a line per finding (``ok`` for a GPU without
    one), the slot and name on the first line of each GPU only; each cut to ``width``
    columns (None: not cut), a cut line ending in ``…``."""
    names = {smi.key(row): row.get("name") for row in result.rows or []}
    cells: list[tuple[str, str, str, str]] = [HEADER]
    for slot, found in findings(result, gpus).items():
        name = names.get(slot)
        first = (clean(slot), clean(name) if isinstance(name, str) and name else "-")
        if not found:
            cells.append((*first, "-", "ok"))
        for i, f in enumerate(found):
            said = clean(f"{f.severity} {f.name}: {f.message}")
            cells.append((*(first if i == 0 else ("", "")), f.action, said))
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)), row[-1]])
        for row in cells
    ]
    return lines if width is None else [capped(line, width) for line in lines]


def full(result: ProbeResult, gpus: Iterable[PciGpu]) -> dict[str, Any]:
    """``--json``: the whole answer (the fields asked, each row as parsed, what nvidia-smi
    said instead of a value, the GPUs it could not answer for) and the findings by slot."""
    return {
        "fields": list(result.fields),
        "rows": result.rows,
        "reasons": list(result.reasons),
        "gpu_errors": result.gpu_errors,
        "findings": {
            slot: [_finding(f) for f in found] for slot, found in findings(result, gpus).items()
        },
    }


def _finding(f: Finding) -> Mapping[str, object]:
    return {
        "kind": f.kind,
        "severity": f.severity,
        "action": f.action,
        "message": f.message,
        "ends": f.ends,
    }
