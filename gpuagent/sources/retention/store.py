"""What is seen of the journal that recurrence reads: journald's settings, where its files
live, how much they take and their oldest entry (the I/O of :mod:`.judge`).

Every path is under ``root`` (``/``; a fake tree in tests).  journald.conf is read as journald
reads it: ``etc/systemd/journald.conf``, then the drop-ins ``journald.conf.d/*.conf`` of
``etc``, ``run`` and ``usr/lib`` in the order of their names (a name in ``etc`` masks the same
in ``run`` and ``usr/lib``).  A configured ``journal_directory`` is judged instead of the
system's: lost at each boot where it lies in ``/run``, else by its files against journald's cap.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gpuagent.sources.retention.judge import Store, settings, size

__all__ = ["Files", "files", "lasts", "look"]

_DROPINS = ("etc", "run", "usr/lib")
# The bytes the journal files in a directory take and the oldest entry (s) of those the
# agent reads there (the system's own files only, where the second argument says so), or
# OSError.
Files = Callable[[str, bool], tuple[int, float | None]]


def files(directory: str, system: bool) -> tuple[int, float | None]:
    """The bytes sd-journal counts for every journal file in ``directory`` (journald's cap
    counts them all) and the oldest entry of those the agent reads: with ``system``, the
    system's own files only (``system.journal``, ``system@…``), as recurrence reads the
    system journal; a user's file (``user-1000.journal``) holds what its user logged, kept
    by journald on its own terms, and its oldest entry says nothing of the system's."""
    from systemd import journal  # noqa: PLC0415

    reader: Any = journal.Reader(path=directory)
    try:
        usage = int(reader.get_usage())
    finally:
        reader.close()
    reader = journal.Reader(path=directory, flags=journal.SYSTEM_ONLY if system else 0)
    try:
        reader.seek_head()
        oldest = reader._get_realtime() / 1e6 if reader._next() else None
        return usage, oldest
    finally:
        reader.close()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""  # journald reads no file it cannot open either


def journald(root: str) -> dict[str, str]:
    """journald's ``[Journal]`` settings under ``root``."""
    texts = [_read(os.path.join(root, "etc/systemd/journald.conf"))]
    dropins: dict[str, str] = {}
    for top in _DROPINS:
        folder = os.path.join(root, top, "systemd/journald.conf.d")
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.endswith(".conf"):
                dropins.setdefault(name, os.path.join(folder, name))
    texts += [_read(dropins[name]) for name in sorted(dropins)]
    return settings(texts)


def _volatile(root: str, storage: str) -> tuple[str, str] | None:
    """Why the system journal is lost at each boot and how to keep it; None where it lasts."""
    if storage in ("volatile", "none"):
        return f"journald.conf has Storage={storage}", "set Storage=persistent in journald.conf"
    machine = _read(os.path.join(root, "etc/machine-id")).strip()
    where = f"/var/log/journal/{machine}" if machine else "/var/log/journal"
    if os.path.isdir(os.path.join(root, where.lstrip("/"))):
        return None
    return f"there is no {where}", (
        "mkdir /var/log/journal, then journalctl --flush (or Storage=persistent in journald.conf)"
    )


def _in_run(directory: str) -> bool:
    return os.path.normpath(directory) == "/run" or directory.startswith("/run/")


def lasts(root: str, journal_directory: str) -> bool:
    """Whether the journal the agent reads (``journal_directory``; ``""``: the system's, its
    journald under ``root``) is kept across boots: a directory of files outside ``/run``, or
    a system journal that is not volatile (:func:`look`'s rule)."""
    if journal_directory:
        return not _in_run(journal_directory)
    return _volatile(root, journald(root).get("Storage", "auto")) is None


def look(root: str, journal_directory: str, read: Files = files) -> Store | None:
    """The journal the agent reads (``journal_directory``; ``""``: the system's) as it is
    now; None where its files cannot be read (the kernel source says so: ``journal``)."""
    conf = journald(root)
    max_use = size(conf.get("SystemMaxUse"))
    if journal_directory:
        directory = journal_directory
        if _in_run(directory):
            return Store(
                directory,
                f"journal_directory {directory} lies in /run",
                "set journal_directory to journal files on disk",
            )
    else:
        volatile = _volatile(root, conf.get("Storage", "auto"))
        if volatile is not None:
            return Store("/var/log/journal", *volatile)
        directory = os.path.join(root, "var/log/journal")
    try:
        usage, oldest = read(directory, not journal_directory)
        stat = os.statvfs(directory)
    except OSError:
        return None
    return Store(directory, None, None, usage, oldest, max_use, stat.f_blocks * stat.f_frsize)
