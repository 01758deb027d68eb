"""What watching NVIDIA's units over D-Bus costs: jeepney's import, one read of three units,
and a tick's services step against the same step's floor.

Each run is a fresh ``/usr/bin/python3``; its floor is that interpreter after importing
``gpuagent.edges.systemd.units``, which imports jeepney only when it first reads.  Then jeepney's
import (RSS and ms), the first read of nvidia-fabricmanager, nvidia-persistenced and nvidia-dcgm
(connect, authenticate, Hello, three units' five properties) and the next reads on the kept
connection, reading every unit each time.  Then the CPU of a tick's services step
(``ServicesSource.read``: the read, the findings, the view) three ways: with a reader that answers
at once (the floor), following systemd's signals as the agent does (nothing changed: no call), the
tick of its check of what the signals left (one call), and reading every unit every time.  Against
the system bus; ``--mock`` starts a private dbus-daemon with the tests' python-dbusmock systemd
instead (slower to answer than systemd itself).  Usage::

    /usr/bin/python3 -m bench.units_cost [--runs 5] [--reads 20] [--mock]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = r"""
import json, sys, time

def rss():
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))

from gpuagent.edges.systemd import units
from gpuagent.sources.services.services import ServicesSource
floor = rss()
t = time.perf_counter()
import jeepney, jeepney.bus, jeepney.io.blocking, jeepney.wrappers
imported_ms = (time.perf_counter() - t) * 1000
imported = rss()
reads = int(sys.argv[1])
everything = units.Units(full_every=None)  # the reads of issue 16's first wiring
t = time.perf_counter()
first = everything.read()
first_ms = (time.perf_counter() - t) * 1000
again = []
cpu = []
for _ in range(reads):
    t = time.perf_counter()
    c = time.process_time()
    everything.read()
    cpu.append((time.process_time() - c) * 1000)
    again.append((time.perf_counter() - t) * 1000)
everything.close()

class Stub:
    # The floor's reader: the same answer, at once.
    def read(self, names=()):
        return first
    def close(self):
        pass

def per_step(reader):
    # A tick's services step (the units read, the findings, the view): CPU ms per step.
    source = ServicesSource("/nonexistent", lambda *a, **k: None, reader=reader,
                            monotonic=time.monotonic)
    source.read({})
    source.read({})  # the first read's UnitNew signals taken in
    c = time.process_time()
    for _ in range(reads):
        source.read({})
    return (time.process_time() - c) * 1000 / max(reads, 1), source

floor_step, _ = per_step(Stub())
followed = units.Units()
t = time.perf_counter()
follow_first = followed.read()
follow_first_ms = (time.perf_counter() - t) * 1000
follow_step, source = per_step(followed)
full_step, _ = per_step(units.Units(full_every=None))
# The safety net's tick (every 60 s in the agent): due on every step here.
check_step, _ = per_step(units.Units(full_every=0.0))
print(json.dumps({
    "watch": first.watch.value, "error": first.error, "floor": floor, "imported": imported,
    "import_ms": imported_ms, "first_ms": first_ms,
    "again_ms": sorted(again)[len(again) // 2] if again else 0.0,
    # The agent's own CPU per read (what a tick's budget counts): the rest is waiting.
    "cpu_ms": sum(cpu) / len(cpu) if cpu else 0.0,
    "follow_first_ms": follow_first_ms,
    "floor_step_ms": floor_step, "follow_step_ms": follow_step, "full_step_ms": full_step,
    "check_step_ms": check_step,
    # What the followed reads said, against the first full read's (the same, nothing changed).
    "same": {n: u.active_state for n, u in source.reader.read().units.items()}
        == {n: u.active_state for n, u in first.units.items()},
    "after": rss(), "units": {n: u.active_state for n, u in first.units.items()},
    "jeepney": jeepney.__version__,
}))
"""


def child(reads: int, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        ["/usr/bin/python3", "-c", CHILD, str(reads)],
        capture_output=True,
        text=True,
        # A PYTHONPATH given (another jeepney's source, say) comes after the checkout.
        env={**env, "PYTHONPATH": os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)},
        check=True,
        timeout=120,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def mock_bus(tmp: str) -> tuple[list[subprocess.Popen[bytes]], str]:
    """A private bus with the tests' mock systemd on it; (processes, address)."""
    sys.path.insert(0, REPO)
    from tests.test_units import BUS_CONFIG, PARAMETERS, TEMPLATE  # noqa: PLC0415

    sock = os.path.join(tmp, "bus")
    conf = os.path.join(tmp, "bus.conf")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(BUS_CONFIG.format(socket=sock))
    null = subprocess.DEVNULL
    daemon = subprocess.Popen(
        ["/usr/bin/dbus-daemon", f"--config-file={conf}", "--nofork"], stdout=null, stderr=null
    )
    address = f"unix:path={sock}"
    env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": address}
    argv = ["/usr/bin/python3", "-m", "dbusmock", "--system", "-t", TEMPLATE]
    mock = subprocess.Popen(
        [*argv, "-p", json.dumps(PARAMETERS)], env=env, stdout=null, stderr=null
    )
    for _ in range(300):
        if child(0, env)["watch"] == "ok":
            break
        time.sleep(0.1)
    return [mock, daemon], address


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--mock", action="store_true", help="a private bus and a mock systemd")
    args = parser.parse_args()
    env = dict(os.environ)
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if args.mock:
                procs, env["DBUS_SYSTEM_BUS_ADDRESS"] = mock_bus(tmp)
            runs = [child(args.reads, env) for _ in range(args.runs)]
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)
    if runs[0]["watch"] != "ok":
        print(f"no read: {runs[0]['watch']} {runs[0]['error']}")

    def med(key: str) -> float:
        return statistics.median(float(r[key]) for r in runs)

    bus = "a mock systemd on a private bus" if args.mock else "the system bus"
    print(f"jeepney {runs[0]['jeepney']}, {bus}, median of {args.runs} fresh interpreters")
    print(f"units read: {runs[0]['units']} (the same when followed: {runs[0]['same']})")
    print(f"floor (python3 + gpuagent.edges.systemd.units): RSS {med('floor') / 1024:.1f} MiB")
    print(
        f"import jeepney: +{(med('imported') - med('floor')) / 1024:.2f} MiB RSS, "
        f"{med('import_ms'):.1f} ms"
    )
    print(f"first read of 3 units (connect + Hello + 15 properties): {med('first_ms'):.1f} ms")
    print(
        f"each later read on the kept connection (median of {args.reads}): {med('again_ms'):.2f} ms"
    )
    print(f"  of which the agent's own CPU (mean): {med('cpu_ms'):.2f} ms")
    print(f"RSS after the reads: +{(med('after') - med('floor')) / 1024:.2f} MiB over the floor")
    follow_first = med("follow_first_ms")
    print(f"first read following signals (Subscribe, match rules, 3 units): {follow_first:.1f} ms")
    print(f"a tick's services step, CPU (mean of {args.reads}, median of the runs):")
    floor, follow, full = med("floor_step_ms"), med("follow_step_ms"), med("full_step_ms")
    print(f"  floor (the same step, a reader answering at once): {floor:.3f} ms")
    print(f"  following signals, nothing changed: {follow:.3f} ms (+{follow - floor:.3f} ms)")
    check = med("check_step_ms")
    print(
        f"  the check of what the signals left (one ListUnitsByPatterns; every 60 s): "
        f"{check:.3f} ms (+{check - floor:.3f} ms)"
    )
    print(f"  reading every unit every tick: {full:.3f} ms (+{full - floor:.3f} ms)")


if __name__ == "__main__":
    main()
