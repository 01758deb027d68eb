"""The boards whose wear this boot recorded, remembered across the agent's restarts.

The wear record is once a boot: a restart (an upgrade, ``systemctl restart``) must neither
log it again nor forget what it said, which this boot's trend is judged on.  The file is
``wear.json`` in the directory systemd names in ``$STATE_DIRECTORY``
(:class:`gpuagent.edges.statedir.StateFile`), beside ``gpus.json``; it names the boot (the
kernel's ``boot_id``), so that after a reboot it says nothing.  A hand run without
``$STATE_DIRECTORY`` (or an unknown boot) records nothing: it cannot tell whether this boot
was recorded already.  A file that cannot be read or written is one warning (the state's
``problems["wear_records"]`` while it lasts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuagent.edges import safefile
from gpuagent.edges.statedir import StateFile
from gpuagent.logs import EventLog
from gpuagent.sources.wear.counters import FIELDS, Counters

__all__ = ["FILE", "Recorded", "of_board"]

FILE = "wear.json"
# A few hundred bytes a board: more than this is not the agent's.
MAX_SIZE = 1024 * 1024
_WHAT = "the boards' wear recorded this boot"
_NAMES = frozenset(FIELDS.values())


class Recorded:
    """This boot's records by board UUID (lower case): its slot and counters (``{}``: the
    board offers none); ``boot`` is this boot's id."""

    def __init__(self, directory: str | None, log: EventLog, *, boot: str) -> None:
        self.boot = boot
        self.enabled = bool(directory and boot)
        self.file = StateFile(
            directory if boot else None,
            FILE,
            log,
            limit=MAX_SIZE,
            otherwise="this run's records only",
        )
        self.boards: dict[str, tuple[str, Counters]] = (
            self.file.read_boot(_parsed, _WHAT, boot) or {}
        )

    @property
    def error(self) -> str | None:
        """Why the file cannot be read or written, while it cannot."""
        return self.file.error

    def add(self, records: Mapping[str, tuple[str, Counters]]) -> None:
        """This boot's records of more boards (by UUID); writes the file."""
        self.boards.update({u.lower(): r for u, r in records.items()})
        data = {
            "boot_id": self.boot,
            "boards": {
                u: {"slot": slot, "counters": dict(sorted(c.items()))}
                for u, (slot, c) in sorted(self.boards.items())
            },
        }
        self.file.write(data, _WHAT)


def _parsed(data: Any) -> tuple[str, dict[str, tuple[str, Counters]]]:
    """The boot and records of ``{"boot_id": str, "boards": {UUID: {"slot": str,
    "counters": {name: count}}}}``; raises TypeError naming what is not so."""
    if not isinstance(data, dict) or not isinstance(data.get("boot_id"), str):
        raise TypeError("expected an object with a boot_id string")
    boards = data.get("boards")
    if not isinstance(boards, dict):
        raise TypeError("boards: expected an object")
    out: dict[str, tuple[str, Counters]] = {}
    for uuid, record in boards.items():
        slot = record.get("slot") if isinstance(record, dict) else None
        counts = record.get("counters") if isinstance(record, dict) else None
        if not isinstance(slot, str) or not isinstance(counts, dict):
            raise TypeError(f"boards[{uuid!r}]: expected a slot and counters")
        if not all(k in _NAMES and type(v) is int and v >= 0 for k, v in counts.items()):
            raise TypeError(f"boards[{uuid!r}].counters: expected counts by counter name")
        out[uuid.lower()] = (slot, dict(counts))
    return data["boot_id"], out


def of_board(path: str, uuid: str) -> tuple[str, Counters] | None:
    """The record of the board ``uuid`` in the file at ``path`` (its slot and counters; None:
    none), whatever boot the file is of (``gpuagent rma``: its boot is the last one the agent
    ran in).  Raises OSError as :func:`gpuagent.edges.safefile.load_json` (a symlink, a FIFO, a
    file over :data:`MAX_SIZE`), ValueError or TypeError for a file that is not the agent's."""
    return _parsed(safefile.load_json(path, MAX_SIZE))[1].get(uuid.lower())
