"""What reading the earlier boots costs (recurrence, issue 18): each tick's slice (target
<= 10 ms, :data:`gpuagent.sources.kernel.earlier.SLICE`) and the CPU per 100,000 kernel records
(target <= 2 s), beside floors measured in the same run: opening the journal (what any slice that
opens it pays) and the bare reader stepping over every entry the read matches; and the RSS of a
process as the agent is, this boot's records read and then the earlier boots (target <= 32 MiB on
Debian 13), beside the same process before the earlier boots.

The journal is a real one made with ``../shared/tools/make-test-journal`` (needs
``systemd-journal-remote``): three earlier boots of kernel records (one in 100 an Xid or
SXid line from the corpus, as in :mod:`bench.journal`), then this machine's boot.
``--check`` exits 1 when a slice ran over 10 ms.  Usage::

    /usr/bin/python3 -m bench.earlier [--entries 100000] [--runs 3] [--check]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.journal import MAKE, OTHER, REPO, XIDS, boot_id, status_kib
from gpuagent.sources.kernel import earlier
from gpuagent.sources.kernel.earlier import EarlierBoots
from gpuagent.sources.kernel.journalboot import open_reader

BOOTS = ("1" * 32, "2" * 32, "3" * 32)


def make_journal(directory: str, entries: int) -> str:
    """``entries`` kernel records over three earlier boots, then a few of this boot."""
    source = os.path.join(directory, "kernel.txt")
    per = entries // len(BOOTS)
    with open(source, "w", encoding="utf-8") as f:
        for n, boot in enumerate(BOOTS):
            if n:
                f.write(f"#@boot {boot}\n")
            for i in range(per):
                line = XIDS[i // 100 % len(XIDS)] if i % 100 == 0 else OTHER[i % len(OTHER)]
                f.write(f"[{1 + i // 1000:6d}.{i % 1000:06d}] {line}\n")
        f.write(f"#@boot {boot_id()}\n[     1.000000] {OTHER[1]}\n")
    out = os.path.join(directory, "journal", "x.journal")
    argv = [MAKE, "--boot-id", BOOTS[0], source, out]
    subprocess.run(argv, check=True, timeout=600, capture_output=True)
    return os.path.dirname(out)


def read(journal: str) -> tuple[list[tuple[float, float]], float, EarlierBoots]:
    """Every slice's wall and CPU time (s) until the read is done, and the CPU in all."""
    boots = EarlierBoots(journal, 3650, 2)
    slices: list[tuple[float, float]] = []
    cpu = time.process_time()
    for _ in range(100_000):  # bounded: far more slices than any journal here needs
        if boots.done:
            break
        start, used = time.perf_counter(), time.process_time()
        boots.step()
        slices.append((time.perf_counter() - start, time.process_time() - used))
    return slices, time.process_time() - cpu, boots


def floor_open(journal: str) -> float:
    """Opening the journal and matching as the read does, to its first entry."""
    start = time.perf_counter()
    reader: Any = open_reader(journal)
    reader.add_match(_TRANSPORT="kernel")
    reader.seek_head()
    reader._next()
    took = time.perf_counter() - start
    reader.close()
    return took


def floor_step(journal: str) -> tuple[float, int]:
    """The bare reader stepping over every kernel record, fetching no field (CPU s)."""
    reader: Any = open_reader(journal)
    reader.add_match(_TRANSPORT="kernel")
    reader.seek_head()
    n = 0
    cpu = time.process_time()
    while reader._next():
        n += 1
    took = time.process_time() - cpu
    reader.close()
    return took, n


def child(journal: str) -> None:
    """One process as the agent is: its modules, this boot's records, then the earlier
    boots; prints RSS (KiB) before and after those, and the peak."""
    import gpuagent.commands.cli  # noqa: PLC0415
    import gpuagent.daemon  # noqa: F401, PLC0415
    from gpuagent.sources.kernel.kernlog import KernelLog  # noqa: PLC0415
    from gpuagent.sources.kernel.xidcount import XidCounter  # noqa: PLC0415

    log = KernelLog(journal)
    log.poll(XidCounter().add)
    before = status_kib("VmRSS")
    read(journal)
    print(before, status_kib("VmRSS"), status_kib("VmHWM"))


def rss(journal: str) -> list[float]:
    """:func:`child`'s figures, in MiB."""
    argv = [sys.executable, "-m", "bench.earlier", "--child", journal]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=REPO, timeout=300)
    return [int(x) / 1024 for x in out.stdout.split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        journal = make_journal(d, args.entries)
        runs = [read(journal) for _ in range(args.runs)]
        slices = [s for r in runs for s in r[0]]
        boots = runs[0][2]
        cpu = statistics.median(r[1] for r in runs)
        records = args.entries
        opened = statistics.median(floor_open(journal) for _ in range(5))
        stepped, n = floor_step(journal)
        ms = sorted(w * 1e3 for w, _ in slices)
        cpu_ms = sorted(c * 1e3 for _, c in slices)
        print(
            f"{records:,} kernel records in {boots.summary} ("
            f"{len(runs[0][0])} slices a read; {args.runs} reads)"
        )
        print(
            f"slice, wall: max {ms[-1]:.1f} ms, p99 {ms[int(len(ms) * 0.99)]:.1f} ms, median "
            f"{statistics.median(ms):.1f} ms (target <= {earlier.SLICE * 1e3:g} ms); CPU: max "
            f"{cpu_ms[-1]:.1f} ms, median {statistics.median(cpu_ms):.1f} ms; floor: opening "
            f"the journal {opened * 1e3:.2f} ms"
        )
        print(
            f"CPU: {cpu / records * 1e5:.2f} s per 100,000 records (target <= 2 s; median of "
            f"{args.runs}); floor: the bare reader stepping over the {n:,} records "
            f"{stepped / n * 1e5:.2f} s per 100,000"
        )
        before, after, peak = rss(journal)
        print(
            f"RSS: {after:.1f} MiB after the earlier boots (target <= 32 MiB on Debian 13), "
            f"peak {peak:.1f}; floor: {before:.1f} MiB with this boot read, before them"
        )
        if args.check and ms[-1] > earlier.SLICE * 1e3:
            print(f"bench.earlier: a slice took {ms[-1]:.1f} ms", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
