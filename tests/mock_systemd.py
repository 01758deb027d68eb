"""A python-dbusmock template of the part of systemd's org.freedesktop.systemd1 that
gpuagent.edges.systemd.units reads: Subscribe, GetUnit, LoadUnit, GetUnitByPID, GetUnitProcesses,
and units with the Unit and Service interfaces' LoadState, ActiveState, SubState, Id, Result and
NRestarts, and the signals that say a unit changed.

As systemd does: GetUnit fails with NoSuchUnit for a unit that is not loaded now, LoadUnit
loads any name (LoadState not-found when there is no such unit file), GetUnitByPID fails
with NoUnitForPID; a unit that changes sends PropertiesChanged on its path, one per
interface, except a unit just loaded, which sends the Manager's UnitNew instead (a unit
unloaded, UnitRemoved).  Unlike systemd it sends them whether or not anyone subscribed, and
before the reply to the call that caused them.  Parameters: ``{"units": {name: {prop:
value, ..., "loaded": bool}}, "pids": {"1234": name}, "cgroups": {"1234": path},
"cmdlines": {"1234": text}, "refuse_subscribe": bool}`` (``cgroups`` and ``cmdlines``: the
control group and command line GetUnitProcesses lists for a PID; the unit's own group and
an empty line without one); ``SetUnit(name, props, loaded)`` on the mock interface
changes a unit while it runs (``SetUnitSilently(name, props)`` without a signal: one lost).
"""

from __future__ import annotations

import fnmatch
from typing import Any

import dbus
import dbus.service
from dbusmock import MOCK_IFACE, mockobject

BUS_NAME = "org.freedesktop.systemd1"
MAIN_OBJ = "/org/freedesktop/systemd1"
MAIN_IFACE = "org.freedesktop.systemd1.Manager"
SYSTEM_BUS = True
UNIT_IFACE = "org.freedesktop.systemd1.Unit"
SERVICE_IFACE = "org.freedesktop.systemd1.Service"
_DEFAULTS = {
    "LoadState": "not-found",
    "ActiveState": "inactive",
    "SubState": "dead",
    "Result": "success",
    "NRestarts": 0,
    "UnitFileState": "disabled",
    # µs: when it last became active (wall clock), when it last left the active state (since
    # boot; 0: never).
    "ActiveEnterTimestamp": 0,
    "ActiveExitTimestampMonotonic": 0,
}


def _path(name: str) -> str:
    return f"{MAIN_OBJ}/unit/" + "".join(c if c.isalnum() else f"_{ord(c):02x}" for c in name)


def _set(mock: Any, name: str, props: dict[str, Any], loaded: bool) -> str:
    path = _path(name)
    values = {**_DEFAULTS, **props}
    unit = {
        "Id": dbus.String(name),
        **{
            k: dbus.String(values[k])
            for k in ("LoadState", "ActiveState", "SubState", "UnitFileState")
        },
        **{
            k: dbus.UInt64(values[k])
            for k in ("ActiveEnterTimestamp", "ActiveExitTimestampMonotonic")
        },
    }
    service = {
        "Result": dbus.String(values["Result"]),
        "NRestarts": dbus.UInt32(values["NRestarts"]),
    }
    was_loaded = name in mock.loaded_units
    if path not in mockobject.objects:
        mock.AddObject(path, UNIT_IFACE, unit, [])
        mockobject.objects[path].AddProperties(SERVICE_IFACE, service)
    elif loaded and not was_loaded:
        # Loaded now: systemd's first word of it is UnitNew, not PropertiesChanged.
        mockobject.objects[path].props[UNIT_IFACE].update(unit)
        mockobject.objects[path].props[SERVICE_IFACE].update(service)
    else:
        mockobject.objects[path].UpdateProperties(UNIT_IFACE, unit)
        mockobject.objects[path].UpdateProperties(SERVICE_IFACE, service)
    if loaded:
        mock.loaded_units.add(name)
    else:
        mock.loaded_units.discard(name)
    if loaded != was_loaded:
        member = "UnitNew" if loaded else "UnitRemoved"
        mock.EmitSignal(MAIN_IFACE, member, "so", [dbus.String(name), dbus.ObjectPath(path)])
    return path


