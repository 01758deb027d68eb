"""The wear source's CPU per tick on an 8-GPU host, against the floor of its lookups.

Every board of an 8-GPU host is recorded this boot (``wear.json``) and has two earlier boots'
records: each tick the source judges each board's trend from them (it spawns nothing after a
boot's first answer: its read is once a boot).  Measured by turns (a call of each in turn, so
that the ratio is of the same moments on a shared machine):

* the source's step, with boards whose wear is flat, and with every board's rows remapped
  by 10 a boot (all eight ``wear_rising``);
* the floor: each GPU's UUID looked up as the step must (``Tick.uuid``), nothing else.

Usage::

    /usr/bin/python3 -m bench.wear [--ticks 3000]
"""

from __future__ import annotations

import argparse
import logging
import tempfile

from bench.tick_cost import by_turns
from gpuagent.config import Config
from gpuagent.edges.runner import Runner
from gpuagent.logs import EventLog
from gpuagent.sources.wear.source import WearSource
from gpuagent.views import BusView, KernelView, PciGpu, Tick
from tests.fakesysfs import gpu_slots
from tests.replay import gpu_uuid


def tick(slots: list[str], growth: int) -> Tick:
    """A tick of ``slots`` whose boards' two earlier boots' records grew by ``growth`` a
    boot."""
    uuids = {s: gpu_uuid(s) for s in slots}
    earlier = {
        u.lower(): tuple({"remapped_rows_correctable": n * growth} for n in (0, 1))
        for u in uuids.values()
    }
    bus = BusView(tuple(PciGpu(s, "0x2335", "0x030200", "nvidia") for s in slots))
    return Tick(0.0, 0.0, Config(), bus=bus, kernel=KernelView(uuids=uuids, wear=earlier))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=3000)
    args = parser.parse_args()
    slots = gpu_slots(8)
    logger = logging.getLogger("bench.wear")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d:
        for name, growth in (("flat wear", 0), ("every board rising", 10)):
            runner = Runner(timeout=10.0)  # never runs: the boards are recorded this boot
            source = WearSource(Config(), runner, EventLog(logger), state_directory=d, boot="b")
            now = tick(slots, growth)
            source.recorded.add(
                {gpu_uuid(s): (s, {"remapped_rows_correctable": 2 * growth}) for s in slots}
            )
            found = source.step(now).findings["wear"]
            assert len(found) == (len(slots) if growth else 0), found

            def lookups(t: Tick = now) -> None:
                for s in slots:
                    t.uuid(s)

            def step(w: WearSource = source, t: Tick = now) -> None:
                w.step(t)

            figures[name] = by_turns({"step": step, "floor": lookups}, args.ticks)
    print(f"{len(slots)} GPUs, each with 3 boots' records")
    print(f"{'ms of CPU per tick':<30}{'step':>8}{'floor':>8}{'ratio':>8}")
    for name, f in figures.items():
        print(f"{name:<30}{f['step']:>8.4f}{f['floor']:>8.4f}{f['step'] / f['floor']:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
