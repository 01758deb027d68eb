"""Command line: ``run``, ``status``, ``detect``, ``probe``, ``check-config`` (thin; no logic
here), and the unit's helpers ``link-textfile`` and ``reload``.

Imports beyond click, json and tomllib happen inside the commands that need them, so that
``gpuagent status`` starts fast.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any, NoReturn

import click

from . import __version__, config

__all__ = ["main"]


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


def _load_or_exit(path: str, required: bool) -> config.Config:
    """The config, or exit 78 with the error logged as the agent logs it: to the journal
    with its MESSAGE_ID under systemd, else to stderr."""
    try:
        return config.load(path, required=required)
    except config.ConfigError as e:
        import logging  # noqa: PLC0415

        from .logs import Event, EventLog, setup  # noqa: PLC0415

        setup("info")
        EventLog()(logging.ERROR, Event.CONFIG_ERROR, str(e), config_file=path)
        sys.exit(config.EX_CONFIG)


# no_args_is_help=False: a bare `gpuagent` is a usage error (exit 2), not a help page (exit 0).
@click.group(context_settings={"help_option_names": ["-h", "--help"]}, no_args_is_help=False)
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    help=f"TOML config file [default: $GPUAGENT_CONFIG or {config.DEFAULT_PATH}]",
)
@click.version_option(__version__, prog_name="gpuagent")
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """Host agent that samples NVIDIA GPUs with nvidia-smi for systemd and Prometheus."""
    if config_path == "":
        click.echo("gpuagent: --config: expected a path, got an empty string", err=True)
        sys.exit(config.EX_CONFIG)
    ctx.obj = {"config_file": config.config_path(config_path)}


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
    from .daemon import Daemon  # noqa: PLC0415
    from .logs import setup  # noqa: PLC0415

    path, required = ctx.obj["config_file"]
    cfg = _load_or_exit(path, required)
    setup(cfg.log_level)
    sys.exit(Daemon(cfg, (path, required), interval=interval).run(ticks))


@main.command()
@click.option(
    "--json", "as_json", is_flag=True, help="Print the state file as JSON, with its health."
)
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show the running agent's view; exit 0 ok, 1 warning, 2 critical, 3 unknown."""
    from . import state  # noqa: PLC0415
    from .status import ExitCode, checked, judge, render  # noqa: PLC0415

    cfg = _salvage(ctx)
    try:
        st = state.read(cfg.state_file)
    except state.StateError as e:
        if not os.path.lexists(cfg.state_file):
            from . import unitstate  # noqa: PLC0415

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
        text = render(typed, now, code, reason)
    _print(text)
    sys.exit(code)


def _unknown(reason: str, as_json: bool = True) -> NoReturn:
    """Exit 3 for a state that cannot be judged: for ``--json`` an object alone on stdout
    (its ``health_reason`` says why), so that a script always has JSON to parse; else the
    reason on stderr."""
    from .status import ExitCode, clean  # noqa: PLC0415

    if as_json:
        health = ExitCode.UNKNOWN.health
        _print(json.dumps({"health": health, "health_reason": reason}, indent=2))
    else:
        click.echo(f"gpuagent: {clean(reason)}", err=True)
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


@main.command("check-config")
@click.argument("path", required=False)
@click.option(
    "--quiet", "-q", is_flag=True, help="Say nothing when it is OK (the unit's reload uses it)."
)
@click.pass_context
def check_config(ctx: click.Context, path: str | None, quiet: bool) -> None:
    """Validate a config file [default: the one `run` reads]; exit 78 if it is bad."""
    required = True
    if path is None:
        path, required = ctx.obj["config_file"]
    cfg = _load_or_exit(path, required)
    for warning in [*config.warnings(cfg), *_unit_warnings(path, cfg)]:
        click.echo(f"gpuagent: warning: {path}: {warning}", err=True)
    if quiet:
        return
    absent = not required and not os.path.lexists(path)
    click.echo(f"{path}: no such file; the defaults apply" if absent else f"{path}: OK")


