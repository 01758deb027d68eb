"""Prerequisites of tests that use real tools: skipped where absent, enforced in CI.

``./scripts/test`` installs every tool (``scripts/setup --dev``); a CI run (``$CI`` set) where
one is missing fails instead of skipping, so a missing install step cannot pass as green.
"""

from __future__ import annotations

import os
import shutil

import pytest


def need(ok: bool, why: str) -> None:
    """Skip the test unless ``ok``; fail it in CI."""
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (scripts/setup --dev installs it)")
        pytest.skip(why)


def tool(name: str) -> str:
    """The path of command ``name``; skips the test (fails it in CI) when it is not installed."""
    path = shutil.which(name)
    need(path is not None, f"{name} is not installed")
    assert path is not None
    return path
