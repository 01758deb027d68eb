"""RSS of ``gpuagent run`` after 300 ticks on a fake 8-GPU host (target <= 32 MiB on Debian 13
with the journal read: ``bench.journal`` measures that).

nvidia-smi is a shell script that ``cat``s a real H200 capture projected onto the query, so
300 ticks at the shortest interval the agent allows (0.1 s) take half a minute.  Usage::

    /usr/bin/python3 -m bench.memory [--ticks 300]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from bench.sim import instant_nvidia_smi, make_host
from gpuagent.config import MIN_INTERVAL
from tests.fakehost import quiet_journal

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        slots = make_host(os.path.join(d, "sys"), 8)
        nvsmi = instant_nvidia_smi(d, slots)
        state_file = os.path.join(d, "state.json")
        conf = os.path.join(d, "gpuagent.toml")
        with open(conf, "w") as f:
            f.write(
                f'sysfs_root = "{d}/sys"\nnvidia_smi = "{nvsmi}"\n'
                f'state_file = "{state_file}"\ninterval = {MIN_INTERVAL}\n'
                f'textfile = "{d}/gpuagent.prom"\njournal_directory = "{quiet_journal()}"\n'
            )
        env = {**os.environ, "PYTHONPATH": REPO}
        env.pop("NOTIFY_SOCKET", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuagent", "--config", conf, "run"], env=env
        )
        try:
            ticks = 0
            while ticks < args.ticks:
                if proc.poll() is not None:
                    print(f"gpuagent run exited {proc.returncode} after {ticks} ticks")
                    return 1
                time.sleep(0.2)
                try:
                    with open(state_file) as f:
                        ticks = json.load(f)["ticks"]
                except (OSError, ValueError):
                    continue
            rss, hwm = status_kib(proc.pid, "VmRSS"), status_kib(proc.pid, "VmHWM")
            anon, file = status_kib(proc.pid, "RssAnon"), status_kib(proc.pid, "RssFile")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    print(
        f"after {ticks} ticks on 8 GPUs: RSS {rss / 1024:.1f} MiB "
        "(target <= 32 MiB with the journal read), "
        f"peak {hwm / 1024:.1f} MiB; private (RssAnon) {anon / 1024:.1f} MiB, "
        f"file-backed (RssFile: the interpreter and shared libraries) {file / 1024:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
