"""A process's name as the kernel keeps it: ``/proc/<pid>/comm``.

The kernel's ``comm`` is at most 15 bytes (``TASK_COMM_LEN`` less its NUL), the executable's
base name unless the process renamed itself; it is a user's to choose, so a character that is
not printable (a newline among them) is shown as ``?``.  A process that is gone, or hidden
from the agent (its sandbox's ``ProtectProc=invisible`` hides other users' processes), has no
name here.
"""

from __future__ import annotations

import os

__all__ = ["COMM_BYTES", "name", "read"]

# TASK_COMM_LEN is 16 with its NUL; a longer read is no comm file of the kernel's.
COMM_BYTES = 15
_READ = 64


def name(data: bytes) -> str | None:
    """The name in a ``comm`` file's bytes (its one trailing newline dropped, UTF-8, what is
    not printable as ``?``); ``None`` for an empty or over-long one."""
    data = data.removesuffix(b"\n")
    if not data or len(data) > COMM_BYTES:
        return None
    text = data.decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else "?" for c in text)


def read(proc_root: str, pid: int) -> str | None:
    """The name of process ``pid`` from ``<proc_root>/<pid>/comm``, or ``None`` (gone, hidden,
    unreadable).  Never raises."""
    try:
        with open(os.path.join(proc_root, str(pid), "comm"), "rb") as f:
            return name(f.read(_READ))
    except OSError:
        return None
