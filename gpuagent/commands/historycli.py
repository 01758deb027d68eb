"""``gpuagent history [SLOT|UUID|SERIAL]``: a GPU's (or a board's) story across boots from the
journal (thin; the timeline is :mod:`gpuagent.sources.kernel.timeline`'s).

It reads the journal as its caller may: root or the ``systemd-journal`` group see the
kernel's records and the agent's lines; anyone else is told so.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from typing import TYPE_CHECKING

import click

from gpuagent import config

if TYPE_CHECKING:
    from gpuagent.sources.kernel.timeline import Step

__all__ = ["history", "known_file", "read", "remembered", "state_directory", "target"]


def read(
    directory: str, where: str | None, days: int, *, other_host: bool, uuid: str | None = None
) -> list[Step]:
    """The timeline's steps of the last ``days`` days in the journal in ``directory`` (``""``:
    the system's), of the GPU in slot ``where`` (None: every GPU) or the board ``uuid``;
    raises ``OSError``, also for a journal the caller may not read at all.
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
            raise OSError(
                errno.EACCES,
                "no journal file it may read (run as root or as a member of the "
                "systemd-journal group)",
            )
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


# A board serial is letters and digits (NVIDIA's are 13 digits); shorter is a typo.
_SERIAL_MIN = 6


def state_directory() -> str:
    """The agent's state directory: ``$STATE_DIRECTORY``'s first, else the package's."""
    return os.environ.get("STATE_DIRECTORY", "").split(":")[0] or "/var/lib/gpuagent"


def known_file() -> str:
    """The GPUs the agent remembers (``gpus.json`` in :func:`state_directory`)."""
    from gpuagent.sources.bus.known import FILE  # noqa: PLC0415

    return os.path.join(state_directory(), FILE)


def target(text: str) -> tuple[str | None, str | None, str | None]:
    """What ``SLOT|UUID|SERIAL`` names: ``(slot, uuid, serial)``, one of them set (the slot in
    sysfs form).  Raises ``click.BadParameter`` for text that is none of them."""
    from gpuagent.sources.kernel import clears  # noqa: PLC0415

    if text.upper().startswith("GPU-"):
        return None, text, None
    where = clears.slot_of(text)
    if where is not None:
        return where, None, None
    if not text.isalnum() or len(text) < _SERIAL_MIN:
        raise click.BadParameter(
            f"{text!r} is neither a PCI slot (0000:3b:00.0), a GPU's UUID (GPU-...) nor "
            "a board's serial number",
            param_hint="SLOT|UUID|SERIAL",
        )
    return None, None, text


def remembered(serial: str) -> set[str]:
    """The UUIDs the agent remembers with ``serial``; a file it cannot read is one line."""
    from gpuagent.sources.bus.known import boards_with  # noqa: PLC0415

    path = known_file()
    try:
        return boards_with(path, serial)
    except FileNotFoundError:
        return set()
    except OSError as e:
        click.echo(
            f"gpuagent: cannot read {path}: {e.strerror or e}; the journal's alone", err=True
        )
    except (ValueError, TypeError) as e:
        click.echo(f"gpuagent: {path}: {e}; the journal's alone", err=True)
    return set()


def _what(directory: str) -> str:
    return f"the journal in {directory}" if directory else "the journal"


@click.command("history")
@click.argument("slot", metavar="[SLOT|UUID|SERIAL]", required=False)
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
    """Show a GPU's (or every GPU's) problems, Xids, clears, board replacements and reboots
    across boots: by its PCI slot, or by its board's UUID (GPU-...) or serial number in
    whichever slot it was."""
    from gpuagent.sources.kernel import timeline  # noqa: PLC0415

    where, uuid, serial = target(slot) if slot is not None else (None, None, None)
    if other is not None:
        directory = other
    else:
        path, required = ctx.obj["config_file"]
        directory = config.salvage(path, required=required)[0].journal_directory
    try:
        steps = read(directory, where, days, other_host=other is not None, uuid=uuid)
    except OSError as e:
        # A directory this user may not read (or gone, or no directory): one line.
        click.echo(f"gpuagent: cannot read {_what(directory)}: {e.strerror or e}", err=True)
        sys.exit(1)
    if serial is not None:
        boards = timeline.serials(steps, serial) | remembered(serial)
        if not boards:
            click.echo(
                f"gpuagent: no board with serial {serial} in {known_file()} or the journal",
                err=True,
            )
            sys.exit(1)
        steps = timeline.of_boards(steps, boards)
    if as_json:
        click.echo(json.dumps([s.as_json() for s in steps], indent=2))
    else:
        click.echo(timeline.render(steps))
