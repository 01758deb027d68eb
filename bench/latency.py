"""How fast a kernel record reaches the agent's outputs, and what the wait for it costs idle.

``gpuagent run`` at the default 10 s interval on a fake 8-GPU host whose ``journal_directory``
is a real journal; kernel records are appended to it (systemd-journal-remote, as
make-test-journal writes them, stamped now) at random moments, each a new (GPU, Xid code), and
the bench times from the moment it starts writing one to (a) the state file, (b) the agent's
line (on stderr here, as it reaches journald under systemd) and (c) the textfile naming it
(its ``gpuagent_gpu_xid_errors_total`` series): p50/p99 over ``--records`` records.  The same
run then starts the agent again with the loop waiting on the signal pipe alone (no event wait:
:class:`gpuagent.events.Waits` waits on nothing, as before issue 25) and times that too; and
measures each agent's CPU (utime+stime from ``/proc``, children excluded) over ``--idle`` s
without a record, and over 12 s from the start of a storm of 10,000 records (the agent without
the event wait reads them at its tick in that window: what reading them costs anyway), then
a record's latency right after the storm.  Usage::

    /usr/bin/python3 -m bench.latency [--records 24] [--idle 60]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

from tests import fakehost, journalfeed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PYTHON = "/usr/bin/python3"
GPUS = 8
# Each record a new (GPU, code): its first line, state entry and series.
CODES = (48, 74, 79)
# The storm's window (s): longer than the interval, so that each agent reads the storm in it.
STORM_WINDOW = 12.0
# The loop as before issue 25: gpuagent run with nothing but the signal pipe to wait on.
NO_WAIT = (
    "import runpy, sys; import gpuagent.events as e; e.Waits.fds = lambda self: {}; "
    "sys.argv[0] = 'gpuagent'; runpy.run_module('gpuagent', run_name='__main__')"
)


# One record's latency to the state file, the agent's line and the textfile (s).
Times = tuple[float, float, float]


class Agent:
    """``gpuagent run`` on ``host``; its stderr lines kept with their arrival (monotonic s)."""

    def __init__(self, host: fakehost.FakeHost, wait: bool) -> None:
        argv = ["-m", "gpuagent"] if wait else ["-c", NO_WAIT]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": REPO, "LANG": "C.UTF-8"}
        self.proc = subprocess.Popen(
            [PYTHON, *argv, "--config", host.conf, "run"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line))

    def cpu(self) -> float:
        """The agent's CPU so far (s), its children's excluded."""
        with open(f"/proc/{self.proc.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _read_json(path: str) -> dict[str, object] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return dict(json.load(f))
    except (OSError, ValueError):
        return None


def counted(state: dict[str, object] | None, slot: str, code: int, count: int = 1) -> bool:
    """Whether ``state`` counts ``count`` records of Xid ``code`` on ``slot``."""
    if state is None:
        return False
    for gpu in state["gpus"]:  # type: ignore[attr-defined]
        if gpu["pci_slot"] == slot and any(
            x["xid"] == code and x["count"] >= count for x in gpu["xids"]
        ):
            return True
    return False


def in_textfile(path: str, slot: str, code: int) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    return any(
        line.startswith("gpuagent_gpu_xid_errors_total")
        and f'pci_slot="{slot}"' in line
        and f'xid="{code}"' in line
        for line in text.splitlines()
    )


def time_one(agent: Agent, host: fakehost.FakeHost, journal: str, slot: str, code: int) -> Times:
    """Write Xid ``code`` on ``slot``: how long until it is on each output (s)."""
    state_file = os.path.join(host.dir, "state.json")
    textfile = os.path.join(host.dir, "gpuagent.prom")
    seen = len(agent.lines)
    start = time.monotonic()
    journalfeed.append(journal, [journalfeed.xid(slot, code, "bench")])
    got: dict[str, float] = {}
    while len(got) < 3:
        now = time.monotonic()
        if now > start + 30:
            raise SystemExit(f"bench.latency: Xid {code} on {slot} never came: {got}")
        if "state" not in got and counted(_read_json(state_file), slot, code):
            got["state"] = now
        if "text" not in got and in_textfile(textfile, slot, code):
            got["text"] = now
        if "line" not in got:
            for at, line in agent.lines[seen:]:
                if f"GPU {slot}" in line and f"Xid {code} " in line:
                    got["line"] = at
                    break
        time.sleep(0.002)
    return got["state"] - start, got["line"] - start, got["text"] - start


def latencies(
    agent: Agent, host: fakehost.FakeHost, journal: str, records: int, rng: random.Random
) -> list[Times]:
    """Each record's (state, line, textfile) latency (s), written at random moments."""
    pairs = [(slot, code) for code in CODES for slot in host.slots][:records]
    out = []
    for slot, code in pairs:
        # A random moment of the tick grid (the interval is 10 s), whenever the last came.
        time.sleep(rng.uniform(0.3, 10.3))
        out.append(time_one(agent, host, journal, slot, code))
    return out


