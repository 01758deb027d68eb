"""Soak: many ticks with faults drawn at random; prints fds, RSS, children and log lines.

Simulated (default): 100,000 ticks on a fake clock with a scripted nvidia-smi, each fault
episode drawn from the fault matrix.  Real time (``--real``): ``gpuagent run`` as a process at
a 0.1 s interval with the replaying fake nvidia-smi failing 30 % of the time.  With
``--check`` it exits 1 when a target is missed: fds and children back to their start
values, RSS growth <= 1 MiB, log lines <= 2 per outage.  Usage::

    /usr/bin/python3 -m bench.soak [--ticks 100000] [--check]
    /usr/bin/python3 -m bench.soak --real [--seconds 600] [--check]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from bench.sim import scripted_agent
from gpuagent import state
from gpuagent.publish import Textfile
from tests import fakehost, fakesysfs
from tests.fakehost import MISMATCH

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULTS = [
    "version_mismatch",
    "driver_not_loaded",
    "timeout",
    "garbage",
    "flood",
    "gpu_lost",
    "missing_gpu",
    "module_unloaded",
    "smi_missing",
    "sysfs_problem",
]


def _escalation(fault: str, ticks: int) -> int:
    """The lines a fault lasting ``ticks`` (10 s each) adds to its outage's start and end by
    being a problem of its own (its start and end): a failing nvidia-smi is smi_failing or
    driver_mismatch, a missing one nvidia_smi_missing, a timeout driver_hung (restated critical
    once it has lasted driver_hung_after, 300 s), an absent module no_driver_module (restated
    critical past driver_absent_grace, 600 s)."""
    if fault in ("missing_gpu", "sysfs_problem"):
        return 0  # the problem is the fault's two lines
    if fault == "module_unloaded":
        return 2 + (ticks * 10 > 600)
    return 2 + (fault == "timeout" and ticks * 10 >= 300)


def fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def children(pid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        n += 1
            except (OSError, IndexError, ValueError):
                continue
    return n


# The loop sampler's one line when it falls back to spawns (gpuagent.sources.probe.loop).
_FELL_BACK = "probing by spawn until the agent restarts"


def quiet(pid: int) -> tuple[int, int, int]:
    """fds, RSS and children between probes: the fewest seen over a second of readings."""
    readings = []
    for _ in range(30):
        readings.append((fds(pid), rss_kib(pid), children(pid)))
        time.sleep(1 / 30)
    return min(r[0] for r in readings), readings[-1][1], min(r[2] for r in readings)


def report(
    start: tuple[int, int, int],
    end: tuple[int, int, int],
    lines: int,
    outages: int,
    budget: int | None = None,
) -> list[str]:
    """Print the figures; returns what missed its target.  ``budget``: the log lines the
    episodes may make (default two each: a start and an end)."""
    budget = 2 * outages if budget is None else budget
    print(f"{'':<14} {'fds':>5} {'RSS KiB':>9} {'children':>9}")
    print(f"{'start':<14} {start[0]:>5} {start[1]:>9} {start[2]:>9}")
    print(f"{'end':<14} {end[0]:>5} {end[1]:>9} {end[2]:>9}")
    print(
        f"log lines (info and above): {lines} for {outages} fault episodes "
        f"({lines / max(outages, 1):.2f} per episode)"
    )
    missed = []
    if end[0] != start[0]:
        missed.append(f"fds {start[0]} -> {end[0]}")
    if end[2] != start[2]:
        missed.append(f"children {start[2]} -> {end[2]}")
    if end[1] - start[1] > 1024:
        missed.append(f"RSS grew {end[1] - start[1]} KiB (> 1024)")
    if lines > budget:
        missed.append(f"{lines} log lines for {outages} episodes (budget {budget})")
    return missed


def simulated(ticks: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as root:
        slots = fakesysfs.gpu_host(root, 8)
        installed = {"smi": True}
        agent, runner, counter, clock, log = scripted_agent(
            root,
            "/usr/bin/nvidia-smi",
            slots,
            which=lambda name: "/usr/bin/nvidia-smi" if installed["smi"] else None,
        )
        path = os.path.join(root, "state.json")
        textfile = Textfile(os.path.join(root, "gpuagent.prom"), log)
        bad = os.path.join(root, "bus", "pci", "devices", "0000:f0:00.0")

        def apply(fault: str | None) -> None:
            runner.step = fault if fault in runner._answers else "healthy"
            fakesysfs.set_module(root, fault != "module_unloaded")
            installed["smi"] = fault != "smi_missing"
            if fault == "sysfs_problem":
                fakesysfs.add_device(root, "0000:f0:00.0", 0x10DE, 0x2335, 0x030200, "nvidia")
                with open(os.path.join(bad, "class"), "w") as f:
                    f.write("garbage\n")
            elif os.path.exists(bad):
                fakesysfs.remove_device(root, "0000:f0:00.0")

        def tick_n(n: int) -> None:
            for _ in range(n):
                st = agent.tick().state
                state.write(path, st)
                textfile.write(st)
                clock.now += 10.0

        tick_n(100)  # warm up: imports, caches and the first samples settle
        start = (fds(), rss_kib(), children(os.getpid()))
        base_lines = counter.at_least(logging.INFO)
        episodes = budget = 0
        done = 0
        while done < ticks:
            fault = rng.choice(FAULTS)
            episodes += 1
            length = min(rng.randint(1, 400), ticks - done)
            budget += 2 + _escalation(fault, length)
            apply(fault)
            tick_n(length)
            healthy = min(rng.randint(5, 200), max(ticks - done - length, 0))
            apply(None)
            tick_n(healthy)
            done += length + healthy
        apply(None)
        tick_n(10)
        end = (fds(), rss_kib(), children(os.getpid()))
        print(f"{ticks} simulated ticks, {runner.spawns} scripted probes, seed {seed}")
        lines = counter.at_least(logging.INFO) - base_lines
        return report(start, end, lines, episodes, budget)


def real(seconds: float, fail: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        host = fakehost.create(d, interval=0.1, probe_timeout=0.5)
        bad: list[dict[str, object]] = [
            {"error": MISMATCH, "exit": 18},
            {"hang": 30},
            {"stdout": "garbage\n"},
        ]
        log = open(os.path.join(d, "stderr"), "w+")
        env = {**os.environ, "PYTHONPATH": REPO}
        env.pop("NOTIFY_SOCKET", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuagent", "--config", host.conf, "run"],
            env=env,
            stderr=log,
        )
        try:
            time.sleep(3)  # a benchmark in real time: let it settle
            start = quiet(proc.pid)
            episodes = 0
            end_at = time.monotonic() + seconds
            while time.monotonic() < end_at:
                failing = rng.random() < fail
                episodes += failing
                if failing:
                    host.scenario(**rng.choice(bad))
                else:
                    host.healthy()
                time.sleep(rng.uniform(0.5, 3.0))
            host.healthy()
            time.sleep(3)
            end = quiet(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
        log.seek(0)
        lines = [ln for ln in log.read().splitlines() if not ln.startswith("debug:")]
        if start[2] == 1 and any(_FELL_BACK in ln for ln in lines):
            # The loop sampler's child and its pipe, there at the start, are gone once two
            # failed loops fell back to spawns (said once): no leak, the end is held to that.
            print("nvidia-smi's loop fell back to spawns: its child and pipe are not expected")
            start = (start[0] - 1, start[1], 0)
        # Start and stop, and the start's warning that a 0.5 s timeout exceeds the 0.1 s tick.
        skip = ("started: tick every", "stopping", "is not below interval")
        lines = [ln for ln in lines if not any(s in ln for s in skip)]
        log.close()
        print(f"{seconds:g} s at a 0.1 s interval, nvidia-smi failing {fail:.0%} of the time")
        return report(start, end, len(lines), episodes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=100_000)
    parser.add_argument("--real", action="store_true")
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--fail", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    missed = (
        real(args.seconds, args.fail, args.seed) if args.real else simulated(args.ticks, args.seed)
    )
    for line in missed:
        print(f"MISSED: {line}", file=sys.stderr)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
