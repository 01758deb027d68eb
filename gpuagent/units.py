"""systemd units' states over the system bus (D-Bus, with jeepney), never by running systemctl.

One :class:`Units` keeps one connection to the system bus and reads, for each unit asked
about, ``LoadState``, ``ActiveState``, ``SubState``, ``Result`` and ``NRestarts``.  A unit
systemd has not loaded is loaded for the read (``LoadUnit``), so a unit that is not installed
is a fact (``LoadState`` ``not-found``), not an error.  The outcome of a read is one of:

- ``ok``: every unit's state;
- ``not_watched``: there is no system bus socket at all (a container without D-Bus);
- ``error``: a bus that is there but fails; ``error`` is one line naming the system bus.

jeepney is pure Python and blocking here; every call has a timeout, the connection's own
``Hello`` included.  Works with jeepney 0.8 (Debian 12) and 0.9 (Debian 13): only the API
the two share is used (no ``unwrap=``, no ``router``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, cast

from .nvservices import UNITS, UnitFacts

__all__ = [
    "DEFAULT_TIMEOUT",
    "Bus",
    "PidResult",
    "Result",
    "Unit",
    "Units",
    "Watch",
    "system_bus",
]

DEFAULT_TIMEOUT = 2.0
_SYSTEMD = "org.freedesktop.systemd1"
_MANAGER_PATH = "/org/freedesktop/systemd1"
_MANAGER = f"{_SYSTEMD}.Manager"
_UNIT = f"{_SYSTEMD}.Unit"
_SERVICE = f"{_SYSTEMD}.Service"
_PROPERTIES = "org.freedesktop.DBus.Properties"
_NO_SUCH_UNIT = f"{_SYSTEMD}.NoSuchUnit"
_NO_UNIT_FOR_PID = f"{_SYSTEMD}.NoUnitForPID"
_DEFAULT_ADDRESS = "unix:path=/var/run/dbus/system_bus_socket"
_ERROR_CHARS = 200

Unit = UnitFacts


class Watch(StrEnum):
    """How a read went."""

    OK = "ok"
    NOT_WATCHED = "not_watched"
    ERROR = "error"


@dataclass(frozen=True)
class Result:
    """One read: ``units`` by name when ``watch`` is ``ok``, else a one-line ``error``;
    ``duration`` the wall time it took (s)."""

    watch: Watch
    units: dict[str, Unit] = field(default_factory=dict)
    error: str = ""
    duration: float = 0.0


@dataclass(frozen=True)
class PidResult:
    """The unit a process belongs to (``unit`` None: none), or why it is not known."""

    watch: Watch
    unit: str | None = None
    error: str = ""


class Bus(Protocol):
    """The part of ``jeepney.io.blocking.DBusConnection`` the reader uses."""

    def send_and_get_reply(self, message: Any, *, timeout: float | None = None) -> Any: ...

    def close(self) -> None: ...


class _NotWatched(Exception):
    """No system bus socket."""


class _Failed(Exception):
    """The bus failed; ``str()`` is the reason."""


class _DBusError(Exception):
    """A D-Bus error reply: ``name`` and its text."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__(text)
        self.name = name


def _address() -> str:
    return os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or _DEFAULT_ADDRESS


def system_bus(timeout: float = DEFAULT_TIMEOUT, address: str | None = None) -> Bus:
    """Connect to the system bus (``$DBUS_SYSTEM_BUS_ADDRESS`` or the standard socket).

    Raises ``FileNotFoundError`` when there is no socket, another ``OSError`` or
    ``TimeoutError`` when the bus fails.
    """
    from jeepney.bus import get_connectable_addresses  # noqa: PLC0415
    from jeepney.io.blocking import DBusConnection, prep_socket  # noqa: PLC0415

    class _Connection(DBusConnection):  # type: ignore[misc]
        # DBusConnection says Hello without a timeout: a bus that accepts and then never
        # answers would hang the agent. Every call here has one.
        def __init__(self, sock: Any) -> None:
            self._timeout = timeout
            super().__init__(sock)

        def send_and_get_reply(self, message: Any, *, timeout: float | None = None) -> Any:
            return super().send_and_get_reply(message, timeout=timeout or self._timeout)

    where = next(get_connectable_addresses(address or _address()))
    sock = prep_socket(where, timeout=timeout)
    try:
        return cast(Bus, _Connection(sock))
    except BaseException:
        sock.close()
        raise


