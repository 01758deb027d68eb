"""The GPUs' compute processes: ``nvidia-smi --query-compute-apps`` asked and parsed (pure).

The agent asks for ``gpu_uuid,pid,process_name,used_memory`` as CSV without header or units.
:func:`parse` also reads the header-and-units form (``--format=csv``: ``used_gpu_memory
[MiB]``, ``2566 MiB``) by its column names, as captured from real hosts.  A MIG instance's
processes are reported against the parent GPU's UUID.  What nvidia-smi cannot give
(``[N/A]``, ``[Insufficient Permissions]``, ``[Not Supported]``) is ``None``; a line that is
no process (a bad PID, the wrong number of cells) is returned as unreadable, never guessed at.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

__all__ = ["ARGS", "FIELDS", "App", "Parsed", "parse"]

FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
ARGS = (f"--query-compute-apps={','.join(FIELDS)}", "--format=csv,noheader,nounits")

# The header's names for the same fields (used_memory is an alias nvidia-smi prints as
# used_gpu_memory); a unit in brackets follows a name.
_ALIASES = {"used_gpu_memory": "used_memory"}
_HEADER_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")
_MISSING = frozenset({"", "N/A", "Not Supported"})
_MIB = re.compile(r"^(?P<value>\d{1,12})(?:\s*MiB)?$")
_PID = re.compile(r"^\d{1,10}$")
# nvidia-smi's own words for "none" in place of the CSV.
_NONE = ("no running processes found", "no running compute processes found")


@dataclass(frozen=True)
class App:
    """One compute process on one GPU: ``gpu_uuid`` (field ``gpu_uuid``; ``GPU-…``, the
    parent GPU's under MIG), ``pid`` (``pid``: the number in nvidia-smi's PID namespace),
    ``name`` (``process_name``: a path or a command name) and ``used_memory_mib``
    (``used_memory``, MiB); ``None`` where nvidia-smi cannot tell."""

    gpu_uuid: str | None
    pid: int
    name: str | None
    used_memory_mib: int | None


@dataclass(frozen=True)
class Parsed:
    """The processes of one answer, in nvidia-smi's order, and the lines that are none."""

    apps: tuple[App, ...]
    unreadable: tuple[str, ...] = ()


def _missing(text: str) -> bool:
    return text in _MISSING or (text.startswith("[") and text.endswith("]"))


def _header(cells: list[str]) -> list[str] | None:
    """The field of each column when ``cells`` is a header line, else ``None``."""
    names = [_HEADER_UNIT.sub("", c).strip() for c in cells]
    names = [_ALIASES.get(n, n) for n in names]
    return names if "pid" in names and "gpu_uuid" in names else None


def _app(columns: list[str], cells: list[str]) -> App:
    """One process from one line's cells; raises ``ValueError`` for a line that is none."""
    if len(cells) != len(columns):
        raise ValueError(f"{len(cells)} cells where {len(columns)} were asked for")
    by = dict(zip(columns, cells, strict=True))
    pid = by.get("pid", "")
    if not _PID.match(pid):
        raise ValueError(f"pid {pid!r}")
    uuid, name, memory = (by.get(f, "") for f in ("gpu_uuid", "process_name", "used_memory"))
    mib = None
    if not _missing(memory):
        m = _MIB.match(memory)
        if m is None:
            raise ValueError(f"used_memory {memory!r}")
        mib = int(m["value"])
    return App(None if _missing(uuid) else uuid, int(pid), None if _missing(name) else name, mib)


def parse(text: str) -> Parsed:
    """The processes in one answer of ``--query-compute-apps`` (either CSV form); an empty
    answer, or nvidia-smi's "No running processes found", is none.  Never raises."""
    apps: list[App] = []
    unreadable: list[str] = []
    columns = list(FIELDS)
    for line in text.splitlines():
        if not line.strip() or line.strip().lower().rstrip(".") in _NONE:
            continue
        try:
            cells = [c.strip() for c in next(csv.reader([line], skipinitialspace=True))]
        except (csv.Error, StopIteration):
            unreadable.append(line.strip())
            continue
        header = _header(cells)
        if header is not None:
            columns = header
            continue
        try:
            apps.append(_app(columns, cells))
        except ValueError:
            unreadable.append(line.strip())
    return Parsed(tuple(apps), tuple(unreadable))
