"""A JSON file the agent remembers something in across restarts, in ``$STATE_DIRECTORY``.

systemd names the directory (``StateDirectory=gpuagent``: ``/var/lib/gpuagent``); a hand run
without it remembers nothing.  The file is read once, at the start, through
:func:`gpuagent.edges.safefile.load_json` (no symlink followed, no FIFO, a bound on its size),
and replaced atomically (:func:`gpuagent.state.write`) whenever what it holds changes.  A file
that cannot be read or written is one condition: one warning when it starts, the reason held
(the state's ``problems[...]``) until a write goes through, and the agent goes on with what it
sees.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpuagent import state
from gpuagent.condition import Condition, Edge
from gpuagent.edges import safefile
from gpuagent.logs import EventLog

__all__ = ["StateFile"]

T = TypeVar("T")


class StateFile:
    """The file ``name`` in ``directory`` (None or ``""``: nothing is remembered), at most
    ``limit`` bytes; ``otherwise`` ends its warning: what the agent goes on with meanwhile."""

    def __init__(
        self, directory: str | None, name: str, log: EventLog, *, limit: int, otherwise: str
    ) -> None:
        self.path = os.path.join(directory, name) if directory else None
        self.log = log
        self.limit = limit
        self.otherwise = otherwise
        self._trouble: Condition[str] = Condition()

    @property
    def error(self) -> str | None:
        """Why the file cannot be read or written, while it cannot."""
        return self._trouble.value

    def read(self, parse: Callable[[Any], T], what: str) -> T | None:
        """What ``parse`` makes of the file's JSON; None when there is no file, or when it
        cannot be read or ``parse`` raises TypeError or ValueError (then ``{path}: cannot read
        {what}: {reason}`` holds)."""
        if self.path is None:
            return None
        try:
            return parse(safefile.load_json(self.path, self.limit))
        except (FileNotFoundError, NotADirectoryError):
            # No file yet (a directory that is none: the first write says so).  Not
            # os.path.lexists: it says False for a directory this user may not search, a
            # refusal that must be said.
            return None
        except (OSError, ValueError, TypeError) as e:
            self._note(f"{self.path}: cannot read {what}: {state.why(e)}")
            return None

    def read_boot(self, parse: Callable[[Any], tuple[str, T]], what: str, boot: str) -> T | None:
        """What ``parse`` makes of a file of one boot (its JSON's boot id first, then what it
        holds) where the file is of ``boot``; None for another boot's (a reboot forgets), for
        an unknown boot (``""``: nothing is read, since the file could not say which boot it
        is of), and as :meth:`read` says."""
        read = self.read(parse, what) if boot else None
        return read[1] if read is not None and read[0] == boot else None

    def write(self, data: Mapping[str, object], what: str) -> None:
        """Replace the file with ``data`` as JSON; when that fails, ``{path}: cannot remember
        {what}: {reason}`` holds until a write goes through."""
        if self.path is None:
            return
        try:
            state.write(self.path, data, self.limit)
        except OSError as e:
            self._note(f"{self.path}: cannot remember {what}: {state.why(e)}")
            return
        self._note(None)

    def _note(self, error: str | None) -> None:
        if self._trouble.update(error) is Edge.STARTED:
            self.log(logging.WARNING, None, f"{error}; going on with {self.otherwise}")
