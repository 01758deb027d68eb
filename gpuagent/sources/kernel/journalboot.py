"""This boot in the systemd journal (the I/O of opening it): a reader of the journal in a
directory or the system's, the kernel's boot id, when the kernel booted, and the
``_BOOT_ID`` journald stamps on this boot's entries (:func:`journal_boot`), shared by the
kernel records' read (:mod:`.kernlog`) and the earlier boots' (:mod:`.earlier`).

"This boot" is the ``_BOOT_ID`` journald stamps: the kernel's boot id as this process sees
it, unless the system journal has no entry of it and journald stamps another, as in a
container whose manager gives it a boot id of its own (systemd-nspawn) that a sandboxed
service's fresh ``/proc`` (``ProtectProc=``) does not show.  Then the boot of the journal's
latest entry is this one, so that root's clears, stamped by journald, are read."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["booted_at", "journal_boot", "kernel_boot", "last_is", "open_reader", "reason"]


def open_reader(directory: str) -> Any:
    """A reader of the journal in ``directory`` (``""``: the local system journal)."""
    from systemd import journal  # noqa: PLC0415 - only where the journal is read

    if directory:
        return journal.Reader(path=directory)
    return journal.Reader(flags=journal.LOCAL_ONLY | journal.SYSTEM_ONLY)


def kernel_boot() -> str:
    """The kernel's boot id as this process sees it."""
    from systemd import id128  # noqa: PLC0415 - only where the journal is read

    return str(id128.get_boot().hex)


def booted_at() -> float:
    """When the kernel booted, in s since the epoch (no ``/proc`` needed)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def journal_boot(reader: Any, mine: str, *, system: bool = True, since: float | None = None) -> str:
    """This boot's ``_BOOT_ID`` in the journal ``reader`` reads (no match added yet):
    ``mine``, the kernel's boot id as this process sees it, if the journal has entries of it
    or is not the ``system`` journal (a directory, copied or made for a test); else the boot
    of the system journal's latest entry (journald's, where its boot id is not the one this
    process sees), if that entry was logged since the kernel booted (``since``, s since the
    epoch; :func:`booted_at` by default): a journal that holds only earlier boots (journald
    writing nowhere now) says nothing of this one.  ``mine`` for an empty journal.  Leaves
    the reader's position anywhere."""
    if not system or mine in {getattr(b, "hex", b) for b in reader.query_unique("_BOOT_ID")}:
        return mine
    reader.seek_tail()
    try:
        boot = reader._get("_BOOT_ID") if reader._previous() else None
        logged = reader._get_realtime() / 1e6 if boot is not None else 0.0
    except KeyError:
        boot = None
    if isinstance(boot, bytes):
        boot = boot.decode("ascii", "replace")
    if not isinstance(boot, str) or not boot:
        return mine
    return boot if logged >= (booted_at() if since is None else since) else mine


def reason(e: BaseException) -> str:
    """A journal read's error in a few words: an OSError's own, else its first line."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[0].lower() + e.strerror[1:]
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def last_is(reader: Any, cursor: str) -> bool:
    """Place ``reader`` on its last entry; whether that is the one at ``cursor`` (then the
    next read takes what comes after it, as from the cursor)."""
    reader.seek_tail()
    return bool(reader._previous()) and bool(reader.test_cursor(cursor))
