"""The scheduler's commands: ``slurm-check`` (Slurm's HealthCheckProgram, NHC's check) and
``status --format=npd``'s line (thin; the decisions are :mod:`gpuagent.commands.drain`'s).

Only click and the config at import: the commands import what they need.
"""

from __future__ import annotations

import os
import sys
import time

import click

from gpuagent import config

__all__ = ["npd", "slurm_check"]


def _state_file(ctx: click.Context) -> str:
    path, required = ctx.obj["config_file"]
    cfg, error = config.salvage(path, required=required)
    if error is not None:
        click.echo(f"gpuagent: warning: {error}; using its valid settings only", err=True)
    return cfg.state_file


@click.command("slurm-check")
@click.option(
    "--node",
    metavar="NAME",
    help="The Slurm node [default: $SLURMD_NODENAME or the short host name].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=25),
    default=20.0,
    show_default=True,
    help="Seconds each scontrol may take (two at most: within slurmd's 60 s).",
)
@click.option(
    "--reason",
    "reason_only",
    is_flag=True,
    help="Only print the drain reason of a critical problem (nothing if none; with drain = "
    '"report", what would drain on stderr); run no scontrol.',
)
@click.pass_context
def slurm_check(ctx: click.Context, node: str | None, timeout: float, reason_only: bool) -> None:
    """Drain this Slurm node on a critical GPU problem, resume it when gpuagent drained it and
    none holds (asking slurmctld nothing while neither can be: no critical problem, no drain of
    its own recorded, or slurmd's $SLURM_NODE_IS_HEALTHY agreeing); with drain = "report",
    say what would drain instead; exit 1 if the state is missing or stale (nothing changed), 2
    if scontrol failed."""
    from gpuagent.commands import drainrecord, slurmcheck  # noqa: PLC0415

    path = _state_file(ctx)
    if reason_only:
        from gpuagent.commands.drain import reason, would  # noqa: PLC0415

        st, why = slurmcheck.state_reason(path)
        now = time.time()
        known, said = reason(st, why, now)
        if not known:
            click.echo(f"gpuagent: {said}", err=True)
            sys.exit(slurmcheck.EX_UNKNOWN)
        if said:
            click.echo(said)
        # Not on stdout: a hook that drains on any reason printed there must not.
        if told := would(st, now):
            click.echo(told, err=True)
        return
    name = node or slurmcheck.node_name(os.environ)
    healthy = os.environ.get(slurmcheck.HEALTHY)
    done = slurmcheck.check(path, name, timeout=timeout, record=drainrecord.PATH, healthy=healthy)
    if done.warning:
        click.echo(f"gpuagent slurm-check: warning: {done.warning}", err=True)
    click.echo(f"gpuagent slurm-check: {done.says}", err=done.code != 0)
    sys.exit(done.code)


def npd(ctx: click.Context, warning: bool = False) -> None:
    """``gpuagent status --format=npd`` (``npd-warning`` when ``warning``): one line and
    node-problem-detector's exit status."""
    from gpuagent.commands import drain, slurmcheck  # noqa: PLC0415

    st, why = slurmcheck.state_reason(_state_file(ctx))
    judged = drain.npd_warning if warning else drain.npd
    status, line = judged(st, why, time.time())
    click.echo(line)
    sys.exit(status)
