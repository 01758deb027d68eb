"""nvidia-smi: the query, its parse and the classification of its failures (pure).

nvidia-smi prints its errors on stdout with a non-zero exit, so stdout is always read and
classified together with the exit code.
"""

from __future__ import annotations

import csv
import math
import re
from enum import StrEnum

__all__ = [
    "FALLBACKS",
    "FIELDS",
    "HINTS",
    "Failure",
    "ParseError",
    "Row",
    "Value",
    "classify",
    "command",
    "invalid_field",
    "parse",
    "sysfs_slot",
]

Value = int | float | str | None
Row = dict[str, Value]

# The query, in nvidia-smi's own field names; nounits values: temperature.gpu °C,
# temperature.gpu.tlimit °C left below the GPU's maximum operating temperature (recent drivers
# only; an older one rejects it and it is dropped), utilization.* %, memory.* MiB, power.* W,
# clocks.* MHz, fan.speed %.
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
    "mig.mode.current",
    "clocks_event_reasons.active",
)

# Older drivers know a field by another name: asked for when the first is rejected.
FALLBACKS: dict[str, str] = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}

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
    }
)
_MISSING = frozenset({"", "N/A", "Not Supported"})
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)")
# Windows consoles turn the quotes into curly ones.
_QUOTE = '"\u201c\u201d'
_INVALID_FIELD = re.compile(rf"Field [{_QUOTE}]([^{_QUOTE}]+)[{_QUOTE}] is not a valid field")
_WARNING = re.compile(r"^WARNING: ")
_BUS_ID = re.compile(r"(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<rest>[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])")
_INDEX_DIGITS = 6


class Failure(StrEnum):
    """Why a probe produced no samples."""

    NOT_FOUND = "not_found"
    PERMISSION_DENIED = "permission_denied"
    TIMEOUT = "timeout"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    LIBRARY_MISSING = "library_missing"
    VERSION_MISMATCH = "version_mismatch"
    NO_DEVICES = "no_devices"
    GPU_LOST = "gpu_lost"
    BLOCKED_BY_OS = "blocked_by_os"
    UNPARSEABLE = "unparseable"
    OTHER = "other"


class ParseError(Exception):
    """Output that is not the CSV asked for; ``line`` is the offending line."""

    def __init__(self, reason: str, line: str) -> None:
        super().__init__(reason)
        self.line = line


def command(binary: str, fields: tuple[str, ...]) -> list[str]:
    """The argv of one probe: the fields in order, CSV without header or units."""
    return [binary, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


def sysfs_slot(bus_id: str) -> str:
    """nvidia-smi's ``pci.bus_id`` (``00000000:41:00.0``) in sysfs form (``0000:41:00.0``).

    A bus id without a domain (``41:00.0``) is returned lower-cased as it is.
    """
    m = _BUS_ID.fullmatch(bus_id.strip().lower())
    if m is None or m["domain"] is None:
        return bus_id.strip().lower()
    return f"{int(m['domain'], 16):04x}:{m['rest']}"


def _value(field: str, text: str) -> Value:
    if text in _MISSING or (text.startswith("[") and text.endswith("]")):
        return None
    if field == "pci.bus_id" and not _BUS_ID.fullmatch(text.lower()):
        raise ValueError(text)
    if field in _TEXT:
        return text
    if field == "index":
        if not text.isdigit() or len(text) > _INDEX_DIGITS:
            raise ValueError(text)
        return int(text)
    if not _NUMBER.fullmatch(text):
        raise ValueError(text)
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(text)
    return int(number) if number.is_integer() and "." not in text else number


def parse(stdout: str, fields: tuple[str, ...]) -> list[Row]:
    """Parse ``--format=csv,noheader,nounits`` output into one row per GPU.

    Missing values (``[N/A]``, ``N/A``, ``[Not Supported]``, ``[Unknown Error]``, any other
    bracketed text, empty) become ``None`` for that field; text fields stay strings; numbers
    become int or float.  ``WARNING:`` lines (infoROM) and blank lines are skipped.  Raises
    :class:`ParseError` on a wrong column count or a non-numeric value in a numeric field.
    """
    rows: list[Row] = []
    lines = [ln for ln in stdout.splitlines() if ln.strip() and not _WARNING.match(ln)]
    for line in lines:
        try:
            cells = next(csv.reader([line], skipinitialspace=True))
        except csv.Error as e:
            raise ParseError(f"not CSV: {e}", line[:300]) from None
        if len(cells) != len(fields):
            raise ParseError(f"{len(cells)} columns where {len(fields)} were asked for", line)
        row: Row = {}
        for field, cell in zip(fields, cells, strict=True):
            try:
                row[field] = _value(field, cell.strip())
            except ValueError:
                what = "a PCI bus id" if field == "pci.bus_id" else "a number"
                text = cell.strip()[:80]
                raise ParseError(f"{field}: not {what}: {text!r}", line[:300]) from None
        rows.append(row)
    if not rows:
        raise ParseError("no rows", stdout[:200])
    bus_ids = [r["pci.bus_id"] for r in rows if r.get("pci.bus_id") is not None]
    if len(set(bus_ids)) != len(bus_ids):
        raise ParseError("the same pci.bus_id on two rows", stdout[:300])
    return rows


def invalid_field(stdout: str) -> str | None:
    """The field nvidia-smi rejected (``Field "X" is not a valid field to query.``), if any."""
    m = _INVALID_FIELD.search(stdout)
    return m.group(1) if m else None


_BY_TEXT: tuple[tuple[str, Failure], ...] = (
    ("couldn't communicate with the nvidia driver", Failure.DRIVER_NOT_LOADED),
    ("driver/library version mismatch", Failure.VERSION_MISMATCH),
    ("couldn't find libnvidia-ml.so", Failure.LIBRARY_MISSING),
    ("no devices were found", Failure.NO_DEVICES),
    ("gpu is lost", Failure.GPU_LOST),
    ("unable to determine the device handle", Failure.GPU_LOST),
    ("insufficient permissions", Failure.PERMISSION_DENIED),
    # NVML_ERROR_OPERATING_SYSTEM: /proc/driver/nvidia or /sys hidden from NVML.
    ("gpu access blocked by the operating system", Failure.BLOCKED_BY_OS),
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
    Failure.TIMEOUT: "nvidia-smi hangs; a GPU or the driver may be wedged (see dmesg for Xid)",
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
