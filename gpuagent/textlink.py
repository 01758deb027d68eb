"""The link through which Debian's node_exporter reads the sandboxed agent's metrics.

The service may write only under its RuntimeDirectory, ``/run/gpuagent``; node_exporter reads
``/var/lib/prometheus/node-exporter``.  So the unit runs ``gpuagent link-textfile`` with full
privileges before start and on reload, linking the configured ``textfile`` to the file the
agent really writes, and ``gpuagent link-textfile --remove`` after stop.  The link exists only
while the agent can keep its target current, so node_exporter never meets a dangling link
(it reports one as a scrape error on every scrape) and never serves a stopped agent's numbers.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["RUN_FILE", "link", "unlink"]

RUN_FILE = "/run/gpuagent/gpuagent.prom"


def _ours(path: str, target: str) -> bool:
    try:
        return os.readlink(path) == target
    except OSError:
        return False


def unlink(paths: list[str], target: str = RUN_FILE) -> list[str]:
    """Remove each of ``paths`` that is a link to ``target``; returns the ones removed.

    Anything else at those paths (an operator's own file or link) is left alone.
    """
    removed = []
    for path in dict.fromkeys(p for p in paths if p):
        if _ours(path, target):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
    return removed


def link(textfile: str, stale: list[str], target: str = RUN_FILE) -> str | None:
    """Link ``textfile`` to ``target`` where node_exporter's directory exists; returns it.

    ``stale`` are earlier link paths (the default one) to drop when ``textfile`` moved away
    from them.  Nothing is linked when ``textfile`` is ``""``, when its directory does not
    exist (no node_exporter), or when something that is not our link is already there.
    An empty ``target`` is created first, so that the link is never dangling.
    Raises ``OSError`` when the directory exists but the link cannot be made.
    """
    unlink([p for p in stale if p != textfile], target)
    if not textfile or not os.path.isdir(os.path.dirname(textfile)):
        return None
    if os.path.lexists(textfile) and not _ours(textfile, target):
        return None
    if os.path.isdir(os.path.dirname(target)):
        with contextlib.suppress(FileExistsError):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    tmp = f"{textfile}.gpuagent-link"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, textfile)
    return textfile
