"""What watching NVIDIA's units over D-Bus costs: jeepney's import, one read of three units.

Each run is a fresh ``/usr/bin/python3``; its floor is that interpreter after importing
``gpuagent.units``, which imports jeepney only when it first reads.  Then jeepney's import
(RSS and ms), the first read of nvidia-fabricmanager, nvidia-persistenced and nvidia-dcgm
(connect, authenticate, Hello, three units' five properties) and the next reads on the kept
connection.  Against the system bus; ``--mock`` starts a private dbus-daemon with the tests'
python-dbusmock systemd instead (slower to answer than systemd itself).  Usage::

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

from gpuagent import units
floor = rss()
t = time.perf_counter()
import jeepney, jeepney.bus, jeepney.io.blocking, jeepney.wrappers
imported_ms = (time.perf_counter() - t) * 1000
imported = rss()
reader = units.Units()
t = time.perf_counter()
first = reader.read()
first_ms = (time.perf_counter() - t) * 1000
again = []
cpu = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    c = time.process_time()
    reader.read()
    cpu.append((time.process_time() - c) * 1000)
    again.append((time.perf_counter() - t) * 1000)
print(json.dumps({
    "watch": first.watch.value, "error": first.error, "floor": floor, "imported": imported,
    "import_ms": imported_ms, "first_ms": first_ms,
    "again_ms": sorted(again)[len(again) // 2] if again else 0.0,
    # The agent's own CPU per read (what a tick's budget counts): the rest is waiting.
    "cpu_ms": sum(cpu) / len(cpu) if cpu else 0.0,
    "after": rss(), "units": {n: u.active_state for n, u in first.units.items()},
    "jeepney": jeepney.__version__,
}))
"""


def child(reads: int, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        ["/usr/bin/python3", "-c", CHILD, str(reads)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": REPO},
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
    print(f"units read: {runs[0]['units']}")
    print(f"floor (python3 + gpuagent.units): RSS {med('floor') / 1024:.1f} MiB")
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


if __name__ == "__main__":
    main()
