"""``gpuagent rma SLOT|UUID|SERIAL [--json]``: one board's RMA packet (the I/O; the packet is
:mod:`gpuagent.rma.packet`'s, the gates :mod:`gpuagent.rma.gates`').

It reads what the agent remembers (``gpus.json`` and ``wear.json`` in ``$STATE_DIRECTORY``,
the state file), the journal's timeline of the board (as ``gpuagent history`` does), asks the
driver ``nvidia-smi -q -i SLOT`` where the board is on this host's bus now (under the
probe's timeout), and lists the evidence bundles of its slots.  Each file read through
:mod:`gpuagent.edges.safefile`; one that cannot be read is a note in the packet, not a
failure: exit 0 whenever a packet is printed (whether or not a gate is met), 1 for a board
the agent does not know, 2 for a usage error.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from gpuagent import config
from gpuagent.commands import historycli

if TYPE_CHECKING:
    from gpuagent.rma.smiq import Board

__all__ = ["EVIDENCE", "MAX_BUNDLES", "bundles", "rma"]

# The evidence bundles' directory, under the state directory.
EVIDENCE = "evidence"
# The bundles listed at most; the rest are counted.
MAX_BUNDLES = 50
# Names read from the evidence directory at most: a directory of millions is not read whole.
_SCAN = 10_000


def bundles(directory: str, slots: Sequence[str]) -> tuple[list[str], int]:
    """The names in ``directory`` that name one of ``slots`` (``0000:18:00.0``, or with ``_``
    for ``:``), newest name last, at most :data:`MAX_BUNDLES`, and how many more; raises
    OSError (FileNotFoundError where there is none)."""
    forms = {f for s in slots for f in (s, s.replace(":", "_"), s.replace(":", "-"))}
    found: list[str] = []
    with os.scandir(directory) as entries:
        for n, entry in enumerate(entries):
            if n >= _SCAN:
                break
            if any(f in entry.name for f in forms):
                found.append(entry.name)
    found.sort()
    return found[-MAX_BUNDLES:], max(len(found) - MAX_BUNDLES, 0)


def _remembered(notes: list[str]) -> list[dict[str, Any]]:
    from gpuagent.sources.bus.known import entries_of  # noqa: PLC0415

    path = historycli.known_file()
    try:
        return [dict(e) for e in entries_of(path)]
    except FileNotFoundError:
        return []
    except OSError as e:
        notes.append(f"cannot read {path}: {e.strerror or e}")
    except (ValueError, TypeError) as e:
        notes.append(f"{path}: {e}")
    return []


def _state_gpus(path: str, notes: list[str]) -> list[Mapping[str, Any]]:
    from gpuagent import state  # noqa: PLC0415

    try:
        gpus = state.read(path).get("gpus")
    except state.NoStateFile:
        return []
    except state.StateError as e:
        notes.append(str(e))
        return []
    return [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []


def _wear_now(uuid: str, notes: list[str]) -> tuple[str, dict[str, int]] | None:
    from gpuagent.sources.wear.recorded import FILE, of_board  # noqa: PLC0415

    path = os.path.join(historycli.state_directory(), FILE)
    try:
        return of_board(path, uuid)
    except FileNotFoundError:
        return None
    except OSError as e:
        notes.append(f"cannot read {path}: {e.strerror or e}")
    except (ValueError, TypeError) as e:
        notes.append(f"{path}: {e}")
    return None


def _ask_driver(cfg: config.Config, slot: str) -> Board | str:
    """``nvidia-smi -q -i SLOT`` parsed, or the one-line reason it was not."""
    from gpuagent.edges import smirun  # noqa: PLC0415
    from gpuagent.edges.runner import Runner  # noqa: PLC0415
    from gpuagent.rma import smiq  # noqa: PLC0415
    from gpuagent.sources.probe.probe import lookup  # noqa: PLC0415

    binary = lookup(cfg.nvidia_smi)
    if binary is None:
        return f"nvidia-smi not found ({cfg.nvidia_smi!r})"
    try:
        text = smirun.run(Runner(timeout=cfg.probe_timeout), binary, ("-q", "-i", slot))
        return smiq.parse(text) if text is not None else "interrupted"
    except smirun.Failed as e:
        return str(e)
    except ValueError as e:
        return f"nvidia-smi -q -i {slot}: {e}"


def _board(
    slot: str | None,
    uuid: str | None,
    serial: str | None,
    *,
    known: list[dict[str, Any]],
    gpus: list[Mapping[str, Any]],
    steps: list[Any],
) -> str | None:
    """The UUID of the board the argument names, among those the agent knows."""
    from gpuagent.sources.kernel import timeline  # noqa: PLC0415

    if slot is not None:
        here: list[Mapping[str, Any]] = [
            e for e in known if e["pci_slot"] == slot and "gone_at" in e
        ]
        here += [g for g in gpus if g.get("pci_slot") == slot]
        return next((str(e["uuid"]) for e in here if isinstance(e.get("uuid"), str)), None)
    if serial is not None:
        boards = timeline.serials(steps, serial)
        boards |= {str(e["uuid"]) for e in known if e.get("serial") == serial and e.get("uuid")}
        # A board in a slot now first, else the first UUID the serial had.
        ours = [str(e["uuid"]) for e in known if e.get("uuid") in boards and "gone_at" in e]
        return next(iter(ours or sorted(boards)), None)
    want = (uuid or "").lower()
    names = {str(e.get("uuid")).lower() for e in [*known, *gpus]}
    names |= {u.lower() for s in steps for u in (s.uuid, s.old_uuid) if u}
    return uuid if want in names else None


@click.command("rma")
@click.argument("board", metavar="SLOT|UUID|SERIAL")
@click.option("--json", "as_json", is_flag=True, help="Print the packet as one JSON object.")
@click.option(
    "--days", type=click.IntRange(min=1), default=365, show_default=True, help="How far back."
)
@click.pass_context
def rma(ctx: click.Context, board: str, as_json: bool, days: int) -> None:
    """Print a board's RMA packet: its identity, NVIDIA's RMA gates read from the driver, its
    faults across boots and slots, wear, PCIe path errors and evidence bundles, and NVIDIA's
    next step; exit 0 a packet printed (gate met or not), 1 no such board known, 2 usage."""
    from gpuagent.rma import packet  # noqa: PLC0415
    from gpuagent.sources.kernel import timeline  # noqa: PLC0415

    slot, uuid, serial = historycli.target(board)
    path, required = ctx.obj["config_file"]
    cfg = config.salvage(path, required=required)[0]
    notes: list[str] = []
    try:
        steps = historycli.read(cfg.journal_directory, None, days, other_host=False)
    except OSError as e:
        steps = []
        notes.append(f"cannot read the journal: {e.strerror or e}; no faults across boots")
    known = _remembered(notes)
    gpus = _state_gpus(cfg.state_file, notes)
    found = _board(slot, uuid, serial, known=known, gpus=gpus, steps=steps)
    if found is None:
        click.echo(
            f"gpuagent: no board {board} known to the agent (gpus.json, the state, the journal)",
            err=True,
        )
        for note in notes:
            click.echo(f"gpuagent: {note}", err=True)
        sys.exit(1)
    mine = timeline.of_boards(steps, {found})
    entries = [e for e in known if str(e.get("uuid", "")).lower() == found.lower()]
    now = next((str(e["pci_slot"]) for e in entries if "gone_at" in e and not e["gone_at"]), None)
    now = now or next(
        (str(g["pci_slot"]) for g in gpus if str(g.get("uuid", "")).lower() == found.lower()),
        None,
    )
    if now is not None and not any("gone_at" in e for e in entries):
        entries.append({"pci_slot": now, "uuid": found, "gone_at": None})
    read = _ask_driver(cfg, now) if now is not None else None
    problems = {str(g.get("pci_slot")): g.get("problems") or [] for g in gpus}
    slots = sorted({*(s.pci_slot for s in mine if s.pci_slot), *(e["pci_slot"] for e in entries)})
    evidence = _evidence(slots, notes)
    out = packet.build(
        found,
        remembered=entries,
        steps=mine,
        wear_now=_wear_now(found, notes),
        problems=problems,
        read=read,
        evidence=evidence,
        notes=notes,
    )
    click.echo(json.dumps(out, indent=2) if as_json else packet.render(out))


def _evidence(slots: Sequence[str], notes: list[str]) -> tuple[str, list[str], int] | None:
    directory = os.path.join(historycli.state_directory(), EVIDENCE)
    try:
        files, more = bundles(directory, slots)
    except FileNotFoundError:
        return None
    except OSError as e:
        notes.append(f"cannot list {directory}: {e.strerror or e}")
        return None
    return directory, files, more
