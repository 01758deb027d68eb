"""gpuagent.edges.systemd.unitsignals: which of systemd's signals name a watched unit (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuagent.edges.systemd.unitsignals import (
    BUS,
    MANAGER,
    MANAGER_PATH,
    OWNER,
    PROPERTIES,
    RELOADING,
    SYSTEMD,
    Changes,
    Inbox,
    Signal,
    changed,
    rules,
)

FM = "nvidia-fabricmanager.service"
PD = "nvidia-persistenced.service"
FM_PATH = "/org/freedesktop/systemd1/unit/nvidia_2dfabricmanager_2eservice"
PD_PATH = "/org/freedesktop/systemd1/unit/nvidia_2dpersistenced_2eservice"
PATHS = {FM_PATH: FM, PD_PATH: PD}


def props(path: str) -> Signal:
    return Signal(path, PROPERTIES, "PropertiesChanged", "org.freedesktop.systemd1.Unit")


def test_the_rules_name_systemd_as_the_sender() -> None:
    assert rules(FM, FM_PATH) == [
        "type='signal',sender='org.freedesktop.systemd1',"
        "interface='org.freedesktop.DBus.Properties',"
        f"member='PropertiesChanged',path='{FM_PATH}'",
        "type='signal',sender='org.freedesktop.systemd1',"
        "interface='org.freedesktop.systemd1.Manager',member='UnitNew',"
        f"path='/org/freedesktop/systemd1',arg0='{FM}'",
    ]
    assert RELOADING == (
        "type='signal',sender='org.freedesktop.systemd1',"
        "interface='org.freedesktop.systemd1.Manager',member='Reloading',"
        "path='/org/freedesktop/systemd1'"
    )
    assert OWNER == (
        "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',"
        "member='NameOwnerChanged',path='/org/freedesktop/DBus',arg0='org.freedesktop.systemd1'"
    )
    # A quote is closed, escaped and opened again, as jeepney's MatchRule does it.
    assert rules("a'b", "/p")[1].endswith("arg0='a'\\''b'")


def test_nothing_came() -> None:
    assert changed([], PATHS) == Changes()


def test_properties_changed_on_a_watched_path() -> None:
    got = changed([props(FM_PATH), props(FM_PATH)], PATHS)
    assert got == Changes(frozenset({FM}))


def test_unit_new_names_the_unit_in_its_first_argument() -> None:
    new = Signal(MANAGER_PATH, MANAGER, "UnitNew", PD)
    assert changed([new], PATHS) == Changes(frozenset({PD}))
    other = Signal(MANAGER_PATH, MANAGER, "UnitNew", "cron.service")
    assert changed([other], PATHS) == Changes()


def test_signals_of_other_units_and_of_the_bus_are_not_changes() -> None:
    signals = [
        props("/org/freedesktop/systemd1/unit/cron_2eservice"),
        Signal("/org/freedesktop/DBus", "org.freedesktop.DBus", "NameAcquired", ":1.7"),
        Signal(MANAGER_PATH, MANAGER, "UnitRemoved", FM),
        Signal(FM_PATH, MANAGER, "UnitNew", FM),  # not the Manager's path
        Signal(MANAGER_PATH, MANAGER, "UnitNew", None),
    ]
    assert changed(signals, PATHS) == Changes()


def test_a_reload_is_everything() -> None:
    reload = Signal(MANAGER_PATH, MANAGER, "Reloading", False)
    assert changed([props(FM_PATH), reload], PATHS) == Changes(everything=True)


# The inbox: what jeepney hands over, kept only from systemd and only so much.

SYSTEMD_NOW = ":1.1"


class Header:
    def __init__(self, fields: dict[int, Any]) -> None:
        self.fields = fields


class Msg:
    """A jeepney message as the inbox sees it: header fields by code, a body it must not
    read unless the sender is systemd (or the bus)."""

    def __init__(self, sender: str | None, path: str, iface: str, member: str, *body: Any):
        fields = {1: path, 2: iface, 3: member}
        if sender is not None:
            fields[7] = sender
        self.header = Header(fields)
        self._body = body
        self.read = False

    @property
    def body(self) -> tuple[Any, ...]:
        self.read = True
        return self._body


def props_from(sender: str | None, path: str = FM_PATH) -> Msg:
    return Msg(sender, path, PROPERTIES, "PropertiesChanged", "org.freedesktop.systemd1.Unit")


def owner_changed(sender: str, name: str, old: str, new: str) -> Msg:
    return Msg(sender, "/org/freedesktop/DBus", BUS, "NameOwnerChanged", name, old, new)


def inbox(capacity: int = 4) -> Inbox:
    box = Inbox(capacity)
    box.owner = SYSTEMD_NOW
    return box


def test_systemds_signals_are_kept_and_taken_once() -> None:
    box = inbox()
    box.append(props_from(SYSTEMD_NOW))
    box.append(Msg(SYSTEMD_NOW, MANAGER_PATH, MANAGER, "UnitNew", PD, "/p"))
    assert len(box) == 2
    assert box.take(PATHS) == Changes(frozenset({FM, PD}))
    assert len(box) == 0
    assert box.take(PATHS) == Changes()


@pytest.mark.parametrize("sender", [":1.99", None, "", SYSTEMD, ":1.10"])
def test_a_forged_signal_from_another_sender_is_dropped_unread(sender: str | None) -> None:
    # Systemd's path, interface and member, sent by anyone else (or claiming the well-known
    # name, which the bus never puts in a sender field): dropped, its body never read.
    box = inbox()
    forged = [
        props_from(sender),
        Msg(sender, MANAGER_PATH, MANAGER, "Reloading", False),
        Msg(sender, MANAGER_PATH, MANAGER, "UnitRemoved", FM, FM_PATH),
        Msg(sender, MANAGER_PATH, MANAGER, "JobRemoved", 1, "/j", FM, "done"),
        owner_changed(sender or "", SYSTEMD, SYSTEMD_NOW, ":1.99"),
    ]
    for msg in forged:
        box.append(msg)
    assert not any(m.read for m in forged)
    assert (len(box), box.owner) == (0, SYSTEMD_NOW)
    assert box.take(PATHS) == Changes()


def test_a_flood_of_forged_signals_holds_nothing() -> None:
    box = inbox(capacity=256)
    for _ in range(100_000):
        box.append(props_from(":1.666"))
        assert len(box) == 0
    assert box.take(PATHS) == Changes()


def test_past_the_capacity_signals_are_lost_and_everything_is_read() -> None:
    box = inbox(capacity=3)
    for _ in range(10):
        box.append(props_from(SYSTEMD_NOW))
        assert len(box) <= 3
    assert box.take(PATHS) == Changes(everything=True)
    assert box.take(PATHS) == Changes()  # lost once, read once


def test_without_a_known_owner_nothing_is_kept() -> None:
    box = Inbox(4)
    box.append(props_from(SYSTEMD_NOW))
    assert box.take(PATHS) == Changes()


def test_systemd_re_executed_the_new_owner_is_followed_and_everything_read() -> None:
    box = inbox()
    box.append(owner_changed(BUS, SYSTEMD, SYSTEMD_NOW, ""))
    assert box.owner is None
    box.append(props_from(SYSTEMD_NOW))  # the old name: gone
    box.append(owner_changed(BUS, SYSTEMD, "", ":1.42"))
    assert box.owner == ":1.42"
    assert len(box) == 0
    assert box.take(PATHS) == Changes(everything=True)
    box.append(props_from(":1.42"))
    assert box.take(PATHS) == Changes(frozenset({FM}))


def test_the_bus_own_other_signals_change_nothing() -> None:
    box = inbox()
    box.append(Msg(BUS, "/org/freedesktop/DBus", BUS, "NameAcquired", ":1.7"))
    box.append(owner_changed(BUS, "org.example.other", "", ":1.8"))
    two = Msg(BUS, "/org/freedesktop/DBus", BUS, "NameOwnerChanged", SYSTEMD, SYSTEMD_NOW)
    box.append(two)  # malformed: two arguments
    assert (len(box), box.owner) == (0, SYSTEMD_NOW)
    assert box.take(PATHS) == Changes()


def test_clear_forgets_what_was_kept_and_lost() -> None:
    box = inbox(capacity=1)
    box.append(props_from(SYSTEMD_NOW))
    box.append(props_from(SYSTEMD_NOW))
    box.clear()
    assert box.take(PATHS) == Changes()


def test_pending_says_what_take_would_and_keeps_it() -> None:
    # The loop asks between ticks whether an event step is due; the step's read takes them.
    box = inbox(capacity=2)
    assert not box.pending(PATHS)
    box.append(props_from(SYSTEMD_NOW))
    assert box.pending(PATHS)
    assert not box.pending({})  # a unit no longer watched
    assert box.take(PATHS) == Changes(frozenset({FM}))
    box.append(Msg(SYSTEMD_NOW, MANAGER_PATH, MANAGER, "UnitNew", "other.service", "/o"))
    assert not box.pending(PATHS)
    box.append(Msg(SYSTEMD_NOW, MANAGER_PATH, MANAGER, "Reloading", False))
    assert box.pending(PATHS)
    box.append(props_from(SYSTEMD_NOW))  # past the capacity: lost
    assert box.pending(PATHS)
    assert box.take(PATHS) == Changes(everything=True)
    box.append(owner_changed(BUS, SYSTEMD, SYSTEMD_NOW, ":1.42"))
    assert box.pending(PATHS)
    assert box.take(PATHS) == Changes(everything=True)
    assert not box.pending(PATHS)