def _unit_warnings(path: str, cfg: config.Config) -> list[str]:
    """What the packaged service cannot do with ``cfg``, though root running this can: it runs
    as a dynamic user (other users' rights) that may write only under /run/gpuagent."""
    out = []
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0o644
    if not mode & 0o004:
        out.append(
            "other users may not read it, and the packaged service (a dynamic user) is one: "
            "it would fail to start or reload (chmod o+r)"
        )
    if not cfg.state_file.startswith("/run/gpuagent/"):
        out.append(
            f"state_file {cfg.state_file!r} is outside /run/gpuagent, where alone the packaged "
            "service may write: it could not keep a state there for gpuagent status"
        )
    return out


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
    from . import textlink  # noqa: PLC0415

    path, required = ctx.obj["config_file"]
    cfg, error = config.salvage(path, required=required)
    default = config.Config().textfile
    if remove:
        # Whatever the file says now, the links made at start go: none may dangle.
        textlink.unlink([cfg.textfile, default])
        return
    if error is not None:
        # The agent will not start (or reload) on this file, and says why itself: once.
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
    from . import pci  # noqa: PLC0415

    cfg = _salvage(ctx)
    gpus, problems = pci.scan(cfg.sysfs_root)
    for problem in problems:
        click.echo(f"gpuagent: {problem}", err=True)
    loaded = pci.module_loaded(cfg.sysfs_root)
    if as_json:
        out: dict[str, Any] = {"gpus": [asdict(g) for g in gpus], "module_loaded": loaded}
        click.echo(json.dumps(out, indent=2))
    else:
        if not gpus:
            click.echo("no NVIDIA GPU on the PCI bus")
        for g in gpus:
            driver = g.driver or "-"
            click.echo(f"{g.slot}  device {g.device_id}  class {g.pci_class}  driver {driver}")
        click.echo(f"nvidia kernel module: {'loaded' if loaded else 'not loaded'}")
    sys.exit(1 if problems else 0)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def probe(ctx: click.Context, as_json: bool) -> None:
    """Run nvidia-smi once and print what the agent parses from it; exit 1 on failure, or
    when nvidia-smi names a GPU in an error line instead of its row."""
    from . import pci  # noqa: PLC0415
    from .probe import Prober, lookup  # noqa: PLC0415
    from .runner import Runner  # noqa: PLC0415
    from .status import clean  # noqa: PLC0415

    cfg = _load(ctx)
    gpus, _ = pci.scan(cfg.sysfs_root)
    if not any(g.probeable for g in gpus):
        # The agent's own gate; a module that is not loaded is no news on such a host.
        which = "is bound to nvidia or unbound" if gpus else "at all"
        click.echo(f"gpuagent: no NVIDIA GPU on the PCI bus {which}; nothing to probe", err=True)
        sys.exit(1)
    if not cfg.load_driver and not pci.module_loaded(cfg.sysfs_root):
        # The agent's own gate: nvidia-smi would load the module mid driver upgrade.
        click.echo(
            "gpuagent: the nvidia kernel module is not loaded; not running nvidia-smi, which "
            "would load it (load_driver = true probes anyway)",
            err=True,
        )
        sys.exit(1)
    binary = lookup(cfg.nvidia_smi)
    if binary is None:
        click.echo(f"gpuagent: nvidia-smi not found ({cfg.nvidia_smi!r})", err=True)
        sys.exit(1)
    result = Prober(Runner(timeout=cfg.probe_timeout)).probe(binary)
    if result.rows is None:
        click.echo(f"gpuagent: probe failed ({result.failure}): {clean(result.error)}", err=True)
        sys.exit(1)
    if as_json:
        out = {"fields": list(result.fields), "rows": result.rows, "gpu_errors": result.gpu_errors}
        click.echo(json.dumps(out, indent=2))
    else:
        for row in result.rows:
            # None: nvidia-smi's [N/A] and friends.
            click.echo(clean(", ".join(f"{k}={'-' if v is None else v}" for k, v in row.items())))
    for warning in result.warnings:
        click.echo(f"gpuagent: nvidia-smi: {clean(warning)}", err=True)
    # A GPU nvidia-smi names in an error line instead of a row is lost: the probe failed for it.
    for slot, error in sorted(result.gpu_errors.items()):
        click.echo(f"gpuagent: GPU {slot}: {clean(error)}", err=True)
    sys.exit(1 if result.gpu_errors else 0)
