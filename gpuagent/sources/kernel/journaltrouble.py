"""What the agent says of the journal the kernel's records come from: that it cannot be read
(once, and once when it can again) and that it cannot be waited on (once a run)."""

from __future__ import annotations

import logging

from gpuagent.condition import Condition, Edge
from gpuagent.logs import Event, EventLog
from gpuagent.sources.kernel.kernlog import KernelLog

__all__ = ["JournalTrouble"]


class JournalTrouble:
    """The journal's trouble, told on ``log`` as it starts and ends."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._trouble: Condition[str] = Condition()
        # Whether the line that the journal cannot be waited on was logged.
        self._unwaited = False

    @property
    def error(self) -> str | None:
        """Why the journal cannot be read, while it cannot (as last noted)."""
        return self._trouble.value

    def unwaitable(self, journal: KernelLog, why: str) -> None:
        """``journal`` cannot be waited on, ``why``: said once, at info."""
        if self._unwaited:
            return
        self._unwaited = True
        self.log(
            logging.INFO,
            None,
            f"{journal.where} cannot be waited on ({why}): the kernel's records are "
            "read at each tick",
            journal_directory=journal.directory or None,
        )

    def note(self, journal: KernelLog) -> None:
        """After a read of ``journal``: its error, said where it starts and where it ends."""
        error = journal.error
        edge = self._trouble.update(error)
        if edge is Edge.STARTED:
            self.log(
                logging.WARNING,
                Event.JOURNAL_UNREADABLE,
                f"{error}; sampling goes on"
                if error == journal.damage
                else f"{error}; the NVIDIA driver's Xid, SXid and fallen-off-the-bus records are "
                "not seen until it can be read; sampling goes on",
                journal_directory=journal.directory or None,
            )
        elif edge is Edge.ENDED:
            self.log(
                logging.INFO,
                Event.JOURNAL_READABLE,
                f"{journal.where} can be read again; reading the kernel's records",
                journal_directory=journal.directory or None,
            )
