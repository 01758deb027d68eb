"""The ``gpuagent`` entry point: ``status`` without click prints and exits as the CLI does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from gpuagent.commands.entry import quick
from tests import states
from tests.test_status import write_state

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VIA_CLI = "import sys; from gpuagent.commands.cli import main; sys.argv[0] = 'gpuagent'; main()"
VIA_ENTRY = "import sys; from gpuagent.commands.entry import main; sys.argv[0] = 'gpuagent'; main()"


@pytest.mark.parametrize(
    ("args", "parsed"),
    [
        (["status"], (None, {"as_json": False, "wide": False})),
        (["status", "--json"], (None, {"as_json": True, "wide": False})),
        (["status", "--wide", "--json"], (None, {"as_json": True, "wide": True})),
        (["--config", "/c.toml", "status"], ("/c.toml", {"as_json": False, "wide": False})),
    ],
)
def test_the_status_forms_are_read_here(
    args: list[str], parsed: tuple[str | None, dict[str, bool]]
) -> None:
    assert quick(args, {}) == parsed


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["run"],
        ["status", "--help"],
        ["status", "--json", "--json"],
        ["status", "--format", "json"],
        ["status", "--format=npd"],
        ["status", "extra"],
        ["--config", "", "status"],
        ["--config", "--json", "status"],
        ["--config=/c.toml", "status"],
        ["--config"],
        ["--version"],
        ["status", "-h"],
    ],
)
def test_every_other_command_line_is_clicks(args: list[str]) -> None:
    assert quick(args, {}) is None


def test_shell_completion_is_clicks() -> None:
    assert quick(["status"], {"_GPUAGENT_COMPLETE": "bash_source"}) is None


def _run(code: str, args: list[str], conf: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": REPO, "GPUAGENT_CONFIG": conf}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    # The two runs are a moment apart: an age may have turned a second.
    return proc.returncode, re.sub(r"\d+s\b", "Ns", proc.stdout), proc.stderr


@pytest.mark.parametrize(
    "args",
    [["status"], ["status", "--json"], ["status", "--wide"], ["--config", "CONF", "status"]],
)
@pytest.mark.parametrize("config", ["good", "bad key", "no state file"])
def test_status_without_click_is_the_clis_byte_for_byte(
    tmp_path: str, args: list[str], config: str
) -> None:
    conf = write_state(tmp_path, states.state(now=time.time() - 1))
    with open(conf, "a") as f:
        if config == "bad key":
            f.write("intervall = 5\n")
    if config == "no state file":
        os.remove(os.path.join(tmp_path, "state.json"))
    args = [conf if a == "CONF" else a for a in args]
    assert _run(VIA_ENTRY, args, conf) == _run(VIA_CLI, args, conf)


def test_status_does_not_import_click(tmp_path: str) -> None:
    conf = write_state(tmp_path, states.state(now=time.time() - 1))
    code = (
        "import sys\n"
        "from gpuagent.commands.entry import main\n"
        f"sys.argv = ['gpuagent', '--config', {conf!r}, 'status']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('click', 'gpuagent.commands.cli', 'gpuagent.schema', 'difflib')"
        " if m in sys.modules])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=30
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr
