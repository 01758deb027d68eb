"""The kernel driver as a source of facts: this boot's Xid, SXid and RmInitAdapter records.

Glue between the journal (:class:`~gpuagent.kernlog.KernelLog`), the counter
(:class:`~gpuagent.xidcount.XidCounter`) and the agent: each tick, whatever the probe's gates
say, :meth:`KernelSource.poll` takes what the journal has that is new and returns each GPU's
problems of kind ``xid`` and ``init_failed`` for the health tracker.  It logs what the health
model does not: a journal that cannot be read (once, and once when it can again) and the
first application Xid or SXid of each (GPU or NVSwitch, code) this boot.  The first Xid that
makes a GPU unhealthy is logged by the health model, as that problem's start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from . import clears
from .condition import Condition, Edge
from .health import Finding
from .kernlog import KernelLog
from .logs import Event, EventLog
from .views import KernelView
from .xidcount import XidCounter

__all__ = ["KernelSource"]


class KernelSource:
    """This boot's kernel records from the journal in ``directory`` (``""``: the system
    journal), counted.  ``open_log`` makes the :class:`KernelLog` (injectable for tests)."""

    def __init__(
        self,
        directory: str,
        log: EventLog,
        *,
        open_log: Callable[[str], KernelLog] = KernelLog,
    ) -> None:
        self.log = log
        self._open_log = open_log
        self.journal = open_log(directory)
        self.xids = XidCounter()
        # Each GPU's last clear by root (`gpuagent clear`), read in order with the records.
        self.cleared: dict[str, clears.Clear] = {}
        self._forgotten: list[str] = []
        self._trouble: Condition[str] = Condition()

    @property
    def error(self) -> str | None:
        """Why the journal cannot be read, while it cannot (the state's ``problems["journal"]``)."""
        return self._trouble.value

    def configure(self, directory: str) -> None:
        """Read the journal in ``directory`` from now on; a new one is counted from its boot's
        start, so the old counts go."""
        if directory != self.journal.directory:
            self.journal.close()
            self.journal = self._open_log(directory)
            self.xids = XidCounter()
            self.cleared = {}

    def poll(self, slots: list[str]) -> dict[str, list[Finding]]:
        """Read what is new (on the first call: the whole boot); ``slots`` are the GPUs' PCI
        slots on the bus now.  Returns every GPU's Xid and init-failure problems, by slot."""
        self.journal.poll(self.xids.add, self._clear)
        self._note(self.journal.error)
        for first in self.xids.take_new(slots):
            if first.finding is not None:
                continue  # the health model's start line says it
            fields: dict[str, int | str]
            if first.kind == "sxid":
                level, event, fields = logging.WARNING, Event.SXID, {"sxid": first.code}
            else:
                action = self.xids.counts(slots)[first.slot, first.code].info.action
                level, event = logging.INFO, Event.XID_COUNTED
                fields = {"xid": first.code, "action": action}
            self.log(level, event, first.message, pci_slot=first.slot, **fields)
        return self.xids.findings(slots)

    def _clear(self, at: float, fields: dict[str, bytes]) -> None:
        if fields.get("MESSAGE_ID") != Event.OPERATOR_CLEAR.value.encode():
            return
        clear = clears.parse(fields, at)
        if clear is None:
            return  # not root's, or not a clear the agent honours
        self.xids.clear(clear.slot, clears.LATCHING if clear.kind == clears.ALL else (clear.kind,))
        self.cleared[clear.slot] = clear
        if clear.kind == clears.GONE:
            self._forgotten.append(clear.slot)

    def take_forgotten(self) -> list[str]:
        """The GPUs root said left for good (``gone_from_bus`` cleared) since the last call."""
        gone, self._forgotten = self._forgotten, []
        return gone

    def _note(self, error: str | None) -> None:
        edge = self._trouble.update(error)
        if edge is Edge.STARTED:
            self.log(
                logging.WARNING,
                Event.JOURNAL_UNREADABLE,
                f"{error}; the NVIDIA driver's Xid, SXid and fallen-off-the-bus records are not "
                "seen until it can be read; sampling goes on",
                journal_directory=self.journal.directory or None,
            )
        elif edge is Edge.ENDED:
            self.log(
                logging.INFO,
                Event.JOURNAL_READABLE,
                f"{self.journal.where} can be read again; reading the kernel's records",
                journal_directory=self.journal.directory or None,
            )

    def view(self, slots: list[str]) -> KernelView:
        """This boot's counts as the report needs them; ``slots`` are the GPUs on the bus."""
        return KernelView(
            self.xids.counts(slots),
            self.xids.sxid_counts(),
            self.xids.uuids(slots),
            dict(self.cleared),
        )
