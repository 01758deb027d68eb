"""Which of systemd's signals say that a watched unit changed, and which came from systemd
at all (pure: no I/O).

Once a client has called the Manager's ``Subscribe()``, systemd broadcasts a unit's changes,
and the bus delivers those a match rule asks for.  Every rule names systemd as the sender
(``sender='org.freedesktop.systemd1'``: the bus matches it against the name's owner), so the
bus routes no one else's broadcast; a signal sent to the reader by name (a unicast, which
the system bus lets any user send) passes no rule, so :class:`Inbox` keeps only those whose
sender header is systemd's unique name, followed through the bus's ``NameOwnerChanged``
(systemd re-executed):

- ``PropertiesChanged`` on the unit's object path, for each interface whose properties
  changed (``ActiveState``, ``SubState``, ``Result``, ``NRestarts`` among them);
- ``UnitNew`` (its first argument the unit's name) instead of the first ``PropertiesChanged``
  of a unit systemd has just loaded: a stopped unit, unloaded when idle, that is started
  says only ``UnitNew`` when its load and start fall in one turn of systemd's loop;
- ``Reloading`` around a ``daemon-reload``, after which a unit's file may be another.

``UnitRemoved`` (an idle unit unloaded) is not matched: unloading changes no state, and
loading the unit again to look would make systemd unload it, and say so, again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuagent.edges.systemd.wire import BUS

__all__ = [
    "BUS",
    "MANAGER",
    "MANAGER_PATH",
    "OWNER",
    "PROPERTIES",
    "RELOADING",
    "SYSTEMD",
    "Changes",
    "Inbox",
    "Signal",
    "changed",
    "rules",
]

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = f"{SYSTEMD}.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
_BUS_PATH = "/org/freedesktop/DBus"
_NAME_OWNER_CHANGED = "NameOwnerChanged"
# The D-Bus specification's header field codes (jeepney's HeaderFields, an IntEnum).
_PATH, _INTERFACE, _MEMBER, _SENDER = 1, 2, 3, 7


@dataclass(frozen=True)
class Signal:
    """What the reader needs of a signal that came in: its object path, interface, member
    and first argument (``None`` when it has none)."""

    path: str
    interface: str
    member: str
    arg0: object = None


@dataclass(frozen=True)
class Changes:
    """Since the last look: the watched units that changed (by name), or ``everything``
    (systemd reloaded or changed owner, or too many signals came to look at each)."""

    names: frozenset[str] = field(default_factory=frozenset)
    everything: bool = False


def _rule(**pairs: str) -> str:
    # As jeepney's MatchRule.serialise: every value quoted, a quote as '\''.
    return ",".join("{}='{}'".format(k, v.replace("'", r"'\''")) for k, v in pairs.items())


def _systemd_rule(**pairs: str) -> str:
    return _rule(type="signal", sender=SYSTEMD, **pairs)


def rules(name: str, path: str) -> list[str]:
    """The match rules (for the bus's ``AddMatch``) that follow unit ``name`` at ``path``."""
    return [
        _systemd_rule(interface=PROPERTIES, member="PropertiesChanged", path=path),
        _systemd_rule(interface=MANAGER, member="UnitNew", path=MANAGER_PATH, arg0=name),
    ]


RELOADING = _systemd_rule(interface=MANAGER, member="Reloading", path=MANAGER_PATH)
# The bus's word that systemd's name has another owner (systemd re-executed, or gone).
OWNER = _rule(
    type="signal",
    sender=BUS,
    interface=BUS,
    member=_NAME_OWNER_CHANGED,
    path=_BUS_PATH,
    arg0=SYSTEMD,
)


def changed(signals: Iterable[Signal], paths: Mapping[str, str]) -> Changes:
    """The units among ``paths`` (object path → unit name) that ``signals`` say changed."""
    names: set[str] = set()
    for s in signals:
        if s.interface == PROPERTIES and s.member == "PropertiesChanged" and s.path in paths:
            names.add(paths[s.path])
        elif s.interface == MANAGER and s.path == MANAGER_PATH:
            if s.member == "Reloading":
                return Changes(everything=True)
            if s.member == "UnitNew" and s.arg0 in paths.values():
                names.add(str(s.arg0))
    return Changes(frozenset(names))


class Inbox:
    """The signals the bus delivered to one connection, as jeepney filters them in
    (:meth:`append`, for each signal message: ``msg.header.fields`` a dict by header field
    code, ``msg.body`` a tuple), held until :meth:`take`.

    Kept: at most ``capacity`` signals whose sender is :attr:`owner` (systemd's unique name,
    ``:1.x``; None: not known, nothing kept), past which only that some were lost; and the
    bus's ``NameOwnerChanged`` for systemd's name, which sets :attr:`owner`.  Anything else
    (another sender's signal) is dropped on its sender header.  What comes here is parsed
    already: another sender's message costs a bounded amount only because the connection
    skips it unparsed before (:meth:`~gpuagent.edges.systemd.sysbus.Bus.heed`, given
    :attr:`owner`); this check is the second.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.owner: str | None = None
        self._signals: list[Signal] = []
        self._lost = False
        self._owner_changed = False

    def __len__(self) -> int:
        return len(self._signals)

    def append(self, msg: Any) -> None:
        """Take in one signal message: keep it, or drop it (never raises)."""
        fields = msg.header.fields
        sender = fields.get(_SENDER)
        if sender == BUS:
            self._from_bus(fields, msg.body)
        elif sender is not None and sender == self.owner:
            if len(self._signals) >= self.capacity:
                self._lost = True
                return
            body = msg.body
            self._signals.append(
                Signal(
                    str(fields.get(_PATH, "")),
                    str(fields.get(_INTERFACE, "")),
                    str(fields.get(_MEMBER, "")),
                    body[0] if body else None,
                )
            )

    def _from_bus(self, fields: Mapping[int, Any], body: tuple[Any, ...]) -> None:
        if (
            fields.get(_INTERFACE) == BUS
            and fields.get(_MEMBER) == _NAME_OWNER_CHANGED
            and len(body) == 3
            and body[0] == SYSTEMD
        ):
            self.owner = str(body[2]) or None
            self._owner_changed = True

    def pending(self, paths: Mapping[str, str]) -> bool:
        """Whether what is kept says that a unit among ``paths`` changed, or that any may
        have (:meth:`take` would say ``everything``); keeps it for :meth:`take`."""
        if self._lost or self._owner_changed:
            return True
        changes = changed(self._signals, paths)
        return changes.everything or bool(changes.names)

    def take(self, paths: Mapping[str, str]) -> Changes:
        """What the signals kept since the last take say of the units among ``paths``
        (object path → unit name): ``everything`` when some were lost or systemd's owner
        changed (its units may have changed meanwhile); then forgets them."""
        lost = self._lost or self._owner_changed
        signals, self._signals = self._signals, []
        self._lost = self._owner_changed = False
        return Changes(everything=True) if lost else changed(signals, paths)

    def clear(self) -> None:
        """Forget what was kept (nothing will take it)."""
        self._signals.clear()
        self._lost = self._owner_changed = False
