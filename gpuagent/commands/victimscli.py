"""``gpuagent victims [SLOT] [--json] [--days N]``: the processes each critical Xid hit, from
the agent's FAULT_VICTIMS records in the journal (thin; read as ``history`` reads it,
:mod:`gpuagent.commands.historycli`), for a scheduler's requeue script and the user whose
job died."""

from __future__ import annotations

import json
import sys
import time

import click

from gpuagent import config

__all__ = ["victims"]


@click.command("victims")
@click.argument("slot", metavar="[SLOT]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object a fault.")
@click.option(
    "--days", type=click.IntRange(min=1), default=1, show_default=True, help="How far back."
)
@click.pass_context
def victims(ctx: click.Context, slot: str | None, as_json: bool, days: int) -> None:
    """Show the processes each critical Xid of the GPU in SLOT (or of every GPU) hit: the
    one its record names, those the driver tore down for it, those on the GPU; each with its
    systemd unit, Slurm job and user where known.  Exit 1 when the journal cannot be read."""
    from gpuagent.commands.historycli import read  # noqa: PLC0415
    from gpuagent.sources.kernel import clears  # noqa: PLC0415
    from gpuagent.sources.victims.rule import describe  # noqa: PLC0415
    from gpuagent.untrusted import printable  # noqa: PLC0415

    where = None
    if slot is not None:
        where = clears.slot_of(slot)
        if where is None:
            raise click.BadParameter(f"{slot!r} is not a PCI slot (0000:3b:00.0)")
    path, required = ctx.obj["config_file"]
    directory = config.salvage(path, required=required)[0].journal_directory
    try:
        steps = [s for s in read(directory, where, days, other_host=False) if s.event == "victims"]
    except OSError as e:
        click.echo(f"gpuagent: cannot read the journal: {e.strerror or e}", err=True)
        sys.exit(1)
    if as_json:
        out = [
            {
                "time": s.time,
                "pci_slot": s.pci_slot,
                "uuid": s.uuid,
                "xid": s.xid,
                "victims": [vars(v) for v in s.victims or ()],
            }
            for s in steps
        ]
        click.echo(json.dumps(out, indent=2))
        return
    if not steps:
        click.echo(f"no fault hit a process in the last {days} day{'s' if days > 1 else ''}")
    for s in steps:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.time))
        said = describe(s.victims or (), limit=64)
        click.echo(printable(f"{stamp}  {s.pci_slot}  Xid {s.xid} hit {said}"))
