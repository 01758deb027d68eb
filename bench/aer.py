"""The PCIe source's CPU per tick on an 8-GPU HGX layout, against the floor of its reads.

The tree is an HGX H100 board's PCIe as sysfs lays it out: four root ports, each with a PCIe
switch (an upstream port and a downstream port per GPU) and two GPUs below it, 20 functions
on the GPUs' paths, every one with the kernel's AER counter files (the ABI document's
samples, ``tests/data/corpus/pcie``).  Measured by turns (a call of each in turn, so that
the ratio is of the same moments on a shared machine):

* the source's step (each GPU's path, the two counter files of each function read once,
  compared with the last tick's), on quiet ticks, and on ticks after each of which a root
  port's counter rose (parsed and judged again each tick: the worst case; the file's write is
  not counted);
* the floor: the same 40 files opened, read and closed, nothing else.

Usage::

    /usr/bin/python3 -m bench.aer [--ticks 3000]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import tempfile

from bench.tick_cost import by_turns
from gpuagent.config import Config
from gpuagent.logs import EventLog
from gpuagent.sources.pcie.aer import FILES
from gpuagent.sources.pcie.source import PcieSource
from gpuagent.views import BusView, PciGpu, Tick
from tests import fakesysfs
from tests.test_aer import sample

TMPFS = "/dev/shm" if os.path.isdir("/dev/shm") else None


def hgx(root: str) -> tuple[list[str], list[str]]:
    """Eight GPUs under four switches; returns the GPUs' slots and every function on a path."""
    slots = fakesysfs.gpu_host(root, 8)
    functions: list[str] = []
    for i, slot in enumerate(slots):
        switch = i // 2
        port, up = f"0000:00:{switch + 1:02x}.0", f"0000:{0xE0 + 2 * switch:02x}:00.0"
        down = f"0000:{0xE1 + 2 * switch:02x}:{i % 2:02x}.0"
        fakesysfs.nest(root, slot, (port, up, down))
        functions.extend(f for f in (port, up, down, slot) if f not in functions)
    links = os.path.join(root, "bus", "pci", "devices")
    for function in functions:
        for kind in ("correctable", "fatal", "nonfatal"):
            with open(os.path.join(links, function, f"aer_dev_{kind}"), "w") as f:
                f.write(sample(kind))
    return slots, functions


def floor(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.read(fd, 4096)
        finally:
            os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=TMPFS) as d:
        root = os.path.join(d, "sys")
        slots, functions = hgx(root)
        links = os.path.join(root, "bus", "pci", "devices")
        files = [os.path.join(links, f, name) for f in functions for _, name in FILES]
        logger = logging.getLogger("bench.aer")
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
        source = PcieSource(root, EventLog(logger))
        bus = BusView(tuple(PciGpu(s, "0x2335", "0x030200", "nvidia") for s in slots))
        tick = Tick(0.0, 0.0, Config(sysfs_root=root), bus=bus)
        source.step(tick)
        quiet = by_turns(
            {"step": lambda: source.step(tick), "floor": lambda: floor(files)}, args.ticks
        )
        counts = itertools.count(1)
        rising = os.path.join(links, functions[0], "aer_dev_nonfatal")

        def rise() -> None:
            with open(rising, "w") as f:
                f.write(
                    sample("nonfatal").replace(
                        "Completion Timeout 0", f"Completion Timeout {next(counts)}"
                    )
                )

        risen = by_turns(
            {"rise": rise, "step": lambda: source.step(tick), "floor": lambda: floor(files)},
            args.ticks,
        )
    print(
        f"{len(slots)} GPUs, {len(functions)} functions on their paths, {len(files)} files a tick"
    )
    print(f"{'ms of CPU per tick':<40}{'step':>8}{'floor':>8}{'ratio':>8}")
    judged = "a root port's counter rising each tick"
    for name, figures in (("no error", quiet), (judged, risen)):
        ratio = figures["step"] / figures["floor"]
        print(f"{name:<40}{figures['step']:>8.3f}{figures['floor']:>8.3f}{ratio:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
