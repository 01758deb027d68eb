"""Command line: ``run``, ``status``, ``detect``, ``probe`` (thin; no logic here).

Imports beyond click, json and tomllib happen inside the commands that need them, so that
``gpuagent status`` starts fast.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any

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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    type=click.FloatRange(min=0.001, max=86400),
    help="Seconds between ticks (overrides the config).",
)
@click.pass_context
def run(ctx: click.Context, ticks: int | None, interval: float | None) -> None:
    """Run the agent in the foreground (what the systemd unit starts)."""
    from .daemon import Daemon  # noqa: PLC0415
    from .logs import Event, EventLog, setup  # noqa: PLC0415

    path, required = ctx.obj["config_file"]
    try:
        cfg = config.load(path, required=required)
    except config.ConfigError as e:
        import logging  # noqa: PLC0415

        setup("info")
        EventLog()(logging.ERROR, Event.CONFIG_ERROR, str(e), config_file=path)
        sys.exit(config.EX_CONFIG)
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
    from .status import NAMES, UNKNOWN, clean, judge, malformed, render  # noqa: PLC0415

    cfg = _load(ctx)
    try:
        st = state.read(cfg.state_file)
    except state.StateError as e:
        click.echo(f"gpuagent: {e}", err=True)
        sys.exit(UNKNOWN)
    bad = malformed(st)
    if bad is not None:
        click.echo(f"gpuagent: {cfg.state_file}: not a gpuagent state file: bad {bad!r}", err=True)
        sys.exit(UNKNOWN)
    now = time.time()
    code, reason = judge(st, now)
    st["health"] = NAMES[code]
    st["health_reason"] = reason
    text = json.dumps(st, indent=2, sort_keys=True) if as_json else render(st, now, code, reason)
    _print(text)
    if code:
        click.echo(f"gpuagent: {clean(reason)}", err=True)
    sys.exit(code)


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


@main.command("link-textfile")
@click.option("--remove", is_flag=True, help="Remove the link (after the service stopped).")
@click.pass_context
def link_textfile(ctx: click.Context, remove: bool) -> None:
    """Link node_exporter's textfile to the agent's metrics (run by the unit as root)."""
    from . import textlink  # noqa: PLC0415

    cfg = _load(ctx)
    default = config.Config().textfile
    if remove:
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
    from . import pci  # noqa: PLC0415

    cfg = _load(ctx)
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
    """Run nvidia-smi once and print what the agent parses from it; exit 1 on failure."""
    from . import pci  # noqa: PLC0415
    from .probe import Prober, lookup  # noqa: PLC0415
    from .runner import Runner  # noqa: PLC0415
    from .status import clean  # noqa: PLC0415

    cfg = _load(ctx)
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
        click.echo(json.dumps({"fields": list(result.fields), "rows": result.rows}, indent=2))
        return
    for row in result.rows:
        click.echo(clean(", ".join(f"{k}={v}" for k, v in row.items())))
