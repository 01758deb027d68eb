"""What the kernel records' read (:mod:`.kernlog`) matches in the journal, beside the kernel's
own records (pure, but for the reader it is given).

The same read also takes the module loaders' records (:data:`LOADERS`: root's ``modprobe``'s
stderr, ``systemd-modules-load``'s own lines), whose words say why the nvidia module is not
there ("Module nvidia not found", "Key was rejected by service").  They are told apart by
the fields journald sets itself (``_TRANSPORT``, ``_COMM``, ``_SYSTEMD_UNIT``, ``_UID``),
which no program can forge through ``logger`` or ``sd_journal_send``; ``_COMM`` is the name a
process gives itself, so only root's count.  They are handed to their own sink:
never to the one that counts Xids.  One match with OR-ed terms (``sd_journal_add_disjunction``)
reads both in one pass.

With them, in journal order, come root's ``gpuagent clear`` entries (:data:`CLEARS`:
``MESSAGE_ID`` and ``_UID=0``, which journald sets), handed to a third sink with their fields.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

__all__ = ["CLEARS", "FIELDS", "LOADERS", "LOADER_UID", "fields", "match"]

# The agent's own entries read in order with the kernel's: `gpuagent clear` from root
# (logs.Event.OPERATOR_CLEAR, which tests/test_kernlog.py keeps equal).
CLEARS = {"MESSAGE_ID": "9c49e6436dd14aaea07c537ddc3d294c", "_UID": "0"}
# The fields of such an entry handed to the clears' sink.
FIELDS = ("MESSAGE_ID", "_UID", "_AUDIT_LOGINUID", "PCI_SLOT", "KIND", "CLEARED_BY", "SUDO_USER")

# The module loaders' records, by the fields journald itself sets: the command name of the
# process that logged (``_COMM``: modprobe run by a unit or udev, whose stderr is the
# journal's; systemd-modules-load), or the unit it ran in; each only from root (``_UID``,
# LOADER_UID), since any user may run a program named modprobe (systemd-cat modprobe …).
LOADERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("_COMM", ("modprobe", "systemd-modules-load")),
    ("_SYSTEMD_UNIT", ("systemd-modules-load.service",)),
)
LOADER_UID = "0"


def match(reader: Any, also: Mapping[str, str] = CLEARS, boot: str | None = None) -> None:
    """Restrict ``reader`` to what :class:`~.kernlog.KernelLog` reads: (the kernel's records, or a
    module loader's, or the entries matching all of ``also``) of this boot (``boot``, or
    the kernel's id as this process sees it)."""
    reader.add_match(_TRANSPORT="kernel")
    for field, values in LOADERS:
        reader.add_disjunction()
        # Terms of one field are OR-ed, of two fields AND-ed: (any of the values) and root's.
        reader.add_match(*(f"{field}={v}" for v in values), f"_UID={LOADER_UID}")
    if also:
        reader.add_disjunction()
        reader.add_match(**also)
    reader.add_conjunction()
    reader.this_boot(boot)


def fields(reader: Any) -> dict[str, bytes]:
    """The :data:`FIELDS` the reader's entry has (a clear's), as bytes."""
    got: dict[str, bytes] = {}
    for name in FIELDS:
        with contextlib.suppress(KeyError):
            value = reader._get(name)
            got[name] = value if isinstance(value, bytes) else str(value).encode()
    return got
