"""nvidia-smi: the query, its parse and the classification of its failures (pure).

nvidia-smi prints its errors on stdout with a non-zero exit, so stdout is always read and
classified together with the exit code.
"""

from __future__ import annotations

import csv
import functools
import math
import re
from dataclasses import dataclass
from dataclasses import field as dc_field
from enum import Enum

from gpuagent.schema import Value
from gpuagent.sources.bus.pciaddr import is_bus_id, sysfs_slot
from gpuagent.untrusted import whole
from gpuagent.views import Failure, Row

__all__ = [
    "FALLBACKS",
    "FIELDS",
    "HINTS",
    "REQUIRES_RESET",
    "Output",
    "ParseError",
    "beside_rows",
    "classify",
    "command",
    "gpu_error_slot",
    "invalid_field",
    "key",
    "parse",
    "parse_output",
]

# Text fields the health rules read (gpuagent.sources.probe.rules).
_HEALTH_TEXT = (
    "persistence_mode",
    "inforom.checksum_validation",
    "gpu_recovery_action",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "retired_pages.pending",
    "fabric.state",
    "fabric.status",
    "mig.mode.pending",
)
# The query, in nvidia-smi's own field names; nounits values: temperature.gpu °C,
# temperature.gpu.tlimit °C left below the GPU's maximum operating temperature (recent drivers
# only; an older one rejects it and it is dropped), utilization.* %, memory.* MiB, power.* W,
# clocks.* MHz, fan.speed %, pcie.link.width.* lanes, pcie.link.gen.* the PCIe generation
# (1 to 6; .max is the highest both the GPU and its root port support).  The fields from
# clocks_event_reasons.active on feed the health rules (gpuagent.sources.probe.rules);
# retired_pages.*.count the retired pages' (gpuagent.sources.probe.pages), [N/A] on GPUs that
# remap rows instead (Ampere and later).
# remapped_rows.histogram.* is never asked for: it floods the kernel log of vGPU guests.
FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "pstate",
    "temperature.gpu",
    "temperature.gpu.tlimit",
    "utilization.gpu",
    "utilization.memory",
    "memory.total",
    "memory.used",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.mem",
    "fan.speed",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
    "mig.mode.current",
    "clocks_event_reasons.active",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    *_HEALTH_TEXT,
)

# Older drivers know a field by another name: asked for when the first is rejected.
# Drivers 590 and later also call pcie.link.gen.current pcie.link.gen.gpucurrent; every driver
# of the corpus (465.27 to 610.57.04) knows the first name, so the second is only asked for
# by a driver that drops it.
FALLBACKS: dict[str, str] = {
    "clocks_event_reasons.active": "clocks_throttle_reasons.active",
    "pcie.link.gen.current": "pcie.link.gen.gpucurrent",
}