def storm(agent: Agent, host: fakehost.FakeHost, journal: str) -> dict[str, float]:
    """10,000 Xid 13 records on the first GPU, in ten batches back to back: the agent's CPU
    over :data:`STORM_WINDOW` s from the storm's start (one tick in it, whether or not the
    agent waits on the journal), and then a record's latency to all three outputs."""
    slot = host.slots[0]
    record = journalfeed.xid(slot, 13, "Graphics Exception")
    state_file = os.path.join(host.dir, "state.json")
    cpu, start = agent.cpu(), time.monotonic()
    for _ in range(10):
        journalfeed.append(journal, [record] * 1000)
    written = time.monotonic() - start
    while not counted(_read_json(state_file), slot, 13, 10_000):
        if time.monotonic() > start + 60:
            raise SystemExit("bench.latency: the storm was never counted")
        time.sleep(0.01)
    counted_in = time.monotonic() - start
    time.sleep(max(start + STORM_WINDOW - time.monotonic(), 0.0))
    used = agent.cpu() - cpu
    after = time_one(agent, host, journal, slot, 63)
    return {
        "written_s": round(written, 2),
        "counted_s": round(counted_in, 2),
        "cpu_s": round(used, 2),
        "after_ms": round(max(after) * 1000, 1),
    }


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def run(wait: bool, records: int, idle: float, rng: random.Random) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as d:
        journal = os.path.join(d, "journal")
        os.mkdir(journal)
        journalfeed.append(journal, ["Linux version 6.1.0 (the boot's first record)"])
        host = fakehost.create(d, GPUS, interval=10.0, journal_directory=journal)
        agent = Agent(host, wait)
        try:
            state_file = os.path.join(host.dir, "state.json")
            deadline = time.monotonic() + 60
            while _read_json(state_file) is None:
                if time.monotonic() > deadline:
                    raise SystemExit("bench.latency: the agent never ticked")
                time.sleep(0.05)
            time.sleep(11)  # the first ticks' start-up cost is not idle cost
            cpu, t0 = agent.cpu(), time.monotonic()
            time.sleep(idle)
            idle_cpu = (agent.cpu() - cpu) / (time.monotonic() - t0)
            lat = latencies(agent, host, journal, records, rng)
            stormed = storm(agent, host, journal)
        finally:
            agent.stop()
    columns = list(zip(*lat, strict=True))
    return {
        "idle_cpu_percent": round(idle_cpu * 100, 3),
        **{
            name: {
                "p50_ms": round(percentile(list(v), 50) * 1000, 1),
                "p99_ms": round(percentile(list(v), 99) * 1000, 1),
                "max_ms": round(max(v) * 1000, 1),
            }
            for name, v in zip(("state", "line", "textfile"), columns, strict=True)
        },
        "records": len(lat),
        "storm": stormed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=24, help=f"at most {GPUS * len(CODES)}")
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=25)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    records = min(args.records, GPUS * len(CODES))
    figures = {
        "event wait": run(True, records, args.idle, rng),
        "no event wait (before issue 25)": run(False, records, args.idle, rng),
    }
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
