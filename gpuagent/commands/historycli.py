"""``gpuagent history [SLOT|UUID]``: a GPU's (or a board's) story across boots from the
journal (thin; the timeline is :mod:`gpuagent.sources.kernel.timeline`'s).

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


def _read(
    directory: str, where: str | None, days: int, *, other_host: bool, uuid: str | None = None
) -> list[Step]:
    """The timeline's steps of the last ``days`` days in the journal in ``directory`` (``""``:
    the system's), of the GPU in slot ``where`` (None: every GPU) or the board ``uuid``;
    raises ``OSError``, and exits 1 for a journal the caller may not read at all.
    ``other_host``: the journal is another host's (``--directory``), whose login uids this
    host's users do not name."""
    from systemd import journal  # noqa: PLC0415

    from gpuagent.edges.users import user_name  # noqa: PLC0415
    from gpuagent.logs import Event  # noqa: PLC0415
    from gpuagent.sources.kernel import clears, timeline  # noqa: PLC0415
    from gpuagent.sources.kernel.earlier import entries  # noqa: PLC0415

    if directory:
        reader = journal.Reader(path=directory)
    else:
        reader = journal.Reader(flags=journal.LOCAL_ONLY | journal.SYSTEM_ONLY)
    try:
        if not reader.get_usage():
            # sd-journal skips, silently, each file this process may not read.
            click.echo(
                f"gpuagent: cannot read {_what(directory)}: no journal file it may read "
                "(run as root or as a member of the systemd-journal group)",
                err=True,
            )
            sys.exit(1)
        reader.add_match(_TRANSPORT="kernel")
        reader.add_disjunction()
        reader.add_match(_SYSTEMD_UNIT=timeline.UNIT)
        reader.add_disjunction()
        reader.add_match(MESSAGE_ID=Event.OPERATOR_CLEAR.value, _UID="0")
        reader.seek_realtime(max(time.time() - days * 86400, 0.0))
        names = clears.no_names if other_host else user_name
        return timeline.events(entries(reader), where, names, uuid=uuid)
    finally:
        reader.close()


def _what(directory: str) -> str:
    return f"the journal in {directory}" if directory else "the journal"


@click.command("history")
@click.argument("slot", metavar="[SLOT|UUID]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of events.")
@click.option(
    "--days", type=click.IntRange(min=1), default=30, show_default=True, help="How far back."
)
@click.option(
    "--directory",
    "other",
    metavar="DIR",
    help="Read the journal files in DIR (another host's, offline, as journalctl -D does).",
)
@click.pass_context
def history(
    ctx: click.Context, slot: str | None, as_json: bool, days: int, other: str | None
) -> None:
    """Show a GPU's (or every GPU's) problems, Xids, clears and reboots across boots: by its
    PCI slot, or by its board's UUID (GPU-...) in whichever slot it was."""
    from gpuagent.sources.kernel import clears, timeline  # noqa: PLC0415

    where = uuid = None
    if slot is not None and slot.upper().startswith("GPU-"):
        uuid = slot
    elif slot is not None:
        where = clears.slot_of(slot)
        if where is None:
            raise click.BadParameter(
                f"{slot!r} is neither a PCI slot (0000:3b:00.0) nor a GPU's UUID (GPU-...)",
                param_hint="SLOT|UUID",
            )
    if other is not None:
        directory = other
    else:
        path, required = ctx.obj["config_file"]
        directory = config.salvage(path, required=required)[0].journal_directory
    try:
        steps = _read(directory, where, days, other_host=other is not None, uuid=uuid)
    except OSError as e:
        # A directory this user may not read (or gone, or no directory): one line.
        click.echo(f"gpuagent: cannot read {_what(directory)}: {e.strerror or e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps([s.as_json() for s in steps], indent=2))
    else:
        click.echo(timeline.render(steps))