_TEXT = frozenset(
    {
        "uuid",
        "name",
        "pci.bus_id",
        "driver_version",
        "pstate",
        "mig.mode.current",
        "clocks_event_reasons.active",
        "clocks_throttle_reasons.active",
        *_HEALTH_TEXT,
    }
)
# "ERR!": nvidia-smi could not read that one value (its table view prints the same); only that
# field of that GPU is unknown.
_ERROR = "ERR!"
_MISSING = frozenset({"", "N/A", "Not Supported", _ERROR})
# Readings no working GPU can give (nounits): a value outside its range is a malformed value
# of that GPU, left blank, never a fault.  PCIe links are x1 to x32 wide (x0: not reported).
_POSSIBLE: dict[str, tuple[float, float]] = {
    # Below absolute zero, or above the melting point of silicon.
    "temperature.gpu": (-273.15, 1414),
    "utilization.gpu": (0, 100),
    "utilization.memory": (0, 100),
    "memory.total": (0, math.inf),
    "memory.used": (0, math.inf),
    "power.draw": (0, math.inf),
    "power.limit": (0, math.inf),
    "clocks.sm": (0, math.inf),
    "clocks.mem": (0, math.inf),
    "fan.speed": (0, math.inf),
    "ecc.errors.uncorrected.volatile.total": (0, math.inf),
    "retired_pages.single_bit_ecc.count": (0, math.inf),
    "retired_pages.double_bit.count": (0, math.inf),
    "pcie.link.width.current": (0, 32),
    "pcie.link.width.max": (0, 32),
    "pcie.link.gen.current": (0, math.inf),
    "pcie.link.gen.gpucurrent": (0, math.inf),
    "pcie.link.gen.max": (0, math.inf),
}
# A row names its GPU by one of these; one that names it by neither is no GPU's.
_IDENTITY = ("pci.bus_id", "uuid")
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)", re.ASCII)
# Windows consoles turn the quotes into curly ones.
_QUOTE = '"\u201c\u201d'
_INVALID_FIELD = re.compile(rf"Field [{_QUOTE}]([^{_QUOTE}]+)[{_QUOTE}] is not a valid field")
_WARNING = re.compile(r"^WARNING: ")
_INDEX_DIGITS = 6
# Whole numbers of up to 15 digits are exact as floats (below 2**53).
_EXACT_DIGITS = 15
# What nvidia-smi prints for each field of a GPU that needs a reset (NVML_ERROR_RESET_REQUIRED).
REQUIRES_RESET = "[GPU requires reset]"
# One GPU's error beside the rows of the others: "Unable to determine the device handle for
# GPU0000:CF:00.0: Unknown Error" (newer drivers glue the bus id to "GPU"), "... for GPU
# 0000:03:00.0: GPU is lost.  Reboot the system to recover this GPU".
_GPU_ERROR = re.compile(
    r"^(?:Unable to determine the device handle for )?GPU ?"
    r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]):\s*(?P<reason>.*\S)\s*$"
)
_INFOROM = re.compile(r"^WARNING: infoROM is corrupted at gpu (?P<bus>\S+)\s*$", re.IGNORECASE)


def gpu_error_slot(line: str) -> str | None:
    """The sysfs slot of the GPU a line of nvidia-smi's says it could not answer for
    (``Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost``), else None."""
    m = _GPU_ERROR.match(line.strip())
    return sysfs_slot(m["bus"]) if m else None


def beside_rows(line: str) -> bool:
    """Whether ``line`` is what nvidia-smi prints beside the rows of an answer: one GPU's
    error (the others' rows are the answer) or the infoROM warning."""
    text = line.strip()
    return bool(_GPU_ERROR.match(text) or _INFOROM.match(text))


class ParseError(Exception):
    """Output that is not the CSV asked for; ``line`` is the offending line, ``columns`` its
    cell count where that was what was wrong (``20 columns where 30 were asked for``)."""

    def __init__(self, reason: str, line: str, columns: int | None = None) -> None:
        super().__init__(reason)
        self.line = line
        self.columns = columns

    @property
    def csv(self) -> bool:
        """Whether the offending line is CSV of the wrong shape (two cells or more), not an
        error message: then no word in it (a ``[GPU requires reset]`` cell, ``GPU is lost``)
        says why the probe failed."""
        return self.columns is not None and self.columns > 1


