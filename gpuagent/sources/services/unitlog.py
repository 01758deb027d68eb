"""A unit's own journal records of this boot: what NVIDIA's daemon said before it stopped.

Read only where a judge needs the words (the fabric manager down: did the driver refuse its
version?), once per change of the unit's state, never every tick.  Only the fields journald
sets itself are trusted: ``_SYSTEMD_UNIT`` (from the process's cgroup, which no client chooses)
and ``_UID`` 0, NVIDIA's daemons running as root; a line anyone logs with ``logger`` or
``systemd-cat`` carries neither.
"""

from __future__ import annotations

from typing import Any

from gpuagent.sources.kernel.journalboot import journal_boot

__all__ = ["LIMIT", "unit_messages"]

# The newest records are enough: a daemon that fails at start logs its reason last.
LIMIT = 20


def _reader(directory: str) -> Any:
    from systemd import journal  # noqa: PLC0415 - only where the journal is read

    if directory:
        return journal.Reader(path=directory)
    return journal.Reader(flags=journal.LOCAL_ONLY | journal.SYSTEM_ONLY)


def unit_messages(directory: str, unit: str, boot: str, limit: int = LIMIT) -> list[str]:
    """The ``MESSAGE`` of the newest ``limit`` records of ``unit`` in the boot ``boot`` (its
    ``_BOOT_ID``, hex; in the system journal, the boot journald logs it under where that is
    not the kernel's: :func:`~gpuagent.sources.kernel.journalboot.journal_boot`), oldest first,
    from the system journal (``directory`` ``""``) or the journal files in ``directory``;
    ``[]`` where the journal cannot be read (the kernel source already says so) or
    python3-systemd is missing."""
    try:
        reader = _reader(directory)
    except (OSError, ImportError):
        return []
    try:
        # The journal's own boot: under a container's boot id the system journal's boot
        # is journald's, as the kernel's records are read (journalboot.journal_boot).
        boot = journal_boot(reader, boot, system=not directory)
        reader.add_match(_SYSTEMD_UNIT=unit, _UID="0", _BOOT_ID=boot)
        reader.seek_tail()
        out: list[str] = []
        while len(out) < limit and (entry := reader.get_previous()):
            message = entry.get("MESSAGE")
            if isinstance(message, bytes):
                message = message.decode("utf-8", "replace")
            if isinstance(message, str):
                out.append(message)
        return out[::-1]
    except OSError:
        return []
    finally:
        reader.close()
