"""Command line: ``run``, ``status``, ``detect``, ``probe``, ``check-config``, ``slurm-check``
(:mod:`gpuagent.commands.schedcli`), ``clear`` (:mod:`gpuagent.commands.clearcli`), ``history``
and ``rma`` (:mod:`gpuagent.commands.rmacli`; thin, no logic here), the unit's helpers
``link-textfile`` and ``reload``, and ``units`` (debugging).

Imports beyond click and tomllib happen inside the commands that need them, and the
commands of other modules are imported when they are asked for (:class:`LazyGroup`), so that
each command starts fast; the installed ``gpuagent`` (:mod:`gpuagent.commands.entry`) runs
``gpuagent status`` without this module, and click, where it can.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any

import click

from gpuagent import config

__all__ = ["UNKNOWN", "Check", "LazyGroup", "main"]

# The commands defined in other modules: name -> "module:attribute".
_ELSEWHERE = {
    "clear": "gpuagent.commands.clearcli:clear",
    "evidence": "gpuagent.commands.evidencecli:evidence",
    "history": "gpuagent.commands.historycli:history",
    "rma": "gpuagent.commands.rmacli:rma",
    "slurm-check": "gpuagent.commands.schedcli:slurm_check",
    "units": "gpuagent.commands.unitscli:units",
    "victims": "gpuagent.commands.victimscli:victims",
}


class LazyGroup(click.Group):
    """A click group that imports the module of a command in ``lazy`` (name ->
    ``module:attribute``) only when that command is asked for (run, or listed in the help)."""

    def __init__(self, *args: Any, lazy: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = self.lazy.get(cmd_name)
        if where is None:
            return super().get_command(ctx, cmd_name)
        module, _, name = where.partition(":")
        command: click.Command = getattr(importlib.import_module(module), name)
        return command


class Check(click.Command):
    """A checking command (``status``, ``probe``), whose exit status a Nagios check reads:
    0 ok, 1 warning, 2 critical, 3 unknown.  A usage error (a typo'd ``--jsno``) is unknown,
    3, never click's 2, which would read as critical."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            e.exit_code = UNKNOWN
            raise


# Nagios's UNKNOWN: a check that could not tell.
UNKNOWN = 3


def _load(ctx: click.Context) -> config.Config:
    path, required = ctx.obj["config_file"]
    try:
        return config.load(path, required=required)
    except config.ConfigError as e:
        click.echo(f"gpuagent: {e}", err=True)
        sys.exit(config.EX_CONFIG)


def _salvage(ctx: click.Context) -> config.Config:
    """The config for commands that must work whatever the file says: a bad file is a
    warning and its valid settings are used."""
    path, required = ctx.obj["config_file"]
    cfg, error = config.salvage(path, required=required)
    if error is not None:
        click.echo(f"gpuagent: warning: {error}; using its valid settings only", err=True)
    return cfg


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    # Not click.version_option: that wants the version at import, and a checkout asks git.
    if value and not ctx.resilient_parsing:
        from gpuagent.version import version  # noqa: PLC0415

        click.echo(f"gpuagent, version {version()}")
        ctx.exit()


# A bare `gpuagent` shows the help and exits 0 (main's own, the same in click 8.1 and 8.2,
# whose no_args_is_help differ in exit status).
@click.group(
    cls=LazyGroup,
    lazy=_ELSEWHERE,
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=True,
)
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    help=f"TOML config file [default: $GPUAGENT_CONFIG or {config.DEFAULT_PATH}]",
)
@click.option(
    "--version",
    "-V",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """Host agent that samples NVIDIA GPUs with nvidia-smi for systemd and Prometheus."""
    if config_path == "":
        click.echo("gpuagent: --config: expected a path, got an empty string", err=True)
        sys.exit(config.EX_CONFIG)
    ctx.obj = {"config_file": config.config_path(config_path)}
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())
        ctx.exit(0)


@main.command()
@click.option("--ticks", type=click.IntRange(min=1), help="Run N ticks, then exit 0.")
@click.option(
    "--interval",
    type=click.FloatRange(min=config.MIN_INTERVAL, max=86400),
    help="Seconds between ticks (overrides the config; caps probe_timeout at 0.8 of it).",
)
@click.pass_context
def run(ctx: click.Context, ticks: int | None, interval: float | None) -> None:
    """Run the agent in the foreground (what the systemd unit starts)."""
    import logging  # noqa: PLC0415

    from gpuagent.commands import runconfig  # noqa: PLC0415
    from gpuagent.daemon import Daemon  # noqa: PLC0415
    from gpuagent.edges.lock import EX_RUNNING, AlreadyRunning  # noqa: PLC0415
    from gpuagent.logs import Event, EventLog, setup  # noqa: PLC0415

    path, required = ctx.obj["config_file"]
    setup(config.salvage(path, required=required)[0].log_level)
    log = EventLog()
    load = runconfig.RunConfig(log)
    try:
        # The service runs on a bad file's valid settings, and says so; a hand run refuses it.
        cfg, note = load.resolve(path, required, salvage=runconfig.is_service(os.environ))
    except config.ConfigError as e:
        log(logging.ERROR, Event.CONFIG_ERROR, str(e), config_file=path)
        sys.exit(config.EX_CONFIG)
    log(logging.INFO, None, load.files)
    for error in load.errors:
        log(logging.ERROR, Event.CONFIG_ERROR, f"{error}; not used", config_file=path)
    problem = runconfig.state_dir_problem(cfg, os.environ)
    if problem is not None:
        log(logging.ERROR, None, f"not starting: {problem}")
        sys.exit(config.EX_CONFIG)
    daemon = Daemon(
        cfg,
        (path, required),
        interval=interval,
        log=log,
        load=load,
        problem=runconfig.config_problem(load.errors),
    )
    try:
        # The state file's lock first (the daemon keeps it), then the textfile's.
        daemon.lock.acquire(cfg.state_file)
        load.lock_textfile(cfg)
    except AlreadyRunning as e:
        log(logging.ERROR, None, f"not starting: {e}")
        sys.exit(EX_RUNNING)
    load.say(note)
    sys.exit(daemon.run(ticks))


