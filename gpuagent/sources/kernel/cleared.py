"""Root's clears of this boot as the kernel source reads them, in order with the kernel's
records (:mod:`gpuagent.sources.kernel.clears` parses each): each GPU's last clear, and the
GPUs root said left for good."""

from __future__ import annotations

from gpuagent.edges.users import user_name
from gpuagent.logs import Event
from gpuagent.sources.kernel import clears
from gpuagent.views import Clear

__all__ = ["Cleared"]


class Cleared:
    """Root's clears read so far; ``names`` gives the user names of the clears' login uids
    (the person behind a ``sudo gpuagent clear``)."""

    def __init__(self, names: clears.Names = user_name) -> None:
        self._names = names
        # Each GPU's last clear by root (`gpuagent clear`), read in order with the records.
        self.cleared: dict[str, Clear] = {}
        self._forgotten: list[str] = []

    def take(self, at: float, fields: dict[str, bytes]) -> Clear | None:
        """The clear in the journal entry ``fields`` logged at ``at`` (s since the epoch),
        kept; ``None`` where it is not root's, or not a clear the agent honours."""
        if fields.get("MESSAGE_ID") != Event.OPERATOR_CLEAR.value.encode():
            return None
        clear = clears.parse(fields, at, self._names)
        if clear is None:
            return None
        self.cleared[clear.slot] = clear
        if clear.kind == clears.GONE:
            self._forgotten.append(clear.slot)
        return clear

    def forget(self) -> None:
        """Another journal: its clears are read afresh (the GPUs said gone stay to be taken)."""
        self.cleared = {}

    def take_forgotten(self) -> list[str]:
        """The GPUs root said left for good (``gone_from_bus`` cleared) since the last call."""
        gone, self._forgotten = self._forgotten, []
        return gone
