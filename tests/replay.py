"""Replay of captured nvidia-smi CSV: project a real capture onto the fields a query asks for.

This is what the fake ``nvidia-smi`` in the tests answers with.  Captures are never edited:
a capture is read, its columns are picked by the query's field names (nvidia-smi's own aliases
resolved as ``--help-query-gpu`` lists them), and ``nounits``/``noheader`` are applied the way
nvidia-smi applies them.  A requested field the capture does not hold is answered the way a
driver that does not know it answers: ``Field "X" is not a valid field to query.``, exit 2.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
CORPUS = os.path.join(DATA, "corpus")

# nvidia-smi --help-query-gpu: '"clocks.current.sm" or "clocks.sm"' and so on.
ALIASES = {
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.gr": "clocks.current.graphics",
    "clocks.video": "clocks.current.video",
}
_UNIT_VALUE = re.compile(r"^(-?[0-9.]+) (%|MiB|W|MHz|us|C)$")
_HEADER_UNIT = re.compile(r"^(.*?) \[[^\]]+\]$")


def canonical(field: str) -> str:
    return ALIASES.get(field, field)


@dataclass
class Capture:
    """A capture's column names (canonical, units removed) and its rows of raw cells."""

    name: str
    fields: list[str]
    rows: list[list[str]]


def _split(line: str) -> list[str]:
    return [cell.strip() for cell in line.split(", ")]


def load(name: str) -> Capture:
    """Read ``corpus/csv/<name>``; noheader captures take their field list from
    ``data/noheader-fields.json`` (copied from the capture's source note)."""
    with open(os.path.join(CORPUS, "csv", name), encoding="utf-8") as f:
        lines = [ln.rstrip("\r\n") for ln in f if ln.strip()]
    with open(os.path.join(DATA, "noheader-fields.json"), encoding="utf-8") as f:
        noheader: dict[str, list[str]] = json.load(f)
    if name in noheader:
        fields = [canonical(x) for x in noheader[name]]
        body = lines
    else:
        header = _split(lines[0])
        fields = [canonical(m.group(1) if (m := _HEADER_UNIT.match(h)) else h) for h in header]
        body = lines[1:]
    return Capture(name, fields, [_split(ln) for ln in body])


def nounits(cell: str) -> str:
    m = _UNIT_VALUE.match(cell)
    return m.group(1) if m else cell


def bus_id(slot: str) -> str:
    """A sysfs slot (``0000:18:00.0``) the way nvidia-smi prints it (``00000000:18:00.0``)."""
    domain, rest = slot.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def gpu_uuid(slot: str) -> str:
    """The UUID of the fake host's GPU in ``slot``, in every answer: its board's, whatever
    the other GPUs (one lost, one gone from the bus) or the answer's order."""
    serial = int(slot.replace(":", "").replace(".", ""), 16)
    return f"GPU-00000000-0000-0000-0000-{serial:012x}"


def answer(
    cap: Capture,
    query: list[str],
    fmt: str,
    slots: list[str] | None = None,
    overrides: dict[str, dict[str, str]] | None = None,
) -> tuple[str, int]:
    """nvidia-smi's stdout and exit code for ``--query-gpu=<query> --format=<fmt>``.

    With ``slots``, the capture's first row stands for one GPU per slot, its ``index``,
    ``pci.bus_id`` and ``uuid`` rewritten to that GPU: a fake multi-GPU host of one model.
    ``overrides`` then puts other cells, as nvidia-smi prints them, into one GPU's row
    (``{"0000:18:00.0": {"gpu_recovery_action": "Reset"}}``): the fault a capture lacks.
    """
    for field in query:
        if canonical(field) not in cap.fields:
            return f'Field "{field}" is not a valid field to query.\n\n', 2
    cols = [cap.fields.index(canonical(f)) for f in query]
    rows = cap.rows
    if slots is not None:
        rows = []
        for i, slot in enumerate(slots):
            row = list(cap.rows[0])
            for name, value in (
                ("index", str(i)),
                ("pci.bus_id", bus_id(slot)),
                ("uuid", gpu_uuid(slot)),
            ):
                if name in cap.fields:
                    row[cap.fields.index(name)] = value
            for name, value in (overrides or {}).get(slot, {}).items():
                row[cap.fields.index(canonical(name))] = value
            rows.append(row)
    opts = set(fmt.split(","))
    out = []
    if "noheader" not in opts:
        out.append(", ".join(query))
    for row in rows:
        cells = [row[c] for c in cols]
        if "nounits" in opts:
            cells = [nounits(c) for c in cells]
        out.append(", ".join(cells))
    return "\n".join(out) + "\n", 0


