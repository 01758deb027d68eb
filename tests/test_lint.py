"""ruff and mypy --strict as tests: skipped where the tools are absent, enforced in CI."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.tools import tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args: list[str]) -> None:
    proc = subprocess.run(
        [tool("ruff"), *args], cwd=REPO, capture_output=True, text=True, check=False, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict() -> None:
    proc = subprocess.run(
        [tool("mypy")], cwd=REPO, capture_output=True, text=True, check=False, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
