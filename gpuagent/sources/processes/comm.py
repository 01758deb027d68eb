"""A process's name as the kernel keeps it: ``/proc/<pid>/comm``.

The kernel's ``comm`` is at most 15 bytes (``TASK_COMM_LEN`` less its NUL), the executable's
base name unless the process renamed itself; it is a user's to choose, so a character that is
not printable (a newline among them) is shown as ``?``.  A process that is gone, or hidden
from the agent (its sandbox's ``ProtectProc=invisible`` hides other users' processes), has no
name here; :func:`from_cmdline` gives the name ``comm`` would most likely hold from the
command line systemd lists for the process instead (systemd reads it as root).
"""

from __future__ import annotations

import os

from gpuagent.untrusted import printable

__all__ = ["COMM_BYTES", "from_cmdline", "name", "read"]

# TASK_COMM_LEN is 16 with its NUL; a longer read is no comm file of the kernel's.
COMM_BYTES = 15
_READ = 64
# systemd's backslash escapes in a quoted argument (cescape_char's and the shell's).
_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}


def name(data: bytes) -> str | None:
    """The name in a ``comm`` file's bytes (its one trailing newline dropped, UTF-8, what is
    not printable as ``?``); ``None`` for an empty or over-long one."""
    data = data.removesuffix(b"\n")
    if not data or len(data) > COMM_BYTES:
        return None
    return _printable(data)


def from_cmdline(cmdline: str) -> str | None:
    """The name in a command line as systemd's ``GetUnitProcesses`` lists it: the base name
    of its first argument (unquoted, its escapes undone), cut to :data:`COMM_BYTES` bytes as
    the kernel cuts ``comm``, what is not printable as ``?``; ``[comm]``, systemd's form for
    a process without a command line, is that ``comm``.  ``None`` for an empty name."""
    if cmdline.startswith('"'):
        first = _unquoted(cmdline[1:])
    else:
        first = cmdline.partition(" ")[0].encode("utf-8", errors="replace")
        if len(first) > 2 and first.startswith(b"[") and first.endswith(b"]"):
            return name(first[1:-1])  # the kernel's comm itself, "/" and all
    base = first.rpartition(b"/")[2][:COMM_BYTES]
    return _printable(base) if base else None


def _unquoted(text: str) -> bytes:
    """The bytes of a double-quoted argument up to its closing quote (``text`` starts after
    the opening one): a backslash keeps the character after it, or is a C escape (its
    letter, or ``x`` and two hex digits) for that byte."""
    out = bytearray()
    i = 0
    while i < len(text) and text[i] != '"':
        c = text[i]
        i += 1
        if c != "\\" or i == len(text):
            out += c.encode("utf-8", errors="replace")
            continue
        e = text[i]
        i += 1
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
        elif e == "x" and _hex(text[i : i + 2]):
            out.append(int(text[i : i + 2], 16))
            i += 2
        else:
            out += e.encode("utf-8", errors="replace")
    return bytes(out)


def _hex(digits: str) -> bool:
    return len(digits) == 2 and all(d in "0123456789abcdefABCDEF" for d in digits)


def _printable(data: bytes) -> str:
    return printable(data.decode("utf-8", errors="replace"))


def read(proc_root: str, pid: int) -> str | None:
    """The name of process ``pid`` from ``<proc_root>/<pid>/comm``, or ``None`` (gone, hidden,
    unreadable).  Never raises."""
    try:
        with open(os.path.join(proc_root, str(pid), "comm"), "rb") as f:
            return name(f.read(_READ))
    except OSError:
        return None
