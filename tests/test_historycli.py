"""``gpuagent history`` against what anyone may put in its way (issue 40): journal fields that
are no numbers, escape sequences in journal fields on a terminal, and a ``gpus.json`` that is
a FIFO or nests too deeply.  Real journal files (make-test-journal), the command as a process."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from typing import Any

from click.testing import CliRunner

from gpuagent.commands.cli import main
from gpuagent.logs import Event
from tests.test_clear import LATER, clear_entry
from tests.test_kernel import FELL_OFF
from tests.test_kernlog import append, make
from tests.test_timeline import SLOT, agent_line

__all__ = ["make"]  # the fixture

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
# An escape sequence that erases the line and moves up: what hid lines on a terminal.
ERASE = "\x1b[2K\x1b[1A"


def conf(tmp_path: str, journal: str) -> str:
    path = os.path.join(tmp_path, "h.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'journal_directory = "{journal}"\n')
    return path


def command(config: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpuagent", "--config", config, "history", *args]


def test_fields_that_are_no_numbers_are_no_traceback(make: Any, tmp_path: str) -> None:
    # XID=² and _AUDIT_LOGINUID=² were tracebacks: str.isdigit says yes, int() says no.
    journal = make(FELL_OFF)
    fields = {"PCI_SLOT": SLOT, "PROBLEM": "xid", "XID": "\u00b2", "ACTION": "reboot"}
    append(journal, agent_line(LATER - 5, Event.XID_PROBLEM, **fields))
    append(journal, clear_entry("0", LATER, login="\u00b2", sudo_user="alice"))
    append(journal, clear_entry("0", LATER + 1, login="9" * 5000))
    res = CliRunner(mix_stderr=False).invoke(
        main, ["history", SLOT, "--json", "--days", "100000", "--directory", journal]
    )
    assert res.exit_code == 0, res.stderr
    steps = json.loads(res.stdout)
    assert [(s["event"], s["xid"], s["by"]) for s in steps[1:]] == [
        ("xid", 79, None),
        ("problem_start", None, None),
        ("clear", None, "alice"),  # no login uid to name: the SUDO_USER it sent
        ("clear", None, "root"),  # nor here: the name it sent
    ]


def test_an_escape_sequence_in_a_journal_field_reaches_a_terminal_disarmed(
    make: Any, tmp_path: str
) -> None:
    journal = make(FELL_OFF)
    fields = {"PCI_SLOT": SLOT, "PROBLEM": f"evil{ERASE}x", "ACTION": f"reboot{ERASE}"}
    append(journal, agent_line(LATER - 5, Event.PROBLEM_THROTTLED, **fields))
    master, slave = pty.openpty()
    child = subprocess.Popen(
        command(conf(tmp_path, journal), "--days", "100000"),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=ROOT,
        close_fds=True,
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        child.kill()
        child.wait(timeout=10)
    text = out.decode("utf-8", "replace")
    assert "\x1b" not in text
    assert "problem_start evil?[2K?[1Ax (action: reboot?[2K?[1A)" in text


def test_gpus_json_that_is_a_fifo_or_too_deep_is_one_line(make: Any, tmp_path: str) -> None:
    # The board's serial is looked up in gpus.json: a FIFO there hung the command, deep
    # nesting was a RecursionError traceback, a huge file was read whole.
    journal = make(FELL_OFF)
    state = os.path.join(tmp_path, "state")
    os.mkdir(state)
    gpus = os.path.join(state, "gpus.json")
    env = {**os.environ, "STATE_DIRECTORY": state}
    config = conf(tmp_path, journal)
    os.mkfifo(gpus)
    for reason in ("not a regular file", "nested too deeply", "larger than 1048576 bytes"):
        if reason == "nested too deeply":
            os.unlink(gpus)
            with open(gpus, "w", encoding="utf-8") as f:
                f.write("[" * 100_000 + "]" * 100_000)
        elif reason.startswith("larger"):
            with open(gpus, "w", encoding="utf-8") as f:
                f.write(" " * (1024 * 1024 + 1))
        done = subprocess.run(  # noqa: PLW1510 (the exit status is asserted)
            command(config, "1320221034567", "--days", "100000"),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 1
        assert "Traceback" not in done.stderr
        lines = done.stderr.splitlines()
        assert lines[0] == f"gpuagent: cannot read {gpus}: {reason}; the journal's alone" or (
            lines[0] == f"gpuagent: {gpus}: {reason}; the journal's alone"
        )
        assert lines[1].startswith("gpuagent: no board with serial 1320221034567")