def load(mock: Any, parameters: dict[str, Any]) -> None:
    mock.loaded_units = set()
    mock.refuse_subscribe = bool(parameters.get("refuse_subscribe", False))
    mock.pids = {int(pid): str(name) for pid, name in parameters.get("pids", {}).items()}
    mock.cgroups = {int(pid): str(cg) for pid, cg in parameters.get("cgroups", {}).items()}
    mock.cmdlines = {int(pid): str(c) for pid, c in parameters.get("cmdlines", {}).items()}
    for name, given in parameters.get("units", {}).items():
        props = dict(given)
        loaded = bool(props.pop("loaded", True))
        _set(mock, str(name), props, loaded)


def _error(name: str, text: str) -> dbus.exceptions.DBusException:
    return dbus.exceptions.DBusException(text, name=f"org.freedesktop.systemd1.{name}")


@dbus.service.method(MAIN_IFACE, in_signature="", out_signature="")  # type: ignore[untyped-decorator]
def Subscribe(self: Any) -> None:
    if self.refuse_subscribe:
        raise dbus.exceptions.DBusException(
            "Access denied", name="org.freedesktop.DBus.Error.AccessDenied"
        )


@dbus.service.method(MAIN_IFACE, in_signature="s", out_signature="o")  # type: ignore[untyped-decorator]
def GetUnit(self: Any, name: str) -> str:
    if str(name) not in self.loaded_units:
        raise _error("NoSuchUnit", f"Unit {name} not loaded.")
    return _path(str(name))


@dbus.service.method(MAIN_IFACE, in_signature="s", out_signature="o")  # type: ignore[untyped-decorator]
def LoadUnit(self: Any, name: str) -> str:
    path = _path(str(name))
    if path not in mockobject.objects:
        return _set(self, str(name), {}, True)
    if str(name) not in self.loaded_units:
        self.loaded_units.add(str(name))
        self.EmitSignal(MAIN_IFACE, "UnitNew", "so", [dbus.String(name), dbus.ObjectPath(path)])
    return path


@dbus.service.method(MAIN_IFACE, in_signature="u", out_signature="o")  # type: ignore[untyped-decorator]
def GetUnitByPID(self: Any, pid: int) -> str:
    name = self.pids.get(int(pid))
    if name is None:
        raise _error("NoUnitForPID", f"PID {pid} does not belong to any loaded unit.")
    return _path(name)


@dbus.service.method(MAIN_IFACE, in_signature="s", out_signature="a(sus)")  # type: ignore[untyped-decorator]
def GetUnitProcesses(self: Any, name: str) -> list[tuple[str, int, str]]:
    if str(name) not in self.loaded_units and not any(n == name for n in self.pids.values()):
        raise _error("NoSuchUnit", f"Unit {name} not loaded.")
    return [
        (
            self.cgroups.get(pid, f"/system.slice/{name}"),
            dbus.UInt32(pid),
            self.cmdlines.get(pid, ""),
        )
        for pid, unit in sorted(self.pids.items())
        if unit == str(name)
    ]


@dbus.service.method(MAIN_IFACE, in_signature="asas", out_signature="a(ssssssouso)")  # type: ignore[untyped-decorator]
def ListUnitsByPatterns(self: Any, states: list[str], patterns: list[str]) -> list[Any]:
    # As systemd: the loaded units only (it loads none), by name pattern (and state).
    out = []
    for name in sorted(self.loaded_units):
        if patterns and not any(fnmatch.fnmatchcase(name, str(p)) for p in patterns):
            continue
        props = mockobject.objects[_path(name)].props[UNIT_IFACE]
        load, active, sub = (str(props[k]) for k in ("LoadState", "ActiveState", "SubState"))
        if states and not {load, active, sub} & {str(x) for x in states}:
            continue
        row = (name, "", load, active, sub, "", dbus.ObjectPath(_path(name)), dbus.UInt32(0))
        out.append((*row, "", dbus.ObjectPath("/")))
    return out


@dbus.service.method(MOCK_IFACE, in_signature="sa{sv}")  # type: ignore[untyped-decorator]
def SetUnitSilently(self: Any, name: str, props: dict[str, Any]) -> None:
    # A change whose signal is lost: the properties change, nothing is sent.
    obj = mockobject.objects[_path(str(name))]
    for key, value in props.items():
        iface = SERVICE_IFACE if str(key) in ("Result", "NRestarts") else UNIT_IFACE
        obj.props[iface][str(key)] = value


@dbus.service.method(MOCK_IFACE, in_signature="sa{sv}b")  # type: ignore[untyped-decorator]
def SetUnit(self: Any, name: str, props: dict[str, Any], loaded: bool) -> None:
    _set(self, str(name), {str(k): v for k, v in props.items()}, bool(loaded))
