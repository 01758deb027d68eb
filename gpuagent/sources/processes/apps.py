"""The GPUs' compute processes: ``nvidia-smi --query-compute-apps`` asked and parsed (pure).

The agent asks for ``gpu_uuid,pid,used_memory`` as CSV without header or units, and never
for ``process_name``: nvidia-smi prints a process's name as the process gave it, unquoted, so
a name with a newline is a second, well-formed row by the time it is read, and one with a
comma or a quote hides its own.  Without it no cell of a row is a user's to shape; the names
come from ``/proc`` (:mod:`gpuagent.sources.processes.comm`).

:func:`parse` also reads the header-and-units form (``--format=csv``: ``used_gpu_memory
[MiB]``, ``2566 MiB``) by its column names, as captured from real hosts; columns it does not
use (``process_name`` among them) are skipped.  A MIG instance's processes are reported
against the parent GPU's UUID.  What nvidia-smi cannot give (``[N/A]``, ``[Not Supported]``)
is ``None``; a line that is no process (a PID outside 1..4294967295, a cell that does not
parse, the wrong number of cells) is returned as unreadable with the reason, never guessed
at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ARGS", "FIELDS", "MAX_PID", "App", "Parsed", "Unreadable", "parse"]

FIELDS = ("gpu_uuid", "pid", "used_memory")
ARGS = (f"--query-compute-apps={','.join(FIELDS)}", "--format=csv,noheader,nounits")
# A PID is a D-Bus uint32 where systemd is asked about it (GetUnitByPID); 0 there means the
# caller itself.
MAX_PID = 2**32 - 1

# The header's names for the same fields (used_memory is an alias nvidia-smi prints as
# used_gpu_memory); a unit in brackets follows a name.
_ALIASES = {"used_gpu_memory": "used_memory"}
_HEADER_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")
_MISSING = frozenset({"", "N/A", "Not Supported"})
_MIB = re.compile(r"^(?P<value>\d{1,12})(?:\s*MiB)?$")
_PID = re.compile(r"^\d{1,10}$")
_UUID = re.compile(r"^(?:GPU|MIG)-[0-9A-Za-z-]{1,80}$")
# nvidia-smi's own words for "none" in place of the CSV.
_NONE = ("no running processes found", "no running compute processes found")


@dataclass(frozen=True)
class App:
    """One compute process on one GPU: ``gpu_uuid`` (field ``gpu_uuid``; ``GPU-…``, the
    parent GPU's under MIG), ``pid`` (``pid``: 1..4294967295, the number in nvidia-smi's PID
    namespace) and ``used_memory_mib`` (``used_memory``, MiB); ``None`` where nvidia-smi
    cannot tell."""

    gpu_uuid: str | None
    pid: int
    used_memory_mib: int | None


@dataclass(frozen=True)
class Unreadable:
    """A line that is no process (``line``, stripped) and why (``reason``, one phrase naming
    the cell: ``pid '4294967296' is not 1..4294967295``)."""

    line: str
    reason: str


@dataclass(frozen=True)
class Parsed:
    """The processes of one answer, in nvidia-smi's order, and the lines that are none."""

    apps: tuple[App, ...]
    unreadable: tuple[Unreadable, ...] = ()


def _missing(text: str) -> bool:
    return text in _MISSING or (text.startswith("[") and text.endswith("]"))


def _header(cells: list[str]) -> list[str] | None:
    """The field of each column when ``cells`` is a header line, else ``None``."""
    names = [_HEADER_UNIT.sub("", c).strip() for c in cells]
    names = [_ALIASES.get(n, n) for n in names]
    return names if "pid" in names and "gpu_uuid" in names else None


def _app(columns: list[str], cells: list[str]) -> App:
    """One process from one line's cells; raises ``ValueError`` (the reason) for a line that
    is none."""
    if len(cells) != len(columns):
        raise ValueError(f"{len(cells)} cells where {len(columns)} were asked for")
    by = dict(zip(columns, cells, strict=True))
    pid, uuid, memory = (by.get(f, "") for f in ("pid", "gpu_uuid", "used_memory"))
    if not _PID.match(pid) or not 1 <= int(pid) <= MAX_PID:
        raise ValueError(f"pid {pid!r} is not 1..{MAX_PID}")
    if not _missing(uuid) and not _UUID.match(uuid):
        raise ValueError(f"gpu_uuid {uuid!r} is no GPU's UUID")
    mib = None
    if not _missing(memory):
        m = _MIB.match(memory)
        if m is None:
            raise ValueError(f"used_memory {memory!r} is no number of MiB")
        mib = int(m["value"])
    return App(None if _missing(uuid) else uuid, int(pid), mib)


def parse(text: str) -> Parsed:
    """The processes in one answer of ``--query-compute-apps`` (either CSV form); an empty
    answer, or nvidia-smi's "No running processes found", is none.  nvidia-smi quotes no
    cell, so a line's cells are what its commas separate.  Never raises."""
    apps: list[App] = []
    unreadable: list[Unreadable] = []
    columns = list(FIELDS)
    for line in text.splitlines():
        if not line.strip() or line.strip().lower().rstrip(".") in _NONE:
            continue
        cells = [c.strip() for c in line.split(",")]
        # A header names gpu_uuid in one of its cells: a process's line is not looked at as one.
        header = _header(cells) if "gpu_uuid" in line else None
        if header is not None:
            columns = header
            continue
        try:
            apps.append(_app(columns, cells))
        except ValueError as e:
            unreadable.append(Unreadable(line.strip(), str(e)))
    return Parsed(tuple(apps), tuple(unreadable))
