"""bench.nvml: each exec of nvidia-smi is one NVML start, named by the agent's command."""

from __future__ import annotations

import pytest

from bench import day
from bench.nvml import Starts, kind
from gpuagent.sources.board import serials
from gpuagent.sources.nvlink import nvlink
from gpuagent.sources.probe import smi
from gpuagent.sources.processes import apps
from gpuagent.sources.vgpu import licence
from gpuagent.sources.wear import counters

SMI = "/usr/bin/nvidia-smi"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (smi.command(SMI, smi.FIELDS), "probe --query-gpu"),
        ([SMI, *serials.ARGS], "serials --query-gpu"),
        ([SMI, *counters.args(list(counters.FIELDS))], "wear --query-gpu"),
        ([SMI, *apps.ARGS], "--query-compute-apps"),
        ([SMI, *nvlink.STATUS_ARGS], "nvlink --status"),
        ([SMI, *nvlink.COUNTERS_ARGS], "nvlink --errorcounters"),
        ([SMI, *licence.ARGS], "-q"),
        ([SMI, "-q", "-i", "0000:18:00.0"], "-q -i"),
        ([SMI], "(no arguments)"),
        ([*smi.command(SMI, smi.FIELDS), "-lms", "1000"], "probe --query-gpu loop"),
        ([*smi.command(SMI, smi.FIELDS), "--loop-ms=500"], "probe --query-gpu loop"),
        ([SMI, *apps.ARGS, "-l", "5"], "--query-compute-apps loop"),
        (["nvidia-smi", "-L"], "-L"),
    ],
)
def test_each_command_is_its_kind(argv: list[str], expected: str) -> None:
    assert kind(argv) == expected


def test_other_programs_start_no_nvml() -> None:
    starts = Starts()
    starts.started(["/usr/bin/nvidia-imex-ctl", "-N"])
    starts.started([])
    assert (starts.total, starts.others) == (0, 2)


def test_a_long_lived_child_is_one_start_however_long_it_prints() -> None:
    starts = Starts()
    loop = [*smi.command(SMI, smi.FIELDS), "-lms", "1000"]
    starts.started(loop)
    for _ in range(3):
        starts.started([SMI, *apps.ARGS])
    assert starts.by_kind == {"probe --query-gpu loop": 1, "--query-compute-apps": 3}
    assert starts.total == 4


def test_a_simulated_loop_is_a_probe_start_a_half_hour_and_the_processes_every_3_minutes() -> None:
    loop = day.run("healthy 8-GPU host", 720, {"sampler": "loop"})
    # Two hours: the first loop and three refreshes (REFRESH), each a spawn and a child.
    assert (loop.starts["probe --query-gpu"], loop.starts["probe --query-gpu loop"]) == (4, 4)
    assert loop.steady["probe --query-gpu loop"] == loop.steady["probe --query-gpu"] == 2
    assert loop.steady["--query-compute-apps"] / loop.steady_minutes == pytest.approx(1 / 3)
    assert loop.info == 0


@pytest.mark.parametrize("name", ["failing (exit 18)", "driver-upgrade outage"])
def test_a_simulated_loop_keeps_the_situations_verdicts(name: str) -> None:
    spawn, loop = (day.run(name, 720, {"sampler": s}) for s in ("spawn", "loop"))
    assert loop.warn == spawn.warn
    if name.startswith("failing"):
        # No answer, no loop: the same spawns and lines.
        assert (loop.spawns, loop.info) == (spawn.spawns, spawn.info)
    else:
        # The loop's stop for the module going and its start once the driver settled.
        assert loop.info == spawn.info + 2
        # Its stop and start, and the half-hour refreshes (REFRESH) of the two hours.
        assert loop.starts["probe --query-gpu loop"] == 5
