"""The boards' serial numbers from nvidia-smi (pure).

``nvidia-smi --query-gpu=pci.bus_id,serial --format=csv,noheader``: one line a GPU,
``00000000:18:00.0, 1320221034567``.  ``serial`` is the board's serial number, the one an RMA
names; ``[N/A]`` on boards without one (GeForce), and collectors that mask identifiers write
all zeros: neither is a serial.
"""

from __future__ import annotations

from gpuagent.sources.bus.pciaddr import is_bus_id, sysfs_slot
from gpuagent.sources.probe.smi import beside_rows

__all__ = ["ANSWERS", "ARGS", "parse"]

ARGS = ("--query-gpu=pci.bus_id,serial", "--format=csv,noheader")
# The exit codes an answer may come with, as the probe takes them: 14, the infoROM warning
# beside the rows; 15 and 255, one GPU's error beside the others' rows.
ANSWERS = frozenset({0, 14, 15, 255})


def parse(text: str) -> dict[str, str | None]:
    """Each GPU's serial by PCI slot (sysfs form); None where it has none.  What nvidia-smi
    prints beside the rows (one GPU's error, the infoROM warning) is skipped; raises
    ValueError naming the first other line that is not ``BUS_ID, SERIAL``, or for an answer
    without one row (a failed run's words alone)."""
    out: dict[str, str | None] = {}
    skipped = ""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or beside_rows(line):
            skipped = skipped or line.strip()
            continue
        bus_id, _, serial = (part.strip() for part in line.partition(","))
        if not is_bus_id(bus_id.lower()) or "," in serial:
            raise ValueError(f"line {n} is not 'BUS_ID, SERIAL': {line.strip()[:60]!r}")
        out[sysfs_slot(bus_id)] = _serial(serial)
    if not out:
        raise ValueError(
            f"no GPU's row in the answer: {skipped[:80]!r}" if skipped else "no answer"
        )
    return out


def _serial(text: str) -> str | None:
    if not text or text.startswith("[") or text.upper() == "N/A" or set(text) == {"0"}:
        return None
    return text
