"""``gpuagent status`` in its text and JSON forms, without click: the CLI's command calls
:func:`show`, and so does :mod:`gpuagent.commands.entry` for a command line it can parse
alone, so that the command people and scripts run most starts without importing click.

click is imported only to say something on stderr (a config warning, an unknown state), so
that those lines are click's, whichever way the command came."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import NoReturn

from gpuagent import config

__all__ = ["show"]


def _err(message: str) -> None:
    import click  # noqa: PLC0415

    click.echo(message, err=True)


def show(config_file: tuple[str, bool], *, as_json: bool, wide: bool) -> NoReturn:
    """Print the state file that ``config_file`` (its path, and whether it was asked for)
    names, judged; exit with its health's code."""
    from gpuagent import state  # noqa: PLC0415
    from gpuagent.commands.status import ExitCode, checked, judge  # noqa: PLC0415
    from gpuagent.commands.statustext import render  # noqa: PLC0415

    path, required = config_file
    cfg, error = config.salvage(path, required=required)
    if error is not None:
        _err(f"gpuagent: warning: {error}; using its valid settings only")
    try:
        st = state.read(cfg.state_file)
    except state.StateError as e:
        # Only a file that is not there (not one refused: a state directory this user may
        # not search) means the service stopped.
        if isinstance(e, state.NoStateFile):
            from gpuagent.edges.systemd import unitstate  # noqa: PLC0415

            # systemd removed it at stop: it knows since when, or that the agent never ran.
            stopped = unitstate.describe(unitstate.query())
            if stopped is not None:
                if not as_json:
                    _print(f"\u25cb gpuagent - {stopped}")
                    sys.exit(ExitCode.UNKNOWN)
                _unknown(stopped)
        _unknown(str(e), as_json)
    typed = checked(st)
    if isinstance(typed, str):
        _unknown(f"{cfg.state_file}: not a gpuagent state file: bad {typed!r}", as_json)
    now = time.time()
    code, reason = judge(typed, now)
    if as_json:
        text = json.dumps(
            {**st, "health": code.health, "health_reason": reason}, indent=2, sort_keys=True
        )
    else:
        text = render(typed, now, code, reason, wide=wide)
    _print(text)
    sys.exit(code)


def _unknown(reason: str, as_json: bool = True) -> NoReturn:
    """Exit 3 for a state that cannot be judged: for ``--json`` an object alone on stdout
    (its ``health_reason`` says why), so that a script always has JSON to parse; else the
    reason on stderr."""
    from gpuagent.commands.status import ExitCode, clean  # noqa: PLC0415

    if as_json:
        health = ExitCode.UNKNOWN.health
        _print(json.dumps({"health": health, "health_reason": reason}, indent=2))
    else:
        _err(f"gpuagent: {clean(reason)}")
    sys.exit(ExitCode.UNKNOWN)


def _print(text: str) -> None:
    """Print to stdout whatever it is: a terminal that cannot encode a character gets "?",
    and a full or broken stdout loses the text, not the exit status."""
    out = sys.stdout
    if out is None:
        return
    if hasattr(out, "reconfigure"):
        out.reconfigure(errors="replace")
    try:
        out.write(text + "\n")
        out.flush()
    except OSError:
        # Point fd 1 at /dev/null so that the interpreter's last flush cannot fail either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)
