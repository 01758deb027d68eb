"""``gpuagent units``: NVIDIA's systemd units as the agent reads them (a debugging aid)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

import click

__all__ = ["units"]


# Hidden: a debugging aid for the D-Bus reads the agent makes (gpuagent(8) describes it).
@click.command(hidden=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--pid", type=click.IntRange(min=1), help="Also name the unit of process PID.")
def units(as_json: bool, pid: int | None) -> None:
    """Show NVIDIA's systemd units as the agent reads them over the system bus; exit 1 if
    it cannot."""
    from gpuagent.commands.status import clean  # noqa: PLC0415
    from gpuagent.edges.systemd import units as units_  # noqa: PLC0415

    reader = units_.Units(full_every=None)  # one look: no signals to follow
    result = reader.read()
    owner = reader.unit_for_pid(pid) if pid is not None else None
    if as_json:
        out: dict[str, Any] = {
            "watch": result.watch.value,
            "error": result.error,
            "units": {name: asdict(u) for name, u in result.units.items()},
        }
        if owner is not None:
            out["pid"] = {"pid": pid, "unit": owner.unit, "error": owner.error}
        click.echo(json.dumps(out, indent=2))
    else:
        for name, u in result.units.items():
            restarts = "-" if u.n_restarts is None else u.n_restarts
            click.echo(
                f"{name}  {u.load_state} {u.active_state} {u.sub_state}  "
                f"result {u.result or '-'}  restarts {restarts}"
            )
        if owner is not None and owner.watch is units_.Watch.OK:
            click.echo(f"pid {pid}: {owner.unit or 'in no unit'}")
    if result.watch is units_.Watch.NOT_WATCHED:
        click.echo("gpuagent: no system bus socket: NVIDIA's units are not watched", err=True)
    elif result.watch is units_.Watch.ERROR:
        click.echo(f"gpuagent: {clean(result.error)}", err=True)
    if owner is not None and owner.error:
        click.echo(f"gpuagent: pid {pid}: {clean(owner.error)}", err=True)
    reader.close()
    sys.exit(0 if result.watch is units_.Watch.OK and not (owner and owner.error) else 1)
