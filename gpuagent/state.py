"""The state file: written atomically every tick, read by ``gpuagent status``.

Only ``json`` and ``os`` here: ``gpuagent status`` imports this module and must start fast.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["SCHEMA", "StateError", "read", "why", "write"]

SCHEMA = 1


class StateError(Exception):
    """A state file that is missing, unreadable or not a gpuagent state."""


def write(path: str, state: Mapping[str, object]) -> None:
    """Replace ``path`` with ``state`` as JSON, atomically (temp file + rename, same directory).

    The file is mode 0644: every user may run ``gpuagent status``.  Raises ``OSError``
    (ENOSPC, EROFS, EACCES …); the previous file then stays intact.
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    data = json.dumps(state, separators=(",", ":"), allow_nan=False).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def why(e: BaseException) -> str:
    """One line for a file that cannot be read or written: the OS's words, else the error's."""
    return (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__


def read(path: str) -> dict[str, Any]:
    """Load a state file; raises :class:`StateError` with a one-line reason."""
    try:
        with open(path, "rb") as f:
            state = json.load(f)
    except FileNotFoundError:
        raise StateError(f"{path}: no state file (is gpuagent running?)") from None
    except OSError as e:
        raise StateError(f"{path}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise StateError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(state, dict) or state.get("schema") != SCHEMA:
        raise StateError(f"{path}: not a gpuagent state file of schema {SCHEMA}")
    return state
