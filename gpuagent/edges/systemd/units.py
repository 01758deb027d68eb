"""systemd units' states over the system bus (D-Bus, with jeepney), never by running systemctl.

One :class:`Units` keeps one connection to the system bus and reads, for each unit asked
about, ``LoadState``, ``ActiveState``, ``SubState``, ``Result`` and ``NRestarts`` (and, for
the fabric manager, whether it runs again after a stop this boot: :meth:`Units._rerun`).  A unit
systemd has not loaded is loaded for the read (``LoadUnit``), so a unit that is not installed
is a fact (``LoadState`` ``not-found``), not an error.  The outcome of a read is one of:

- ``ok``: every unit's state;
- ``not_watched``: there is no system bus socket at all (a container without D-Bus);
- ``error``: a bus that is there but fails; ``error`` is one line naming the system bus.

Read by read, it follows systemd's signals instead of asking again (``full_every`` s, by
default): the first read on a connection calls ``Subscribe()`` and adds the bus's match
rules for each unit (:mod:`gpuagent.edges.systemd.unitsignals`) before it reads them all; a later
read takes in, without waiting, the signals that came since, and asks again only about the units
they name, so a read when nothing changed makes no call.  After a ``daemon-reload``, after systemd's
name changed owner and on every new connection it reads them all again; every ``full_every`` s one
call (``ListUnitsByPatterns``) checks the states the signals left, and a unit that differs is read
again (a safety net for a signal lost); ``full_every`` None, or a bus that refuses the subscription,
reads them all every time.

Only systemd's signals count: their sender is systemd's unique name (asked of the bus, and
followed); anyone else's are skipped as they come in, their bodies never parsed, whatever
their size (:meth:`~gpuagent.edges.systemd.sysbus.Bus.heed`).  What is held of systemd's is
bounded (:data:`_SIGNALS_MAX`: past it, the next read reads every unit again, as after a
signal lost), and so is what one read takes in from the connection (:data:`_MESSAGES_MAX`
messages, anyone's, skipped or not: a flood leaves the rest to the next read).

jeepney is pure Python and blocking here (:mod:`gpuagent.edges.systemd.sysbus`); every call has a
timeout, the connection's own ``Hello`` included, and taking the signals in never waits; ``ping``
(the watchdog's) is called before each call and between the messages taken in, so a systemd slow to
answer (each call up to the timeout) never starves the watchdog.  Works with jeepney 0.7 (Ubuntu
22.04), 0.8 (Debian 12) and 0.9 (Debian 13): only the API they share is used (no ``router``;
``filter`` and ``recv_messages``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from gpuagent.compat import StrEnum
from gpuagent.edges.systemd import unitsignals
from gpuagent.edges.systemd.sysbus import (
    DEFAULT_TIMEOUT,
    Bus,
    Connection,
    DBusError,
    Failed,
    NotWatched,
    system_bus,
)
from gpuagent.edges.systemd.sysbus import bus_error as _bus_error
from gpuagent.edges.systemd.sysbus import oserror as _oserror
from gpuagent.edges.systemd.unitsignals import MANAGER as _MANAGER
from gpuagent.edges.systemd.unitsignals import MANAGER_PATH as _MANAGER_PATH
from gpuagent.edges.systemd.unitsignals import PROPERTIES as _PROPERTIES
from gpuagent.sources.services.nvservices import RERUN_MATTERS, UNITS, UnitFacts

__all__ = [
    "DEFAULT_TIMEOUT",
    "FULL_EVERY",
    "Bus",
    "PidResult",
    "Result",
    "Unit",
    "UnitProcess",
    "Units",
    "Watch",
    "system_bus",
]

# How often every unit is read again whatever the signals said (s): issue 16's NVLink cadence.
FULL_EVERY = 60.0
# The most of systemd's signals held between reads; more, and a read reads every unit again.
_SIGNALS_MAX = 256
# The most messages one read takes in from the connection (anyone's): the rest wait.
_MESSAGES_MAX = 4096
_SYSTEMD = unitsignals.SYSTEMD
_UNIT = f"{_SYSTEMD}.Unit"
_SERVICE = f"{_SYSTEMD}.Service"
_NO_SUCH_UNIT = f"{_SYSTEMD}.NoSuchUnit"
_NO_UNIT_FOR_PID = f"{_SYSTEMD}.NoUnitForPID"
_UNKNOWN_METHOD = "org.freedesktop.DBus.Error.UnknownMethod"

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


@dataclass(frozen=True)
class UnitProcess:
    """A process as systemd lists it in its unit: its control group (a path under the
    cgroup tree's root) and its command line (systemd's: the arguments joined by spaces, each
    quoted where it needs it; ``[comm]`` for a process without one)."""

    cgroup: str
    cmdline: str


@dataclass
class _Follow:
    """One connection's signals: those jeepney filtered in (``inbox``), the units matched
    (object path → name), the last read of each and when all were last read."""

    inbox: unitsignals.Inbox
    enabled: bool = False
    paths: dict[str, str] = field(default_factory=dict)
    units: dict[str, UnitFacts] = field(default_factory=dict)
    full_at: float | None = None


class Units:
    """Reads units' states; ``connect`` makes a :class:`Bus` (tests give their own bus);
    ``full_every`` (s) how often to read them all whatever the signals say (None: always);
    ``ping`` is called before each bus call and while signals are taken in (the watchdog's
    ``ping_if_due``: it must be cheap when not due)."""

    def __init__(
        self,
        connect: Callable[[], Bus] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        full_every: float | None = FULL_EVERY,
        ping: Callable[[], None] = lambda: None,
    ) -> None:
        self.timeout = timeout
        self.ping = ping
        self.clock = clock
        self.full_every = full_every
        self.connection = Connection(connect or (lambda: system_bus(timeout)), timeout)
        self._follow: _Follow | None = None

    def close(self) -> None:
        """Drop the connection (the next read connects again, and reads every unit)."""
        self._follow = None
        self.connection.close()

    def read(self, names: Sequence[str] = UNITS) -> Result:
        """The states of ``names``; never raises for anything the bus does."""
        started = self.clock()
        try:
            units = self._read(tuple(names), started)
        except NotWatched:
            return Result(Watch.NOT_WATCHED, duration=self.clock() - started)
        except (Failed, DBusError) as e:
            # An error reply (systemd not on the bus, a policy) fails the read as a bus would.
            self.close()
            error = _bus_error(e) if isinstance(e, DBusError) else str(e)
            return Result(Watch.ERROR, error=error, duration=self.clock() - started)
        return Result(Watch.OK, units, duration=self.clock() - started)

    def _read(self, names: tuple[str, ...], now: float) -> dict[str, Unit]:
        follow = self._following()
        if follow is None:
            return {name: self._unit(name) for name in names}
        changes = self._take_signals(follow)
        if (
            changes.everything
            or follow.full_at is None
            or not all(name in follow.units for name in names)
        ):
            follow.units.update({name: self._unit(name, follow) for name in names})
            follow.full_at = now
            return {name: follow.units[name] for name in names}
        again = changes.names.intersection(names)
        if now - follow.full_at >= cast(float, self.full_every):
            follow.full_at = now
            again |= self._drifted(names, follow.units)
        for name in again:
            follow.units[name] = self._again(name, follow.units[name])
        return {name: follow.units[name] for name in names}

    def _drifted(self, names: tuple[str, ...], held: dict[str, Unit]) -> set[str]:
        """The safety net for a lost signal, in one call: the units whose state systemd lists
        (``ListUnitsByPatterns``, which loads nothing: a unit not loaded is not listed) other
        than the signals left it, to be read again; all of them where systemd has no such
        method (before 230)."""
        try:
            rows = self._call(
                _MANAGER_PATH, _MANAGER, "ListUnitsByPatterns", "asas", ([], list(names))
            )
        except DBusError as e:
            if e.name == _UNKNOWN_METHOD:
                return set(names)
            raise
        listed = {str(r[0]): (str(r[2]), str(r[3]), str(r[4])) for r in rows or ()}
        out = set()
        for name in names:
            u = held[name]
            if name in listed:
                if listed[name] != (u.load_state, u.active_state, u.sub_state):
                    out.add(name)
            elif (u.active_state, u.sub_state) != ("inactive", "dead"):
                out.add(name)  # unloaded since, a stopped unit
        return out

    def _following(self) -> _Follow | None:
        """This connection's signals, subscribed on its first read; None: read everything."""
        bus = self.connection.connected()
        if self._follow is None and self.full_every is not None:
            self._follow = _Follow(unitsignals.Inbox(_SIGNALS_MAX))
            from jeepney import MatchRule  # noqa: PLC0415
            from jeepney.bus_messages import message_bus  # noqa: PLC0415

            # Every signal the bus delivers (those the rules ask for, the bus's own, and any
            # sent to this connection by name): jeepney hands those that come in while it
            # waits for a reply to the inbox, which keeps systemd's only.
            inbox = self._follow.inbox
            # systemd's messages are read, anyone else's skipped unparsed (the bus's are).
            bus.heed(lambda sender: sender == inbox.owner)
            queued = bus.filter(MatchRule(type="signal"), queue=inbox)
            try:
                self._call(_MANAGER_PATH, _MANAGER, "Subscribe", "", ())
            except DBusError:
                # Refused: every read reads everything, as without signals, and nothing
                # queues the signals no read would take in.
                queued.close()
                inbox.clear()
            else:
                # The owner's changes are followed before it is asked: none falls between.
                self._match(unitsignals.OWNER)
                self.ping()
                inbox.owner = str(self.connection.send(message_bus.GetNameOwner(_SYSTEMD)))
                self._match(unitsignals.RELOADING)
                self._follow.enabled = True
        follow = self._follow
        return follow if follow is not None and follow.enabled else None

    def fileno(self) -> int | None:
        """The connection's descriptor, readable when a signal came, while the signals are
        followed (``None``: not connected, or every read reads every unit)."""
        follow, bus = self._follow, self.connection.bus
        if follow is None or not follow.enabled or bus is None:
            return None
        return bus.fileno()

    def news(self) -> bool:
        """Take in, without waiting, what came on the connection; whether a watched unit
        changed (or any may have: the next read looks), or the bus failed (the next read
        says how)."""
        follow, bus = self._follow, self.connection.bus
        if follow is None or not follow.enabled or bus is None:
            return False
        try:
            self._take_in(bus)
        except Failed:
            return True
        return follow.inbox.pending(follow.paths)

    def _take_signals(self, follow: _Follow) -> unitsignals.Changes:
        """What the signals that came since the last read say, without waiting for any."""
        self._take_in(self.connection.connected())
        return follow.inbox.take(follow.paths)

    def _take_in(self, bus: Bus) -> None:
        """The messages that came on ``bus`` (at most _MESSAGES_MAX), into the inbox."""
        for _ in range(_MESSAGES_MAX):
            self.ping()
            try:
                bus.recv_messages(timeout=0)
            except TimeoutError:
                break
            except (OSError, ValueError) as e:
                raise Failed(f"system bus: {_oserror(e)}") from None

    def _match(self, rule: str) -> None:
        from jeepney.bus_messages import message_bus  # noqa: PLC0415

        self.ping()
        self.connection.send(message_bus.AddMatch(rule))

    def unit_for_pid(self, pid: int) -> PidResult:
        """The unit process ``pid`` belongs to (``GetUnitByPID``); None when it is in none."""
        try:
            path = self._call(_MANAGER_PATH, _MANAGER, "GetUnitByPID", "u", (pid,))
            return PidResult(Watch.OK, str(self._get(path, _UNIT, "Id")))
        except DBusError as e:
            if e.name in (_NO_UNIT_FOR_PID, _NO_SUCH_UNIT):
                return PidResult(Watch.OK)
            self.close()
            return PidResult(Watch.ERROR, error=_bus_error(e))
        except NotWatched:
            return PidResult(Watch.NOT_WATCHED)
        except Failed as e:
            self.close()
            return PidResult(Watch.ERROR, error=str(e))

    def process_in(self, unit: str, pid: int) -> UnitProcess | None:
        """Process ``pid`` as systemd lists it in ``unit`` (``GetUnitProcesses``: systemd
        gives its control group and command line where ``/proc`` is hidden), or None: not
        there, or the bus failed."""
        try:
            processes = self._call(_MANAGER_PATH, _MANAGER, "GetUnitProcesses", "s", (unit,))
        except (DBusError, NotWatched):
            return None
        except Failed:
            self.close()
            return None
        for cgroup, member, cmdline in processes or ():
            if int(member) == pid:
                return UnitProcess(str(cgroup), str(cmdline))
        return None

    def _unit(self, name: str, follow: _Follow | None = None) -> Unit:
        """Read ``name``, loading it if systemd has not; ``follow``: match its signals first."""
        path = self._loaded(name)
        if path is None:
            # Not loaded now (never started, or unloaded when idle): loading it reads its
            # file, or says not-found. LoadUnit needs no privileges.
            path = str(self._call(_MANAGER_PATH, _MANAGER, "LoadUnit", "s", (name,)))
        if follow is not None and path not in follow.paths:
            # Before its properties are read: a change after the read is a signal.
            for rule in unitsignals.rules(name, path):
                self._match(rule)
            follow.paths[path] = name
        return self._properties(name, path)

    def _again(self, name: str, last: Unit) -> Unit:
        """Read ``name`` again after a signal, never loading it: loading an idle unit would
        have systemd unload it again, and say so.  Not loaded (unloaded since) is stopped."""
        path = self._loaded(name)
        if path is None:
            return replace(last, active_state="inactive", sub_state="dead")
        return self._properties(name, path)

    def _loaded(self, name: str) -> str | None:
        """The object path of ``name`` while systemd has it loaded, else None."""
        try:
            return str(self._call(_MANAGER_PATH, _MANAGER, "GetUnit", "s", (name,)))
        except DBusError as e:
            if e.name == _NO_SUCH_UNIT:
                return None
            raise

    def _properties(self, name: str, path: str) -> Unit:
        load, active, sub = (
            str(self._get(path, _UNIT, p)) for p in ("LoadState", "ActiveState", "SubState")
        )
        # Result and NRestarts are a service's; a unit not found has only defaults.
        service = load != "not-found" and name.endswith(".service")
        result = str(self._get(path, _SERVICE, "Result")) if service else ""
        restarts = int(self._get(path, _SERVICE, "NRestarts")) if service else None
        # Whether the host means to run it (nvidia-imex: enabled where IMEX is used).
        enabled = str(self._get(path, _UNIT, "UnitFileState")) if load != "not-found" else ""
        return Unit(name, load, active, sub, result, restarts, enabled, self._rerun(name, path))

    def _rerun(self, name: str, path: str) -> float | None:
        """When a unit whose restart matters (:data:`RERUN_MATTERS`) became active again
        after it had left the active state earlier this boot (wall s, from
        ``ActiveEnterTimestamp``), or None: it never left it (``ActiveExitTimestampMonotonic``
        0, the unit's first start this boot)."""
        if name not in RERUN_MATTERS:
            return None
        if int(self._get(path, _UNIT, "ActiveExitTimestampMonotonic")) == 0:
            return None
        entered = int(self._get(path, _UNIT, "ActiveEnterTimestamp"))
        return entered / 1e6 if entered else None

    def _get(self, path: str, interface: str, prop: str) -> Any:
        value = self._call(path, _PROPERTIES, "Get", "ss", (interface, prop))
        # A variant comes back as (signature, value).
        return value[1] if isinstance(value, tuple) else value

    def _call(self, path: str, interface: str, method: str, sig: str, body: tuple[Any, ...]) -> Any:
        self.ping()
        return self.connection.call(path, interface, method, sig, body)
