"""``scripts/demo`` and ``scripts/demo --sick`` (tests/sick.py) from a plain clone, with no
``../shared`` beside it: the healthy host samples without a warning, the sick one shows every
surface and returns the status's exit code."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gpuagent.commands.status import ExitCode
from tests import fakesysfs, journalfeed
from tests.tools import need

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The files a clone of this tree has (tracked, and new ones not ignored: what is being
    tested), in a directory with nothing beside it."""
    git = shutil.which("git")
    need(git is not None and os.path.exists(os.path.join(REPO, ".git")), "not a git checkout")
    assert git is not None
    listed = subprocess.run(
        [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    top = str(tmp_path_factory.mktemp("plain"))
    clone = os.path.join(top, "gpuagent")
    for name in filter(None, listed.split("\0")):
        src = os.path.join(REPO, name)
        if not os.path.lexists(src):
            continue  # deleted in the work tree, not yet in the index
        dst = os.path.join(clone, name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    assert os.listdir(top) == ["gpuagent"]  # no ../shared
    return clone


def demo(clone: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUAGENT_CONFIG", "PYTHONPATH")}
    return subprocess.run(
        [os.path.join(clone, "scripts", "demo"), *args],
        env={**env, "COLUMNS": "80"},
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )


def test_the_demo_samples_eight_gpus_without_a_warning(clone: str) -> None:
    res = demo(clone)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("\u25cf gpuagent - 8 GPUs, sampling\n"), res.stdout
    assert "warning" not in res.stdout + res.stderr
    assert "failing" not in res.stdout + res.stderr


def test_the_sick_demo_shows_three_problems_and_returns_the_status(clone: str) -> None:
    need(journalfeed.journal_remote() is not None, "no systemd-journal-remote")
    res = demo(clone, "--sick")
    assert res.returncode == ExitCode.CRITICAL, res.stdout + res.stderr
    assert "warning" not in res.stderr
    slots = fakesysfs.gpu_slots(8)
    status = res.stdout[res.stdout.index("\u25cf gpuagent") :]
    # The host's remedy first: the reboot the worst asks for ends the resets too; each of the
    # three counted, and named in full under it.
    short = ", ".join(s.removeprefix("0000:") for s in (slots[7], slots[1], slots[5]))
    assert status.startswith(f"\u25cf gpuagent - drain and reboot: fixes {short}; 3 critical;")
    assert (
        f"remedy: drain and reboot: fixes {slots[7]} gone_from_bus, {slots[1]} Xid 119, "
        f"{slots[5]} requires_reset"
    ) in " ".join(status.split())
    assert "reset_gpu: critical xid: Xid 119 (GSP RPC timeout)" in status
    assert "reset_gpu: critical requires_reset:" in status
    assert "reboot: critical gone_from_bus:" in status
    assert [ln for ln in status.splitlines() if len(ln) > 80] == []
