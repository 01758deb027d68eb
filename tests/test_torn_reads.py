"""Torn reads: ``gpuagent status --json`` in a loop while the agent rewrites its state every ms."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys

from click.testing import CliRunner

from gpuagent.cli import main
from tests import fakesysfs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READS = 10_000


def test_ten_thousand_reads_while_writing_every_millisecond(tmp_path: str) -> None:
    d = str(tmp_path)
    root = os.path.join(d, "sys")
    fakesysfs.add_device(root, "0000:03:00.0", 0x1A03, 0x2000, 0x030000, "ast")
    state_file = os.path.join(d, "state.json")
    conf = os.path.join(d, "gpuagent.toml")
    with open(conf, "w") as f:
        f.write(
            f'sysfs_root = "{root}"\nstate_file = "{state_file}"\ninterval = 0.001\ntextfile = ""\n'
        )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(os.path.join(d, "notify"))
    env = {**os.environ, "PYTHONPATH": REPO, "NOTIFY_SOCKET": os.path.join(d, "notify")}
    agent = subprocess.Popen([sys.executable, "-m", "gpuagent", "--config", conf, "run"], env=env)
    try:
        ready, _, _ = select.select([sock], [], [], 20)
        assert ready and sock.recv(4096).startswith(b"READY=1")
        runner = CliRunner(mix_stderr=False)
        ticks: set[int] = set()
        failures = 0
        reads = 0
        while reads < READS:
            res = runner.invoke(main, ["--config", conf, "status", "--json"])
            if not ticks and "no state file" in res.stderr:
                # READY=1 precedes the first state write by the rest of that tick.
                continue
            reads += 1
            if res.exit_code != 0:
                failures += 1
                continue
            ticks.add(json.loads(res.stdout)["ticks"])
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    assert failures == 0
    # The reads really raced the writer: they saw many different states.
    assert len(ticks) > 100
