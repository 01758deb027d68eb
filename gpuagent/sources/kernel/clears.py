"""An operator's clear of a GPU problem (or of the host's, ``PCI_SLOT=host``), as ``gpuagent
clear`` sends it to the journal and the agent reads it back (pure).

The entry carries its own ``MESSAGE_ID`` (:attr:`gpuagent.logs.Event.OPERATOR_CLEAR`) and the
fields ``PCI_SLOT``, ``KIND`` (a kind, or ``all``), ``CLEARED_BY`` (the caller's user
name: root) and ``SUDO_USER`` (the person ``sudo`` ran it for, where it did).  Anyone may log
such text; only an entry journald stamped ``_UID=0`` counts (:func:`parse`).  The person
behind it is the login uid journald stamps (``_AUDIT_LOGINUID``: the user who logged in,
whatever ``sudo`` or ``su`` came after, which the sender cannot forge), else ``SUDO_USER``,
else ``CLEARED_BY`` (:func:`person`).  A clear ends only the problems that hold until the next boot
(:data:`LATCHING`); whatever is read live (nvidia-smi's values, the bus) ends with its cause,
or, while it is held unread (its source cannot look), by a clear of its own kind.
:func:`ending` says how each problem ends, in the words every surface shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from gpuagent.sources.bus.pciaddr import parse_device
from gpuagent.untrusted import whole
from gpuagent.views import Clear

__all__ = [
    "ALL",
    "GONE",
    "HOST",
    "HOST_LATCHING",
    "LATCHING",
    "NO_LOGIN",
    "Names",
    "covers",
    "ending",
    "fields",
    "host_refusal",
    "no_names",
    "parse",
    "person",
    "refusal",
    "slot_of",
]

# The kinds that hold until the next boot unless an operator clears them.
LATCHING = ("xid", "init_failed", "pcie_error")
# The host's: a reset no record shows (nvservices.RESTARTED's).
HOST_LATCHING = ("fabricmanager_restarted",)
# PCI_SLOT of a host's clear (`gpuagent clear host KIND`); its Clear's slot is "".
HOST = "host"
# KIND for every latching problem of the GPU (`gpuagent clear SLOT --all`).
ALL = "all"
# The one kind read from the bus that a clear accepts: the GPU left for good, forget it.
GONE = "gone_from_bus"
# What a problem's kind looks like (a clear of one that no problem has ends nothing).
_KIND = re.compile(r"[a-z][a-z0-9_]{0,39}")
# The login uid of a process no login started (a unit, cron): (uid_t)-1.
NO_LOGIN = 4294967295
# A user's name by uid, None where none is known (pwd.getpwuid's, injected).
Names = Callable[[int], str | None]


def covers(cleared: str, kind: str) -> bool:
    """Whether a clear of ``cleared`` (a kind or :data:`ALL`) ends a problem of ``kind``."""
    return (
        (kind in LATCHING and cleared in (kind, ALL))
        or (kind in HOST_LATCHING and cleared == kind)
        or kind == cleared == GONE
    )


def refusal(kind: str) -> str | None:
    """Why a problem of ``kind`` cannot be cleared by hand, or None if it can."""
    if kind in (ALL, GONE) or kind in LATCHING:
        return None
    return (
        f"{kind} is read live (nvidia-smi, the PCI bus): it ends when its cause does; "
        f"only {', '.join(LATCHING)} hold until a clear or the next boot, and {GONE} "
        "until a clear forgets the GPU"
    )


def host_refusal(kind: str, ends: str | None) -> str:
    """Why ``gpuagent clear host KIND`` ends nothing, truthfully: a host's problem (no GPU's
    slot to clear) ends with its cause, as ``ends`` says (the state's words, :func:`ending`:
    ``ends by itself once nvidia-smi has answered normally 3 probes in a row …``); ``None``
    where the host has no such problem, or no state says."""
    said = f"host {kind} {ends}" if ends else "a host problem ends when its cause does"
    return (
        f"{said}; no clear ends it (a clear takes a GPU's slot and ends its "
        f"{', '.join(LATCHING)} or {GONE}; the host's {', '.join(HOST_LATCHING)}, or a "
        "problem held unread)"
    )


def ending(slot: str, kind: str, when: str) -> tuple[str, bool]:
    """How a problem of ``kind`` on ``slot`` (``""``: the host) ends, in the words of the
    journal line, ``status``, the state and the alert (``It …``), and whether it latches:
    only ``gpuagent clear``, or the next boot, ends it; a repair alone does not.  ``when`` is
    what its rule says of its own end (``when nvidia-smi answers again``; ``""``: none).

    ``("holds until the next boot; after the repair: gpuagent clear 0000:18:00.0 xid",
    True)``; ``("ends by itself when the GPU is back on the PCI bus; if it left for good:
    gpuagent clear 0000:18:00.0 gone_from_bus", False)``; ``("ends by itself when
    nvidia-fabricmanager.service runs again", False)``.  Of a host's problems only
    :data:`HOST_LATCHING` take a clear (``gpuagent clear host KIND``)."""
    command = f"gpuagent clear {slot or HOST} {kind}"
    clear = None
    if not slot and kind in HOST_LATCHING:
        clear = f"after the reset: {command}"
    elif slot and kind in LATCHING:
        # One that lapses by itself (a warning Xid) needs no repair: a clear ends it sooner.
        clear = f"or sooner: {command}" if when else f"after the repair: {command}"
    elif slot and kind == GONE:
        clear = f"if it left for good: {command}"
    if when:
        said = f"ends by itself {when}"
        return (f"{said}; {clear}" if clear else said), False
    if clear:
        return f"holds until the next boot; {clear}", True
    # A host's Xid (an address that is no GPU): this boot's, with no slot to clear.
    return ("ends at the next boot" if kind in LATCHING else "ends when its cause does"), False


def slot_of(text: str) -> str | None:
    """A GPU's PCI slot as an operator types it (``0000:3B:00.0``, ``3b:00.0``) in sysfs form,
    or None if it is not one."""
    text = text.strip()
    found = parse_device(text) or parse_device(f"0000:{text}")
    if found is None:
        return None
    device, function = found
    return f"{device}.{function or 0}"


def fields(slot: str, kind: str, by: str, sudo_user: str | None = None) -> dict[str, str]:
    """The journal entry's fields beside MESSAGE_ID and MESSAGE (``SUDO_USER`` where given)."""
    out = {"PCI_SLOT": slot, "KIND": kind, "CLEARED_BY": by}
    if sudo_user:
        out["SUDO_USER"] = sudo_user
    return out


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def no_names(_uid: int) -> str | None:
    """Names no user: a clear's person is then ``uid N`` (tests, and readers that need none)."""
    return None


def person(entry: Mapping[str, object], names: Names = no_names) -> str | None:
    """The person behind a clear: the user of its login uid (``uid N`` where ``names`` knows
    none), else its ``SUDO_USER``; None where the entry says neither."""
    text = _text(entry.get("_AUDIT_LOGINUID"))
    login = None if text is None else whole(text, 10)
    if login is not None and login != NO_LOGIN:
        return names(login) or f"uid {login}"
    return _text(entry.get("SUDO_USER")) or None


def parse(entry: Mapping[str, object], at: float, names: Names = no_names) -> Clear | None:
    """The clear a journal entry logged at ``at`` says, or None: not from uid 0, no valid
    slot, or no kind's name.  Its ``by`` is the :func:`person` behind it, else
    the user who ran it (``CLEARED_BY``, root)."""
    if _text(entry.get("_UID")) != "0":
        return None
    slot, kind, by = (_text(entry.get(k)) for k in ("PCI_SLOT", "KIND", "CLEARED_BY"))
    # A live kind counts too: it ends such a problem while it is held unread (the verdict's).
    if slot is None or kind is None or not _KIND.fullmatch(kind):
        return None
    if slot == HOST:
        return Clear("", kind, person(entry, names) or by or "root", at)
    slot = slot_of(slot)
    if slot is None:
        return None
    return Clear(slot, kind, person(entry, names) or by or "root", at)
