"""Which of systemd's signals say that a watched unit changed (pure: no I/O).

Once a client has called the Manager's ``Subscribe()``, systemd broadcasts a unit's changes,
and the bus delivers those a match rule asks for (never matched on ``sender=``: signals come
from systemd's unique name, not ``org.freedesktop.systemd1``):

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

__all__ = [
    "MANAGER",
    "MANAGER_PATH",
    "PROPERTIES",
    "RELOADING",
    "Changes",
    "Signal",
    "changed",
    "rules",
]

MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"


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
    (systemd reloaded, or too many signals came to look at each)."""

    names: frozenset[str] = field(default_factory=frozenset)
    everything: bool = False


def _rule(**pairs: str) -> str:
    # As jeepney's MatchRule.serialise: every value quoted, a quote as '\''.
    return ",".join("{}='{}'".format(k, v.replace("'", r"'\''")) for k, v in pairs.items())


def rules(name: str, path: str) -> list[str]:
    """The match rules (for the bus's ``AddMatch``) that follow unit ``name`` at ``path``."""
    return [
        _rule(type="signal", interface=PROPERTIES, member="PropertiesChanged", path=path),
        _rule(type="signal", interface=MANAGER, member="UnitNew", path=MANAGER_PATH, arg0=name),
    ]


RELOADING = _rule(type="signal", interface=MANAGER, member="Reloading", path=MANAGER_PATH)


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
