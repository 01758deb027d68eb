"""``gpuagent history [SLOT]``: a GPU's story across boots from the journal (thin; the
timeline is :mod:`gpuagent.sources.kernel.timeline`'s).

It reads the journal as its caller may: root or the ``systemd-journal`` group see the
kernel's records and the agent's lines; anyone else is told so.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

import click

from gpuagent import config

if TYPE_CHECKING:
    from gpuagent.sources.kernel.timeline import Step

__all__ = ["history"]


def _read(directory: str, where: str | None, days: int) -> list[Step]:
    """The timeline's steps of the last ``days`` days in the journal in ``directory`` (``""``:
    the system's), of the GPU in slot ``where`` (None: every GPU); raises ``OSError``, and
    exits 1 for a journal the caller may not read at all."""
    from systemd import journal  # noqa: PLC0415

    from gpuagent.edges.users import user_name  # noqa: PLC0415
    from gpuagent.logs import Event  # noqa: PLC0415
    from gpuagent.sources.kernel import timeline  # noqa: PLC0415
    from gpuagent.sources.kernel.earlier import entries  # noqa: PLC0415

    if directory:
        reader = journal.Reader(path=directory)
    else:
        reader = journal.Reader(flags=journal.LOCAL_ONLY | journal.SYSTEM_ONLY)
    try:
        if not reader.get_usage():
            click.echo(
                "gpuagent: cannot read the journal: run as root or as a member of the "
                "systemd-journal group",
                err=True,
            )
            sys.exit(1)
        reader.add_match(_TRANSPORT="kernel")
        reader.add_disjunction()
        reader.add_match(_SYSTEMD_UNIT=timeline.UNIT)
        reader.add_disjunction()
        reader.add_match(MESSAGE_ID=Event.OPERATOR_CLEAR.value, _UID="0")
        reader.seek_realtime(max(time.time() - days * 86400, 0.0))
        return timeline.events(entries(reader), where, user_name)
    finally:
        reader.close()


@click.command("history")
@click.argument("slot", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of events.")
@click.option(
    "--days", type=click.IntRange(min=1), default=30, show_default=True, help="How far back."
)
@click.pass_context
def history(ctx: click.Context, slot: str | None, as_json: bool, days: int) -> None:
    """Show a GPU's (or every GPU's) problems, Xids, clears and reboots across boots."""
    from gpuagent.sources.kernel import clears, timeline  # noqa: PLC0415

    where = None
    if slot is not None:
        where = clears.slot_of(slot)
        if where is None:
            raise click.BadParameter(f"{slot!r} is not a PCI slot", param_hint="SLOT")
    path, required = ctx.obj["config_file"]
    directory = config.salvage(path, required=required)[0].journal_directory
    try:
        steps = _read(directory, where, days)
    except OSError as e:
        # A journal_directory this user may not read (or gone): one line, not a traceback.
        what = f"the journal in {directory}" if directory else "the journal"
        click.echo(f"gpuagent: cannot read {what}: {e.strerror or e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps([s.as_json() for s in steps], indent=2))
    else:
        click.echo(timeline.render(steps))
