"""What a flood of Xids naming addresses of no GPU costs the boot read: the kernel source
reading a boot of 1,000 and of 10,000 such records (each a new address) to its end, a
slice at a time, and the ratio of the two (flat per-record cost: about 10).

The journals are real ones made with ``../shared/tools/make-test-journal`` (needs
``systemd-journal-remote``) for this machine's boot.  Usage::

    /usr/bin/python3 -m bench.flood [--entries 1000 10000]
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import tempfile
import time

from gpuagent.logs import EventLog
from gpuagent.sources.kernel.kernel import KernelRecords
from gpuagent.views import BusView

from .journal import MAKE, boot_id


def make_journal(directory: str, entries: int) -> str:
    source = os.path.join(directory, f"flood{entries}.txt")
    with open(source, "w", encoding="utf-8") as f:
        for i in range(entries):
            domain, bus, device = 0x100 + i // (256 * 32), (i // 32) % 256, i % 32
            where = f"{domain:04x}:{bus:02x}:{device:02x}"
            f.write(f"[ {100 + i / 1000:.6f}] NVRM: Xid (PCI:{where}): 48, pid=1, DBE\n")
    out = os.path.join(directory, f"flood{entries}", "x.journal")
    subprocess.run([MAKE, "--boot-id", boot_id(), source, out], check=True, timeout=600)
    return os.path.dirname(out)


def boot_read(journal: str) -> tuple[float, int]:
    """Seconds to read the boot to its end, and how many slices it took."""
    source = KernelRecords(journal, EventLog(logging.getLogger("bench.flood")))
    start = time.perf_counter()
    source.poll(BusView())
    slices = 1
    while source.reading:
        source.read()
        slices += 1
    source.poll(BusView())
    return time.perf_counter() - start, slices


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, nargs="+", default=[1000, 10_000])
    args = parser.parse_args()
    logging.getLogger("bench.flood").disabled = True
    with tempfile.TemporaryDirectory() as tmp:
        journals = [(n, make_journal(tmp, n)) for n in args.entries]
        boot_read(journals[0][1])  # warm: imports, page cache
        took = {}
        for n, journal in journals:
            took[n], slices = boot_read(journal)
            print(f"{n:7d} records: boot read {took[n]:.3f} s in {slices} slices")
        first, last = args.entries[0], args.entries[-1]
        print(f"ratio {last}/{first}: {took[last] / took[first]:.1f} (flat cost: {last / first:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
