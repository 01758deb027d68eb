"""Replace a file atomically, for readers that must never see half of it.

Only ``os`` here: ``gpuagent status`` imports this module (through the state file) and must
start fast.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["replace"]


def replace(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: a temporary file beside it, renamed over it.

    The file is mode 0644 whatever the umask, since other users read it (``gpuagent status``,
    node_exporter).  The temporary file's name starts with a dot and ends in ``.tmp``, which
    node_exporter's textfile collector (``*.prom``) never reads.  Raises ``OSError`` (ENOSPC,
    EROFS, EACCES …); the previous file then stays intact and no temporary file is left.
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
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
