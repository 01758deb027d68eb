"""gpuagent.unitsignals: which of systemd's signals name a watched unit (pure)."""

from __future__ import annotations

from gpuagent.unitsignals import (
    MANAGER,
    MANAGER_PATH,
    PROPERTIES,
    RELOADING,
    Changes,
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


def test_the_rules_never_name_the_sender() -> None:
    assert rules(FM, FM_PATH) == [
        "type='signal',interface='org.freedesktop.DBus.Properties',"
        f"member='PropertiesChanged',path='{FM_PATH}'",
        "type='signal',interface='org.freedesktop.systemd1.Manager',member='UnitNew',"
        f"path='/org/freedesktop/systemd1',arg0='{FM}'",
    ]
    assert RELOADING == (
        "type='signal',interface='org.freedesktop.systemd1.Manager',member='Reloading',"
        "path='/org/freedesktop/systemd1'"
    )
    assert all("sender" not in r for r in [*rules(FM, FM_PATH), RELOADING])
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
