"""bench.tick_cost's stand-in nvidia-smi in loop mode, and its paced runs' cadences."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

from bench.sim import instant_nvidia_smi, make_host
from bench.tick_cost import LOOP_INTERVAL, scaled
from gpuagent.config import Config
from gpuagent.edges.cadence import every_ticks
from gpuagent.sources.nvlink import nvlinksource
from gpuagent.sources.probe import smi
from gpuagent.sources.probe.loop import loop_command
from gpuagent.sources.processes.processes import LOOP_PERIOD


def _lines(proc: subprocess.Popen[bytes], want: int, deadline: float) -> list[bytes]:
    """At least ``want`` lines of ``proc``'s stdout, or what came by ``deadline``."""
    assert proc.stdout is not None
    data = b""
    while data.count(b"\n") < want and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            data += chunk
    return data.splitlines()


def test_the_stand_in_loops_on_lms_and_answers_once_without(tmp_path: Path) -> None:
    slots = make_host(str(tmp_path / "sys"), 2, devices=4)
    nvsmi = instant_nvidia_smi(str(tmp_path), slots)
    once = subprocess.run(smi.command(nvsmi, smi.FIELDS), capture_output=True, check=True)
    answer = (tmp_path / "answer.csv").read_bytes()
    assert once.stdout == answer and len(answer.splitlines()) == 2
    for argv in (
        loop_command(nvsmi, smi.FIELDS, 0.05),
        [*smi.command(nvsmi, smi.FIELDS), "-l", "1"],
    ):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
        try:
            want = 6 if "-lms" in argv else 2  # three samples of 50 ms; -l 1: the first at once
            got = _lines(proc, want, time.monotonic() + 10)
            assert got[:want] == (answer.splitlines() * 3)[:want]
            assert proc.poll() is None  # until killed
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_a_paced_run_keeps_each_period_in_the_ticks_of_the_default_interval() -> None:
    base = Config()
    for sampler in ("spawn", "loop"):
        paced = scaled(base._replace(sampler=sampler), LOOP_INTERVAL)
        assert paced.interval == LOOP_INTERVAL
        assert every_ticks(nvlinksource.period(paced), paced.interval) == every_ticks(
            nvlinksource.period(base._replace(sampler=sampler)), base.interval
        )
        assert every_ticks(paced.throttle_window, paced.interval) == every_ticks(
            base.throttle_window, base.interval
        )
    loop = scaled(base._replace(sampler="loop"), LOOP_INTERVAL)
    assert loop.processes_interval is not None
    assert every_ticks(loop.processes_interval, loop.interval) == every_ticks(
        LOOP_PERIOD, base.interval
    )
    spawn = scaled(base._replace(sampler="spawn"), LOOP_INTERVAL)
    assert spawn.processes_interval is None  # by spawn: every tick
