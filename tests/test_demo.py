"""``scripts/demo --sick`` (tests/sick.py): every surface of a sick host, ending in the status."""

from __future__ import annotations

import os
import subprocess
import sys

from gpuagent.commands.status import ExitCode
from tests import fakesysfs, sick
from tests.tools import need

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_sick_demo_shows_three_problems_and_returns_the_status(tmp_path: str) -> None:
    need(os.access(sick.MAKE, os.X_OK), f"{sick.MAKE} is missing")
    gpuagent = os.path.join(REPO, "scripts", "gpuagent")
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": REPO}
    res = subprocess.run(
        [sys.executable, "-m", "tests.sick", str(tmp_path), gpuagent],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )
    assert res.returncode == ExitCode.CRITICAL, res.stdout + res.stderr
    slots = fakesysfs.gpu_slots(8)
    status = res.stdout[res.stdout.index("\u25cf gpuagent") :]
    # The worst first (a reboot takes more than a reset); each of the three counted.
    assert status.startswith(f"\u25cf gpuagent - 3 critical ({slots[7]} gone_from_bus, +2 more);")
    assert "reset_gpu: critical xid: Xid 119 (GSP RPC timeout)" in status
    assert "reset_gpu: critical requires_reset:" in status
    assert "reboot: critical gone_from_bus:" in status
    assert [ln for ln in status.splitlines() if len(ln) > 80] == []
