"""man/gpuagent.8: renders without warnings and documents every command, option and key."""

from __future__ import annotations

import os
import re
import subprocess

import click
import pytest

from gpuagent.commands.cli import main
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


def test_configuration_points_to_its_page() -> None:
    # Every key is in gpuagent.toml(5) (tests/test_docs_truth.py), not here.
    assert ".BR gpuagent.toml (5)" in section("CONFIGURATION")


def test_every_failure_class() -> None:
    text = section("NOTES")
    for failure in Failure:
        assert re.search(rf"^\.BR {failure.value} [,.]$", text, re.M), failure.value


def test_environment() -> None:
    text = section("ENVIRONMENT")
    for name in ("GPUAGENT_CONFIG", "NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM"):
        assert f".B {name}\n" in text


# Every page the package ships (debian/gpuagent.manpages): slurm-check's is a page of its
# own, not a .so link.
with open(os.path.join(REPO, "debian", "gpuagent.manpages"), encoding="utf-8") as _f:
    PAGES = [os.path.join(REPO, line) for line in _f.read().split()]


def test_every_page_is_shipped() -> None:
    man = os.path.join(REPO, "man")
    assert sorted(PAGES) == sorted(os.path.join(man, name) for name in os.listdir(man))


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