class Units:
    """Reads units' states; ``connect`` makes a :class:`Bus` (tests give their own bus)."""

    def __init__(
        self,
        connect: Callable[[], Bus] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = timeout
        self.connect = connect or (lambda: system_bus(timeout))
        self.clock = clock
        self._bus: Bus | None = None

    def close(self) -> None:
        """Drop the connection (the next read connects again)."""
        if self._bus is not None:
            bus, self._bus = self._bus, None
            with contextlib.suppress(OSError):
                bus.close()

    def read(self, names: Sequence[str] = UNITS) -> Result:
        """The states of ``names``; never raises for anything the bus does."""
        started = self.clock()
        try:
            units = {name: self._unit(name) for name in names}
        except _NotWatched:
            return Result(Watch.NOT_WATCHED, duration=self.clock() - started)
        except _Failed as e:
            self.close()
            return Result(Watch.ERROR, error=str(e), duration=self.clock() - started)
        return Result(Watch.OK, units, duration=self.clock() - started)

    def unit_for_pid(self, pid: int) -> PidResult:
        """The unit process ``pid`` belongs to (``GetUnitByPID``); None when it is in none."""
        try:
            path = self._call(_MANAGER_PATH, _MANAGER, "GetUnitByPID", "u", (pid,))
            return PidResult(Watch.OK, str(self._get(path, _UNIT, "Id")))
        except _DBusError as e:
            if e.name in (_NO_UNIT_FOR_PID, _NO_SUCH_UNIT):
                return PidResult(Watch.OK)
            self.close()
            return PidResult(Watch.ERROR, error=_bus_error(e))
        except _NotWatched:
            return PidResult(Watch.NOT_WATCHED)
        except _Failed as e:
            self.close()
            return PidResult(Watch.ERROR, error=str(e))

    def cgroup_of(self, unit: str, pid: int) -> str | None:
        """The control group of process ``pid`` in ``unit`` (``GetUnitProcesses``: systemd
        gives it where ``/proc`` is hidden), or None: not there, or the bus failed."""
        try:
            processes = self._call(_MANAGER_PATH, _MANAGER, "GetUnitProcesses", "s", (unit,))
        except (_DBusError, _NotWatched):
            return None
        except _Failed:
            self.close()
            return None
        for cgroup, member, _cmdline in processes or ():
            if int(member) == pid:
                return str(cgroup)
        return None

    def _unit(self, name: str) -> Unit:
        try:
            try:
                path = self._call(_MANAGER_PATH, _MANAGER, "GetUnit", "s", (name,))
            except _DBusError as e:
                if e.name != _NO_SUCH_UNIT:
                    raise
                # Not loaded now (never started, or unloaded when idle): loading it reads
                # its file, or says not-found. LoadUnit needs no privileges.
                path = self._call(_MANAGER_PATH, _MANAGER, "LoadUnit", "s", (name,))
            load, active, sub = (
                str(self._get(path, _UNIT, p)) for p in ("LoadState", "ActiveState", "SubState")
            )
            # Result and NRestarts are a service's; a unit not found has only defaults.
            service = load != "not-found" and name.endswith(".service")
            result = str(self._get(path, _SERVICE, "Result")) if service else ""
            restarts = int(self._get(path, _SERVICE, "NRestarts")) if service else None
        except _DBusError as e:
            raise _Failed(_bus_error(e)) from None
        return Unit(name, load, active, sub, result, restarts)

    def _get(self, path: str, interface: str, prop: str) -> Any:
        value = self._call(path, _PROPERTIES, "Get", "ss", (interface, prop))
        # A variant comes back as (signature, value).
        return value[1] if isinstance(value, tuple) else value

    def _call(self, path: str, interface: str, method: str, sig: str, body: tuple[Any, ...]) -> Any:
        from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call  # noqa: PLC0415

        bus = self._connected()
        msg = new_method_call(DBusAddress(path, _SYSTEMD, interface), method, sig, body)
        try:
            reply = bus.send_and_get_reply(msg, timeout=self.timeout)
        except TimeoutError:
            raise _Failed(f"system bus: no answer within {self.timeout:g} s") from None
        except (OSError, ValueError) as e:
            raise _Failed(f"system bus: {_oserror(e)}") from None
        if reply.header.message_type == MessageType.error:
            name = str(reply.header.fields.get(HeaderFields.error_name, "unknown error"))
            text = str(reply.body[0]) if reply.body else ""
            raise _DBusError(name, text)
        return reply.body[0] if reply.body else None

    def _connected(self) -> Bus:
        from jeepney.wrappers import DBusErrorResponse  # noqa: PLC0415

        if self._bus is not None:
            return self._bus
        try:
            self._bus = self.connect()
        except FileNotFoundError:
            raise _NotWatched from None
        except TimeoutError:
            raise _Failed(
                f"system bus ({_address()}): no answer within {self.timeout:g} s"
            ) from None
        except (OSError, ValueError, RuntimeError, DBusErrorResponse) as e:
            # ValueError, RuntimeError: jeepney's address parsing and authentication;
            # DBusErrorResponse: the bus refused the Hello.
            raise _Failed(f"system bus ({_address()}): {_oserror(e)}") from None
        return self._bus


def _oserror(e: BaseException) -> str:
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())[:_ERROR_CHARS]


def _bus_error(e: _DBusError) -> str:
    text = " ".join(str(e).split())[:_ERROR_CHARS]
    return f"system bus: {e.name}: {text}" if text else f"system bus: {e.name}"
