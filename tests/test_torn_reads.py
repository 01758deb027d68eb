"""Torn reads: ``gpuagent status --json`` in a loop while an agent rewrites its state every ms.

The writer is the agent's own tick and state write in a loop of its own: a config file may not
ask for ticks under 0.1 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from click.testing import CliRunner

from gpuagent.commands.cli import main
from tests import fakehost, fakesysfs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READS = 10_000
WRITER = """
import sys, time
from gpuagent import state
from gpuagent.agent import Agent
from gpuagent.config import Config
from gpuagent.logs import EventLog
from gpuagent.sources.probe.probe import Prober
from gpuagent.edges.runner import Runner
cfg = Config(
    sysfs_root=sys.argv[1],
    state_file=sys.argv[2],
    interval=0.001,
    textfile="",
    journal_directory=sys.argv[3],
)
agent = Agent(cfg, Prober(Runner(timeout=1)), EventLog())
while True:
    state.write(cfg.state_file, agent.tick().state)
    time.sleep(0.001)
"""


def test_ten_thousand_reads_while_writing_every_millisecond(tmp_path: str) -> None:
    d = str(tmp_path)
    root = os.path.join(d, "sys")
    fakesysfs.add_device(root, "0000:03:00.0", 0x1A03, 0x2000, 0x030000, "ast")
    state_file = os.path.join(d, "state.json")
    conf = os.path.join(d, "gpuagent.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{state_file}"\n')
    env = {**os.environ, "PYTHONPATH": REPO}
    journal = fakehost.quiet_journal()
    agent = subprocess.Popen([sys.executable, "-c", WRITER, root, state_file, journal], env=env)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(state_file):
            assert agent.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        runner = CliRunner(mix_stderr=False)
        ticks: set[int] = set()
        failures = 0
        reads = 0
        while reads < READS:
            res = runner.invoke(main, ["--config", conf, "status", "--json"])
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
