"""bench.gpu_experiment against the fake nvidia-smi on PATH, and where there is no GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from bench import gpu_experiment as gx
from tests.fakehost import FAKE_SMI, H200_LOAD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLOTS = ["0000:18:00.0", "0000:2a:00.0"]


def experiment(
    tmp_path: Path, step: Mapping[str, object] | None, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python3 -m bench.gpu_experiment ARGS`` with PATH holding only the fake nvidia-smi
    answering ``step`` (None: no nvidia-smi at all) and python3."""
    path = tmp_path / "bin"
    path.mkdir()
    if step is not None:
        (path / "nvidia-smi").symlink_to(FAKE_SMI)
        (tmp_path / "step.json").write_text(json.dumps(step))
    env = {
        "PATH": f"{path}:{os.path.dirname(sys.executable)}",
        "FAKE_NVIDIA_SMI_SCENARIO": str(tmp_path / "step.json"),
        "PYTHONPATH": ROOT,
    }
    return subprocess.run(
        [sys.executable, "-m", "bench.gpu_experiment", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_every_command_measured_with_its_output_saved(tmp_path: Path) -> None:
    out = tmp_path / "out"
    step = {"capture": H200_LOAD, "slots": SLOTS}
    args = ("--out", str(out), "--runs", "2", "--loop-seconds", "1", "--no-toggle")
    done = experiment(tmp_path, step, *args)
    assert done.returncode == 0, done.stderr
    rows = [ln for ln in done.stdout.splitlines() if ln.startswith("| `")]
    assert len(rows) == len(gx.COMMANDS) + 1  # each command once, as found, and the loop
    assert "| `--query-gpu=<the probe's 35 fields> --format=csv,noheader,nounits` |" in rows[0]
    assert "median of 2" in done.stdout
    assert rows[-1].startswith("| `--query-gpu=<the probe's 35 fields>") and "-lms 1000" in rows[-1]
    assert "not switched (--no-toggle)" in done.stdout
    saved = {p.name for p in out.iterdir()}
    assert saved == {
        "NOTE.md",
        "loop.txt",
        *(f"{name}.persistence-on.txt" for name, _, _ in gx.COMMANDS),
    }
    probe = (out / "probe.persistence-on.txt").read_text()
    assert [ln.split(", ")[3] for ln in probe.splitlines()] == [
        "00000000:18:00.0",
        "00000000:2A:00.0",
    ]
    assert "00000000:18:00.0" in (out / "loop.txt").read_text()
    note = (out / "NOTE.md").read_text()
    assert "NVIDIA H200, 590.48.01, 00000000:18:00.0" in note
    assert "- date: " in note and "- host: " in note
    assert "| nvidia-smi … |" in note  # the table beside the outputs


def test_no_nvidia_smi_is_no_gpu_and_exit_0(tmp_path: Path) -> None:
    done = experiment(tmp_path, None, "--out", str(tmp_path / "out"))
    assert (done.returncode, done.stdout) == (
        0,
        "No GPU here: nvidia-smi is not on PATH; nothing measured.\n",
    )
    assert not (tmp_path / "out").exists()


def test_a_driver_not_loaded_is_no_gpu_and_exit_0(tmp_path: Path) -> None:
    step = {"error": "driver-not-loaded-exit9.txt", "exit": 9}
    done = experiment(tmp_path, step, "--out", str(tmp_path / "out"))
    assert done.returncode == 0
    assert done.stdout.startswith("No GPU answers here (")
    assert "exit 9: NVIDIA-SMI has failed" in done.stdout
    assert not (tmp_path / "out").exists()


def test_a_wedged_nvidia_smi_costs_the_timeout_never_a_hang(tmp_path: Path) -> None:
    done = experiment(tmp_path, {"hang": 60}, "--timeout", "1", timeout=30)
    assert done.returncode == 0
    assert "timed out" in done.stdout


def test_bad_arguments_are_one_line_and_exit_2() -> None:
    assert gx.main(["--runs", "0"]) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0, Enabled\n1, Disabled\n", {"0": True, "1": False}),
        ("No devices were found\n", {}),
        ("", {}),
    ],
)
def test_modes(text: str, expected: dict[str, bool]) -> None:
    assert gx.modes(text) == expected


def test_words_and_counts() -> None:
    assert [gx.mode_word(m) for m in ({"0": True}, {"0": False}, {"0": True, "1": False})] == [
        "on",
        "off",
        "mixed",
    ]
    assert (gx.samples(17, 8), gx.samples(3, 0)) == (2, 0)
    runs = [gx.Run(1, 1, 0, False), gx.Run(2, None, None, True), gx.Run(1, 1, 0, False)]
    assert gx.exits(runs) == "0, timeout"
    assert gx.median_ms([r.cpu for r in runs]) == 1000
    assert gx.median_ms([None]) is None
