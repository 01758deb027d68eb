"""Kernel records written to a real journal directory now, as journald would (for the tests
and the bench that time an agent's event wait).

sd-journal orders a file's entries by this boot's monotonic stamps: an entry stamped before
the reader's position is skipped, so every entry gets the stamps of the moment it is made.
Needs systemd-journal-remote (:func:`tests.test_kernlog.remote` skips a test without it).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable

__all__ = [
    "REMOTES",
    "append",
    "journal_remote",
    "kernel_records",
    "this_boot",
    "write_file",
    "xid",
]

REMOTES = ("/usr/lib/systemd/systemd-journal-remote", "/lib/systemd/systemd-journal-remote")


def this_boot() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip().replace("-", "")


def xid(slot: str, code: int = 79, words: str = "GPU has fallen off the bus.") -> str:
    """The driver's record of Xid ``code`` on the GPU at PCI ``slot`` (``0000:41:00.0``)."""
    return f"NVRM: Xid (PCI:{slot.rsplit('.', 1)[0]}): {code}, pid=1234, name=python3, {words}"


def kernel_records(messages: Iterable[str]) -> bytes:
    """The kernel's records of ``messages``, in the journal export format, stamped now (one
    microsecond apart) with this boot's id."""
    wall, mono, boot = int(time.time() * 1e6), int(time.monotonic() * 1e6), this_boot()
    out = []
    for i, message in enumerate(messages):
        fields = (
            f"__REALTIME_TIMESTAMP={wall + i}\n__MONOTONIC_TIMESTAMP={mono + i}\n"
            f"_BOOT_ID={boot}\n_MACHINE_ID={'f' * 32}\n_HOSTNAME=testhost\n"
            "_TRANSPORT=kernel\nPRIORITY=3\nSYSLOG_FACILITY=0\nSYSLOG_IDENTIFIER=kernel\n"
        )
        data = message.encode()
        out.append(
            fields.encode() + b"MESSAGE\n" + len(data).to_bytes(8, "little") + data + b"\n\n"
        )
    return b"".join(out)


def journal_remote() -> str | None:
    """Debian's systemd-journal-remote (package systemd-journal-remote), or ``None``."""
    return next((p for p in REMOTES if os.access(p, os.X_OK)), None)


def _remote() -> str:
    path = journal_remote()
    if path is None:
        raise FileNotFoundError("systemd-journal-remote is not installed")
    return path


def write_file(path: str, export: bytes) -> None:
    """Write (or append to) the journal file ``path`` (``*.journal``) the entries ``export``."""
    subprocess.run(
        [_remote(), f"--output={path}", "-"],
        input=export,
        check=True,
        capture_output=True,
        timeout=120,
    )


def append(directory: str, messages: Iterable[str]) -> None:
    """Append kernel records of ``messages`` to ``directory/x.journal``, stamped now."""
    write_file(os.path.join(directory, "x.journal"), kernel_records(messages))
