"""Root's side of the requests: take them all, keep only a slot that is an NVIDIA GPU on the
bus, and admit it under the rate limit.

The request directory is the agent's (under its runtime directory): it is opened without
following a symlink and everything in it is removed, whatever it is, so that the path unit
(``DirectoryNotEmpty=``) does not fire again for it.  A request's name is its only content.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from gpuagent.compat import rmtree_at
from gpuagent.evidence import plan
from gpuagent.evidence.store import Store

__all__ = ["DIRECTORY", "admit", "choose", "take"]

DIRECTORY = "/run/gpuagent/evidence-requests"
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def take(directory: str = DIRECTORY) -> list[str]:
    """The names of the requests in ``directory``, each removed; none where it is absent.

    Raises ``OSError`` when it cannot be opened (ELOOP: a symlink) or an entry removed."""
    try:
        fd = os.open(directory, _DIRECTORY)
    except FileNotFoundError:
        return []
    try:
        names = os.listdir(fd)
        for name in names:
            try:
                os.unlink(name, dir_fd=fd)
            except IsADirectoryError:
                rmtree_at(name, fd)
            except FileNotFoundError:
                continue
        return sorted(names)
    finally:
        os.close(fd)


def choose(names: Iterable[str], is_gpu: Callable[[str], bool]) -> tuple[list[str], list[str]]:
    """The slots ``names`` ask for that are NVIDIA GPUs (``is_gpu``), each once, and a line
    for each name refused."""
    slots: list[str] = []
    refused: list[str] = []
    for name in names:
        if not plan.is_slot(name):
            refused.append(f"{name[:80]!r}: not a PCI slot")
        elif not is_gpu(name):
            refused.append(f"{name}: not an NVIDIA GPU on the bus")
        elif name not in slots:
            slots.append(name)
    return slots, refused


def admit(
    store: Store, slots: Iterable[str], boot: str, now: float, per_hour: int
) -> tuple[list[str], list[str]]:
    """The ``slots`` admitted under the ledger of ``store`` (updated), and a line for each
    refused or for a ledger that could not be read (it starts anew)."""
    admitted: list[str] = []
    said: list[str] = []
    with store.locked():
        ledger, problem = store.ledger()
        if problem is not None:
            said.append(f"{problem}; starting a new ledger")
        for slot in slots:
            why, ledger = plan.admit(ledger, slot, boot, now, per_hour)
            if why is None:
                admitted.append(slot)
            else:
                said.append(f"{slot}: {why}")
        try:
            store.keep_ledger(ledger)
        except OSError as e:
            # Unrecorded, an admission would not count against the limit: none then.
            return [], [*said, f"cannot write the ledger: {e.strerror or e}; nothing admitted"]
    return admitted, said