def command(binary: str, fields: tuple[str, ...]) -> list[str]:
    """The argv of one probe: the fields in order, CSV without header or units."""
    return [binary, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


class _Kind(Enum):
    """How a field's cell becomes its value."""

    TEXT = "text"
    BUS_ID = "bus_id"
    INDEX = "index"
    NUMBER = "number"


def _kind(field: str) -> _Kind:
    if field == "pci.bus_id":
        return _Kind.BUS_ID
    if field in _TEXT:
        return _Kind.TEXT
    return _Kind.INDEX if field == "index" else _Kind.NUMBER


# Each field of a query with its kind and its possible range (None: any); a query is
# parsed every tick, its fields looked up once.
_Plan = tuple[tuple[str, _Kind, tuple[float, float] | None], ...]


@functools.lru_cache(maxsize=16)
def _plan(fields: tuple[str, ...]) -> _Plan:
    return tuple((f, _kind(f), _POSSIBLE.get(f)) for f in fields)


def _value(kind: _Kind, text: str) -> Value:
    """The value of a cell that is not nvidia-smi's word for none (:data:`_MISSING`, bracketed
    text); raises ``ValueError`` for text that is not of ``kind``."""
    if kind is _Kind.BUS_ID:
        if not is_bus_id(text.lower()):
            raise ValueError(text)
        return text
    if kind is _Kind.INDEX:
        index = whole(text, _INDEX_DIGITS)
        if index is None:
            raise ValueError(text)
        return index
    if not _NUMBER.fullmatch(text):
        raise ValueError(text)
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(text)
    return int(number) if number.is_integer() and "." not in text else number


@dataclass(frozen=True)
class Output:
    """What one answer of nvidia-smi says, GPU by GPU.

    ``rows`` one per GPU that answered; ``gpu_errors`` the error text of each GPU nvidia-smi
    named in an error line instead of a row, by sysfs slot; ``requires_reset`` the fields that
    read ``[GPU requires reset]``, by sysfs slot; ``inforom`` the slots nvidia-smi warned have a
    corrupted infoROM; ``warnings`` every ``WARNING:`` line; ``reasons`` for each row, the
    bracketed text (or ``ERR!``) of each field it gave instead of a value (``[N/A]``, ``[GPU
    requires reset]`` …), which the row holds as ``None``; ``malformed`` one line for each row left
    out as no GPU's and each impossible value left blank (for the debug log).
    """

    rows: list[Row]
    gpu_errors: dict[str, str] = dc_field(default_factory=dict)
    requires_reset: dict[str, tuple[str, ...]] = dc_field(default_factory=dict)
    inforom: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    reasons: tuple[dict[str, str], ...] = ()
    malformed: tuple[str, ...] = ()


def _split_lines(stdout: str) -> tuple[list[str], dict[str, str], list[str]]:
    """CSV lines, per-GPU error lines by slot, and ``WARNING:`` lines of one answer."""
    csv_lines: list[str] = []
    errors: dict[str, str] = {}
    warnings: list[str] = []
    last_error: str | None = None
    for line in stdout.splitlines():
        if not line.strip():
            continue
        if last_error is not None and line[:1].isspace():
            # A console that wraps at 80 columns continues the error on an indented line.
            errors[last_error] = f"{errors[last_error]} {line.strip()}"
            continue
        last_error = None
        if _WARNING.match(line):
            warnings.append(line.strip())
        elif m := _GPU_ERROR.match(line.strip()):
            last_error = sysfs_slot(m["bus"])
            errors[last_error] = m["reason"]
        else:
            csv_lines.append(line)
    return csv_lines, errors, warnings


def parse_output(stdout: str, fields: tuple[str, ...]) -> Output:
    """Parse an answer that may mix rows with per-GPU errors and warnings (see :class:`Output`).

    An answer of per-GPU errors alone (every GPU lost) has no rows: it still says which GPU is
    sick.  A row that names its GPU by neither ``pci.bus_id`` nor ``uuid`` (all ``[N/A]``) is
    no GPU's and is left out, unless it says ``[GPU requires reset]``; it and each impossible
    value (:func:`parse`) get a line in :attr:`Output.malformed`.  Raises :class:`ParseError`
    like :func:`parse` when the rest is not the CSV asked for, or when there is neither a row
    nor a per-GPU error.
    """
    csv_lines, errors, warnings = _split_lines(stdout)
    inforom = tuple(sysfs_slot(m["bus"]) for w in warnings if (m := _INFOROM.match(w)))
    if not csv_lines:
        if errors:
            return Output([], errors, {}, inforom, tuple(warnings))
        raise ParseError("no rows", stdout[:200])
    rows: list[Row] = []
    reset: dict[str, tuple[str, ...]] = {}
    reasons: list[dict[str, str]] = []
    malformed: list[str] = []
    for number, (said, row, odd) in enumerate(_read(csv_lines, fields), 1):
        if REQUIRES_RESET not in said.values() and _anonymous(row, fields):
            malformed.append(f"row {number}: neither pci.bus_id nor uuid, no GPU's; left out")
            continue
        rows.append(row)
        reasons.append(said)
        slot = key(row)
        malformed += [f"GPU {slot}: {f}: not a possible value: {t!r}; left blank" for f, t in odd]
        if REQUIRES_RESET in said.values():
            reset[slot] = tuple(f for f, c in said.items() if c == REQUIRES_RESET)
    if not rows and not errors:
        raise ParseError(malformed[0], csv_lines[0][:300], len(fields))
    return Output(rows, errors, reset, inforom, tuple(warnings), tuple(reasons), tuple(malformed))


def _anonymous(row: Row, fields: tuple[str, ...]) -> bool:
    asked = [f for f in _IDENTITY if f in fields]
    return bool(asked) and all(row[f] is None for f in asked)


def key(row: Row) -> str:
    """The slot a row is kept under: its ``pci.bus_id`` in sysfs form (``0000:3b:00.0``,
    whatever the spelling), else ``index:N`` (``index:None`` without an index)."""
    bus_id = row.get("pci.bus_id")
    return sysfs_slot(bus_id) if isinstance(bus_id, str) else f"index:{row.get('index')}"


def parse(stdout: str, fields: tuple[str, ...]) -> list[Row]:
    """Parse ``--format=csv,noheader,nounits`` output into one row per GPU.

    Missing values (``[N/A]``, ``N/A``, ``[Not Supported]``, ``[Unknown Error]``, any other
    bracketed text, ``ERR!``, empty) become ``None`` for that field, and so does a value no
    GPU can read (a negative link width, memory or clock, a utilization above 100 %, a
    temperature below absolute zero); text fields stay strings; numbers become int or float.
    ``WARNING:`` lines (infoROM) and blank lines are skipped.  Raises :class:`ParseError` on a
    wrong column count, a non-numeric value in a numeric field, or one bus id on two rows
    (in whatever spellings).
    """
    lines = [ln for ln in stdout.splitlines() if ln.strip() and not _WARNING.match(ln)]
    if not lines:
        raise ParseError("no rows", stdout[:200])
    return [row for _, row, _ in _read(lines, fields)]


def _read(
    lines: list[str], fields: tuple[str, ...]
) -> list[tuple[dict[str, str], Row, list[tuple[str, str]]]]:
    """Each CSV line's words of nvidia-smi instead of a value (``[N/A]``, ``ERR!`` …: the
    field's :attr:`Output.reasons`), its row, and its impossible values (field, text) left out
    of the row; raises :class:`ParseError` as :func:`parse` does."""
    out: list[tuple[dict[str, str], Row, list[tuple[str, str]]]] = []
    plan = _plan(fields)
    for line in lines:
        try:
            cells = [c.strip() for c in next(csv.reader([line], skipinitialspace=True))]
        except csv.Error as e:
            raise ParseError(f"not CSV: {e}", line[:300]) from None
        if len(cells) != len(fields):
            raise ParseError(
                f"{len(cells)} columns where {len(fields)} were asked for", line, len(cells)
            )
        said: dict[str, str] = {}
        row: Row = {}
        odd: list[tuple[str, str]] = []
        # One pass a cell, no call for the common ones (text, none): a tick parses every cell.
        for (field, kind, possible), cell in zip(plan, cells, strict=True):
            bracketed = cell[:1] == "[" and cell[-1:] == "]"
            if bracketed or cell in _MISSING:
                if bracketed or cell == _ERROR:
                    said[field] = cell
                row[field] = None
                continue
            if kind is _Kind.TEXT:
                row[field] = cell
                continue
            value: Value
            if kind is _Kind.NUMBER and cell.isdecimal() and len(cell) <= _EXACT_DIGITS:
                value = int(cell)  # what _value makes of it, float() exact at this length
            else:
                try:
                    value = _value(kind, cell)
                except ValueError:
                    what = "a PCI bus id" if kind is _Kind.BUS_ID else "a number"
                    raise ParseError(f"{field}: not {what}: {cell[:80]!r}", line[:300]) from None
            if (
                possible is not None
                and isinstance(value, int | float)
                and not possible[0] <= value <= possible[1]
            ):
                odd.append((field, cell[:80]))
                value = None
            row[field] = value
        out.append((said, row, odd))
    slots = [sysfs_slot(b) for _, r, _ in out if isinstance(b := r.get("pci.bus_id"), str)]
    if len(set(slots)) != len(slots):
        raise ParseError("the same pci.bus_id on two rows", "\n".join(lines)[:300])
    return out


def invalid_field(stdout: str) -> str | None:
    """The field nvidia-smi rejected (``Field "X" is not a valid field to query.``), if any."""
    m = _INVALID_FIELD.search(stdout)
    return m.group(1) if m else None


_BY_TEXT: tuple[tuple[str, Failure], ...] = (
    ("couldn't communicate with the nvidia driver", Failure.DRIVER_NOT_LOADED),
    ("driver/library version mismatch", Failure.VERSION_MISMATCH),
    ("couldn't find libnvidia-ml.so", Failure.LIBRARY_MISSING),
    ("no devices were found", Failure.NO_DEVICES),
    # The agent's own trouble first: a handle NVML could not get for want of permission, or
    # of /proc and /sys, is the sandbox's doing, not a lost GPU's.
    ("insufficient permissions", Failure.PERMISSION_DENIED),
    # NVML_ERROR_OPERATING_SYSTEM: /proc/driver/nvidia or /sys hidden from NVML.
    ("gpu access blocked by the operating system", Failure.BLOCKED_BY_OS),
    ("gpu is lost", Failure.GPU_LOST),
    ("requires reset", Failure.GPU_LOST),
    ("unable to determine the device handle", Failure.GPU_LOST),
)
_BY_EXIT = {
    4: Failure.PERMISSION_DENIED,
    6: Failure.NO_DEVICES,
    9: Failure.DRIVER_NOT_LOADED,
    12: Failure.LIBRARY_MISSING,
    15: Failure.GPU_LOST,
    17: Failure.BLOCKED_BY_OS,
    18: Failure.VERSION_MISMATCH,
}


def classify(exit_code: int, stdout: str) -> Failure:
    """Class of a failed run from its exit code and output (text first: codes drift)."""
    low = stdout.lower()
    for needle, failure in _BY_TEXT:
        if needle in low:
            return failure
    return _BY_EXIT.get(exit_code, Failure.OTHER)


HINTS: dict[Failure, str] = {
    Failure.NOT_FOUND: "install the NVIDIA driver utilities or set nvidia_smi to its path",
    Failure.PERMISSION_DENIED: "check that the agent may execute nvidia-smi and open /dev/nvidia*",
    Failure.TIMEOUT: "nvidia-smi hangs; a GPU or the driver may be wedged (see dmesg for Xid); "
    "without persistence mode every probe re-initialises the GPUs (1-3 s per GPU): enable "
    "nvidia-persistenced",
    Failure.DRIVER_NOT_LOADED: "load the nvidia kernel module or finish the driver installation",
    Failure.LIBRARY_MISSING: "libnvidia-ml.so is missing; reinstall the driver's NVML library",
    Failure.VERSION_MISMATCH: "a driver upgrade awaits a module reload or a reboot",
    Failure.NO_DEVICES: "the driver sees no GPU; check dmesg, BIOS settings and the PCI link",
    Failure.GPU_LOST: "a GPU fell off the bus; check dmesg for Xid 79 and reset or reboot",
    Failure.BLOCKED_BY_OS: (
        "a sandbox hides /proc or /sys from NVML; check gpuagent.service and its drop-ins"
        " for ProcSubset=, PrivateDevices=, InaccessiblePaths= or TemporaryFileSystem="
    ),
    Failure.UNPARSEABLE: "nvidia-smi printed output the agent cannot read; see the debug log",
    Failure.OTHER: "run nvidia-smi by hand to see the error",
}
