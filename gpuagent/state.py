"""The state file: written atomically every tick, read by ``gpuagent status``.

Only ``json`` and :mod:`gpuagent.edges.safefile` here: ``gpuagent status`` imports this module and
must start fast.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Mapping
from typing import Any

from gpuagent.edges import safefile

__all__ = ["SCHEMA", "NoStateFile", "StateError", "read", "why", "write"]

SCHEMA = 1
# A state file of hundreds of GPUs is a few MiB; this keeps a planted huge file from eating
# the reader's memory.
MAX_SIZE = 64 * 1024 * 1024


class StateError(Exception):
    """A state file that is missing, unreadable or not a gpuagent state."""


class NoStateFile(StateError):
    """No state file at all (the agent never wrote one, or systemd removed it at stop), as
    opposed to one this user may not read."""


def write(path: str, state: Mapping[str, object], limit: int = MAX_SIZE) -> None:
    """Replace ``path`` with ``state`` as JSON, atomically and durably
    (:func:`gpuagent.edges.safefile.write_atomic`: temp file + fsync + rename, same directory).

    The file is mode 0644: every user may run ``gpuagent status``.  Raises ``OSError``
    (ENOSPC, EROFS, EACCES …, and EFBIG "would be N bytes, over its reader's LIMIT" for JSON
    longer than ``limit`` bytes, which its reader would refuse); the previous file then stays
    intact.
    """
    data = json.dumps(state, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"would be {len(data)} bytes, over its reader's {limit}", path)
    safefile.write_atomic(path, data)


def why(e: BaseException) -> str:
    """One line for a file that cannot be read or written: the OS's words, else the error's."""
    return (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__


def read(path: str) -> dict[str, Any]:
    """Load a state file; raises :class:`StateError` with a one-line reason (also for a
    symlink, a FIFO or anything else that is not a regular file: never a hang)."""
    try:
        state = json.loads(safefile.read_regular(path, MAX_SIZE))
    except FileNotFoundError:
        raise NoStateFile(f"{path}: no state file (is gpuagent running?)") from None
    except OSError as e:
        raise StateError(f"{path}: cannot read: {e.strerror}") from None
    except RecursionError:
        raise StateError(f"{path}: not valid JSON: nested too deeply") from None
    except ValueError as e:
        raise StateError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(state, dict) or state.get("schema") != SCHEMA:
        raise StateError(f"{path}: not a gpuagent state file of schema {SCHEMA}")
    return state