@main.command(cls=Check)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the state file as JSON, with its health."
)
@click.option("--wide", is_flag=True, help="Add each GPU's UUID and full name to the table.")
@click.option(
    "--format",
    "form",
    type=click.Choice(["text", "json", "npd", "npd-warning"]),
    default="text",
    help="npd: one line for node-problem-detector's condition; exit 0 ok, 1 a critical "
    "problem, 2 unknown.  npd-warning: the same for a warning (its event).",
)
@click.pass_context
def status(ctx: click.Context, as_json: bool, wide: bool, form: str) -> None:
    """Show the running agent's view; exit 0 ok, 1 warning, 2 critical, 3 unknown (a usage
    error too)."""
    if form in ("npd", "npd-warning"):
        from gpuagent.commands import schedcli  # noqa: PLC0415

        schedcli.npd(ctx, warning=form == "npd-warning")
    from gpuagent.commands.statuscmd import show  # noqa: PLC0415

    show(ctx.obj["config_file"], as_json=as_json or form == "json", wide=wide)


@main.command("check-config")
@click.argument("path", required=False)
@click.option(
    "--quiet", "-q", is_flag=True, help="Say nothing when it is OK (the unit's reload uses it)."
)
@click.pass_context
def check_config(ctx: click.Context, path: str | None, quiet: bool) -> None:
    """Validate a config file and its drop-ins PATH.d/*.toml [default: the ones `run` reads]:
    every error of every file; exit 78 if one is bad."""
    required = True
    if path is None:
        path, required = ctx.obj["config_file"]
    from gpuagent.commands.unitcheck import check  # noqa: PLC0415

    reading = config.read(path, required=required)
    errors, warnings = check(path, reading)
    for warning in warnings:
        click.echo(f"gpuagent: warning: {warning}", err=True)
    if errors:
        import logging  # noqa: PLC0415

        from gpuagent.logs import Event, EventLog, setup  # noqa: PLC0415

        setup("info")
        for error in errors:
            EventLog()(logging.ERROR, Event.CONFIG_ERROR, error, config_file=path)
        sys.exit(config.EX_CONFIG)
    if quiet:
        return
    dropins = [name for name in reading.files if name != path]
    if path not in reading.files:
        then = "the drop-ins and the defaults apply" if dropins else "the defaults apply"
        click.echo(f"{path}: no such file; {then}")
    else:
        click.echo(f"{path}: OK")
    for dropin in dropins:
        click.echo(f"{dropin}: OK")


@main.command(hidden=True)
@click.argument("pid", type=click.IntRange(min=2))
def reload(pid: int) -> None:
    """Ask the agent PID to reload and probe now (the unit's ExecReload; needs no kill(1))."""
    import signal  # noqa: PLC0415

    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as e:
        click.echo(f"gpuagent: cannot signal pid {pid}: {e.strerror or e}", err=True)
        sys.exit(1)


# Hidden: the unit's helper, not a command for people (gpuagent(8) still describes it).
@main.command("link-textfile", hidden=True)
@click.option("--remove", is_flag=True, help="Remove the link (after the service stopped).")
@click.pass_context
def link_textfile(ctx: click.Context, remove: bool) -> None:
    """Link node_exporter's textfile to the agent's metrics (run by the unit as root)."""
    from gpuagent.edges import textlink  # noqa: PLC0415

    path, required = ctx.obj["config_file"]
    # A bad file's valid settings: the service runs on them (and node_exporter must see its
    # problem ``config``), so a bad file is linked all the same.
    cfg = config.salvage(path, required=required)[0]
    default = config.Config().textfile
    if remove:
        # Whatever the file says now, the links made at start go: none may dangle.
        textlink.unlink([cfg.textfile, default])
        return
    try:
        textlink.link(cfg.textfile, [default])
    except OSError as e:
        click.echo(f"gpuagent: cannot link {cfg.textfile}: {e.strerror or e}", err=True)
        sys.exit(1)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def detect(ctx: click.Context, as_json: bool) -> None:
    """Scan the PCI bus for NVIDIA GPUs (no nvidia-smi); exit 1 if sysfs could not be read."""
    from gpuagent.commands import oneshot  # noqa: PLC0415

    sys.exit(oneshot.detect(_salvage(ctx), as_json))


@main.command(cls=Check)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the whole answer and its findings as JSON."
)
@click.pass_context
def probe(ctx: click.Context, as_json: bool) -> None:
    """Run nvidia-smi once and print each GPU's findings and their actions; exit 0 none, 1 a
    warning, 2 a critical one, 3 unknown (no answer: the bus unread, a gate, nvidia-smi
    failing; or a usage error)."""
    from gpuagent.commands import oneshot  # noqa: PLC0415

    sys.exit(oneshot.probe(_load(ctx), as_json))
