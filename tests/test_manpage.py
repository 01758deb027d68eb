"""man/gpuagent.8: renders without warnings and documents every command, option and key."""

from __future__ import annotations

import os
import re
import subprocess

import click
import pytest

from gpuagent.commands.cli import main
from gpuagent.config import Config
from gpuagent.views import Failure
from tests.tools import tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(REPO, "man", "gpuagent.8")
SECTIONS = [
    "NAME",
    "SYNOPSIS",
    "DESCRIPTION",
    "COMMANDS",
    "OPTIONS",
    "CONFIGURATION",
    "EXIT STATUS",
    "ENVIRONMENT",
    "FILES",
    "SIGNALS",
    "FIRST HOSTS",
    "NOTES",
    "SEE ALSO",
]


def source() -> str:
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def section(name: str) -> str:
    """The roff source of section ``name``, with ``\\-`` turned into ``-``."""
    text = source().replace("\\-", "-")
    m = re.search(rf'^\.SH "?{name}"?\n(.*?)(?=^\.SH |\Z)', text, re.M | re.S)
    assert m is not None, f"no section {name}"
    return m.group(1)


def test_sections_in_order() -> None:
    found = [s.strip('"') for s in re.findall(r"^\.SH (.+)$", source(), re.M)]
    assert found == SECTIONS


def test_every_command_and_option() -> None:
    commands = section("COMMANDS")
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None, name
        assert f"B{name}" in commands.replace(".BR ", "B").replace("\\fB", "B"), name
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert opt in commands, f"{name} {opt}"
    options = section("OPTIONS")
    for opt in ("--config", "--version", "--help"):
        assert opt in options


def test_every_configuration_key() -> None:
    text = section("CONFIGURATION")
    for name in Config._fields:
        assert re.search(rf"^\.BR {name} \" \(default ", text, re.M), name


def test_every_failure_class() -> None:
    text = section("NOTES")
    for failure in Failure:
        assert re.search(rf"^\.BR {failure.value} [,.]$", text, re.M), failure.value


def test_environment() -> None:
    text = section("ENVIRONMENT")
    for name in ("GPUAGENT_CONFIG", "NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM"):
        assert f".B {name}\n" in text


# Every page the package ships: slurm-check's is a page of its own, not a .so link.
PAGES = [PAGE, os.path.join(os.path.dirname(PAGE), "gpuagent-slurm-check.8")]


def lint(argv: list[str], page: str = PAGE) -> subprocess.CompletedProcess[str]:
    argv = [tool(argv[0]), *argv[1:]]
    return subprocess.run([*argv, page], capture_output=True, text=True, check=False, timeout=60)


@pytest.mark.parametrize("page", PAGES)
def test_groff_has_no_warnings(page: str) -> None:
    proc = lint(["groff", "-ww", "-z", "-man"], page)
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.parametrize("page", PAGES)
def test_mandoc_lint_is_clean(page: str) -> None:
    proc = lint(["mandoc", "-T", "lint", "-W", "style"], page)
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")
