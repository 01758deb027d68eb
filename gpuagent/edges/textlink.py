"""The link through which Debian's node_exporter reads the sandboxed agent's metrics.

The service may write only under its RuntimeDirectory, ``/run/gpuagent``; node_exporter reads
``/var/lib/prometheus/node-exporter``.  So the unit runs ``gpuagent link-textfile`` with full
privileges before start and on reload, linking the configured ``textfile`` to the file the
agent really writes, and ``gpuagent link-textfile --remove`` after stop.  The link exists only
while the agent can keep its target current, so node_exporter never meets a dangling link
(it reports one as a scrape error on every scrape) and never serves a stopped agent's numbers.
The path linked is recorded beside the agent's file, so that the clean-up finds it even when
the config file was broken since.
"""

from __future__ import annotations

import contextlib
import os
import stat

from gpuagent.edges import safefile

__all__ = ["RUN_FILE", "link", "unlink"]

RUN_FILE = "/run/gpuagent/gpuagent.prom"
# Beside the target: "gpuagent.prom.link" holds the path of the link last made to it.
_RECORD = ".link"


def _ours(path: str, target: str) -> bool:
    try:
        return os.readlink(path) == target
    except OSError:
        return False


# The record lives in the agent's directory, which the unprivileged agent may write, and root
# reads and writes it: never through a symlink, never blocking on a FIFO.
_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _recorded(target: str) -> list[str]:
    try:
        fd = os.open(target + _RECORD, os.O_RDONLY | _SAFE)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        return [os.read(fd, 4096).decode("utf-8").rstrip("\n")]
    except (OSError, UnicodeDecodeError):
        return []
    finally:
        os.close(fd)


def _record(target: str, textfile: str) -> None:
    tmp = target + _RECORD + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _SAFE, 0o644)
    try:
        os.write(fd, f"{textfile}\n".encode())
    finally:
        os.close(fd)
    os.replace(tmp, target + _RECORD)


def unlink(paths: list[str], target: str = RUN_FILE) -> list[str]:
    """Remove each of ``paths``, and the link recorded by :func:`link`, that is a link to
    ``target``; returns the ones removed.

    Anything else at those paths (an operator's own file or link) is left alone; so the record,
    which the unprivileged agent could rewrite, can only name another link to its own file.
    """
    removed = []
    for path in dict.fromkeys(p for p in [*paths, *_recorded(target)] if p):
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
    Raises ``OSError`` when the directory exists but the link cannot be made, and EPERM when
    the way to it takes a symlink that neither root nor this user made: node_exporter's user
    could point that anywhere (:func:`gpuagent.edges.safefile.resolve_trusted`).
    """
    unlink([p for p in stale if p != textfile], target)
    if not textfile:
        return None
    made = textfile
    textfile = os.path.join(
        safefile.resolve_trusted(os.path.dirname(textfile)), os.path.basename(textfile)
    )
    if not os.path.isdir(os.path.dirname(textfile)):
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
    with contextlib.suppress(OSError):
        _record(target, made)
    return made