_NVLINK_HEADER = re.compile(r"^GPU \d+: (?P<name>.*?)(?: \(UUID: [^)]*\))?$")
_NVLINK_LINE = re.compile(r"^(?P<indent>\s*)Link (?P<n>\d+): (?P<value>.*)$")


def apps_capture(name: str, slot: str) -> list[dict[str, Any]]:
    """The processes of a real ``--query-compute-apps`` capture in data/corpus/csv, as the
    fake nvidia-smi's ``"apps"`` entries, all on the GPU in ``slot``; each ``"name"`` is the
    capture's ``process_name`` (the agent never reads that column; the fake proc tree does)."""
    from gpuagent.sources.processes import apps  # noqa: PLC0415 - only the fake needs it

    with open(os.path.join(CORPUS, "csv", name), encoding="utf-8") as f:
        text = f.read()
    header, *rows = (ln for ln in text.splitlines() if ln.strip())
    column = [c.strip() for c in header.split(",")].index("process_name")
    names = [row.split(",")[column].strip() for row in rows]
    return [
        {"slot": slot, "pid": a.pid, "name": n, "mib": a.used_memory_mib}
        for a, n in zip(apps.parse(text).apps, names, strict=True)
    ]


def nvlink_capture(name: str) -> str:
    """The text of ``corpus/nvlink/<name>``, or of ``corpus/errors/<name>``."""
    for sub in ("nvlink", "errors"):
        path = os.path.join(CORPUS, sub, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", newline="") as f:
                return f.read()
    raise FileNotFoundError(name)


def nvlink_answer(
    text: str,
    slots: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    counters: bool = False,
    links: int = 18,
) -> str:
    """``nvidia-smi nvlink --status`` (or ``--errorcounters``) from a capture's text.

    Without ``slots``, the capture as it is.  With ``slots``, its first GPU block stands for
    one GPU per slot, the header renumbered and given the UUID of :func:`gpu_uuid`.  For
    ``--status`` the block's link lines are kept; for ``--errorcounters`` the capture's
    group of link 0 is repeated for each of ``links`` links (the only capture is trimmed).
    ``overrides`` then changes one GPU: ``{slot: "<whole-GPU line>"}`` replaces its block
    (MIG mode, all links inactive); ``{slot: {"3": "<inactive>"}}`` a link's value, and
    ``{slot: {"14": {"Recovery Errors": "542"}}}`` a link's counter.
    """
    if slots is None:
        return text
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if _NVLINK_HEADER.match(ln))
    header = _NVLINK_HEADER.match(lines[start])
    assert header is not None
    body: list[str] = []
    for ln in lines[start + 1 :]:
        if _NVLINK_HEADER.match(ln):
            break
        body.append(ln)
    if counters:
        group = [ln for ln in body if (m := _NVLINK_LINE.match(ln)) and m["n"] == "0"]
        one = [*group, ""]
        body = [ln.replace("Link 0:", f"Link {n}:") for n in range(links) for ln in one]
    out = []
    for i, slot in enumerate(slots):
        out.append(f"GPU {i}: {header['name']} (UUID: {gpu_uuid(slot)})")
        change = (overrides or {}).get(slot, {})
        if isinstance(change, str):
            out.append(change)
            continue
        for ln in body:
            m = _NVLINK_LINE.match(ln)
            new = change.get(m["n"]) if m else None
            line = ln
            if m and isinstance(new, str):
                line = f"{m['indent']}Link {m['n']}: {new}"
            elif m and isinstance(new, dict):
                name, _, _ = m["value"].rpartition(": ")
                if name in new:
                    line = f"{m['indent']}Link {m['n']}: {name}: {new[name]}"
            out.append(line)
    return "\n".join(out) + "\n"
