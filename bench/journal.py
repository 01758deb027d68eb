"""What reading Xids from the journal costs: a boot of 100,000 kernel records read at start
(target <= 2 s), a poll with nothing new (target <= 0.1 ms) and the agent's RSS with the
reader (target <= 32 MiB on Debian 13), each beside a floor measured in the same run.

The journal is a real one made with ``../shared/tools/make-test-journal`` (needs
``systemd-journal-remote``) for this machine's boot: one kernel record in 100 is an Xid line
from the corpus, the rest are ordinary kernel lines.  Usage::

    /usr/bin/python3 -m bench.journal [--entries 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from gpuagent.sources.kernel.journalboot import open_reader
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.sources.kernel.kernmatch import match
from gpuagent.sources.kernel.xidcount import XidCounter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAKE = os.path.join(os.path.dirname(REPO), "shared", "tools", "make-test-journal")
XIDS = [
    "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: "
    "ESR 0x57c730=0xc04000b 0x57c734=0x24 0x57c728=0x1f81fb60 0x57c72c=0x1174",
    "NVRM: Xid (PCI:0000:52:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double "
    "bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x18f31d80 "
    "partition 16, subpartition 3.",
    "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001",
    "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ",
]
OTHER = [
    'audit: type=1400 audit(1700000000.123:42): apparmor="DENIED" operation="open"',
    "eth0: Link is Up - 25Gbps/Full - flow control off",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "NVRM: GPU at PCI:0000:cb:00: GPU-11111111-2222-3333-4444-555555555555",
]


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip().replace("-", "")


def make_journal(directory: str, entries: int) -> None:
    source = os.path.join(directory, "kernel.txt")
    with open(source, "w", encoding="utf-8") as f:
        for i in range(entries):
            line = XIDS[i // 100 % len(XIDS)] if i % 100 == 0 else OTHER[i % len(OTHER)]
            f.write(f"[{1 + i // 1000:6d}.{i % 1000:06d}] {line}\n")
    out = os.path.join(directory, "journal", "x.journal")
    subprocess.run([MAKE, "--boot-id", boot_id(), source, out], check=True, timeout=600)


def read_boot(directory: str) -> tuple[float, XidCounter]:
    start = time.perf_counter()
    log = KernelLog(directory)
    counter = XidCounter()
    log.poll(counter.add)
    took = time.perf_counter() - start
    log.close()
    return took, counter


def floor_read(directory: str) -> float:
    """The bare reader: open, match as the agent does (the kernel's records and the module
    loaders'), and step over every record without fetching a field."""
    start = time.perf_counter()
    reader = open_reader(directory)
    match(reader)
    reader.seek_head()
    while reader._next():
        pass
    took = time.perf_counter() - start
    reader.close()
    return took


def idle_poll_us(directory: str, polls: int) -> tuple[float, float]:
    log = KernelLog(directory)
    counter = XidCounter()
    log.poll(counter.add)
    reader = log._reader
    start = time.perf_counter()
    for _ in range(polls):
        log.poll(counter.add)
    took = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(polls):
        reader.process()
    floor = time.perf_counter() - start
    log.close()
    return took / polls * 1e6, floor / polls * 1e6


def status_kib(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def child(directory: str, read: bool) -> None:
    """One process as the agent would be: its modules, and with ``read`` the journal read."""
    # What `gpuagent run` imports, and what it loads to log under journald, are the floor.
    import systemd.journal  # noqa: F401, PLC0415

    import gpuagent.commands.cli  # noqa: PLC0415
    import gpuagent.daemon  # noqa: F401, PLC0415

    if read:
        log = KernelLog(directory)
        counter = XidCounter()
        log.poll(counter.add)
        for _ in range(1000):
            log.poll(counter.add)
    print(status_kib("VmRSS"), status_kib("RssAnon"), status_kib("RssFile"), status_kib("VmHWM"))


def rss(directory: str, read: bool) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.journal", "--child", directory, *(["--read"] * read)],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    ).stdout
    return [int(x) / 1024 for x in out.split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--read", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.read)
        return 0
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        made = time.perf_counter()
        make_journal(d, args.entries)
        made = time.perf_counter() - made
        print(f"made a journal of {args.entries:,} kernel records in {made:.1f} s")
        journal = os.path.join(d, "journal")
        runs = [read_boot(journal) for _ in range(5)]
        took = statistics.median(t for t, _ in runs)
        counter = runs[0][1]
        floor = statistics.median(floor_read(journal) for _ in range(5))
        xids = sum(c.count for c in counter.counts([]).values())
        sxids = sum(c.count for c in counter.sxid_counts().values())
        print(
            f"start: read and count the boot: {took:.3f} s (target <= 2 s; median of 5), "
            f"{counter.records:,} driver records with {xids:,} Xids and {sxids:,} SXids; "
            f"floor (the reader stepping over every record): {floor:.3f} s"
        )
        poll, process = idle_poll_us(journal, 100_000)
        print(
            f"poll with nothing new: {poll:.2f} us (target <= 100 us); "
            f"floor (reader.process() alone): {process:.2f} us"
        )
        base, with_reader = rss(journal, False), rss(journal, True)
        for name, v in (("floor: the agent's modules", base), ("with the reader", with_reader)):
            print(
                f"RSS {name}: {v[0]:.1f} MiB (private {v[1]:.1f}, file-backed {v[2]:.1f}, "
                f"peak {v[3]:.1f})"
            )
        print(
            f"the reader adds {with_reader[0] - base[0]:.1f} MiB RSS, "
            f"{with_reader[1] - base[1]:.1f} MiB private"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
