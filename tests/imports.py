"""What a fresh interpreter has imported: for the tests that keep a command's imports light."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Sequence


def loaded_after(code: str, modules: Sequence[str]) -> list[str]:
    """Which of ``modules`` are in ``sys.modules`` once a fresh interpreter has run ``code``."""
    probe = f"{code}\nimport sys\nprint([m for m in {list(modules)!r} if m in sys.modules])\n"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=30
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    loaded: list[str] = ast.literal_eval(lines[-1])
    return loaded
