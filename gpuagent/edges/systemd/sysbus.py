"""The system bus, one connection to it: connect, call with a timeout, and say in one line
what failed (jeepney, blocking; only the API jeepney 0.7 to 0.9 share).

:class:`Connection` makes the connection when first asked and keeps it until :meth:`close`;
what the bus does comes out as :class:`NotWatched` (no socket at all), :class:`Failed` (the
bus failed: ``str()`` is the line) or :class:`DBusError` (an error reply).

The connection reads the socket itself (:mod:`.wire`), not through jeepney's parser, which
parses a whole body before anyone can look at its sender: the system bus lets any user send
a message to any connection by its unique name, and one of 32 MiB of one-byte variants parsed
is ~2 GiB of Python objects.  A message is parsed (``jeepney.Message.from_buffer``) only
when it is from the bus (``org.freedesktop.DBus``), is the reply awaited, or is from a sender
:meth:`Bus.heed` names, and is of at most :data:`~.wire.MESSAGE_MAX` bytes; any other is
read in chunks and discarded unparsed.  A reply awaited that is larger is the error reply
:data:`LIMITS_EXCEEDED`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from gpuagent.edges.systemd import wire
from gpuagent.edges.systemd.wire import BUS

__all__ = [
    "BUS",
    "DEFAULT_TIMEOUT",
    "LIMITS_EXCEEDED",
    "Bus",
    "Connection",
    "DBusError",
    "Failed",
    "NotWatched",
    "Sink",
    "bus_address",
    "bus_error",
    "oserror",
    "system_bus",
]

DEFAULT_TIMEOUT = 2.0
_DEFAULT_ADDRESS = "unix:path=/var/run/dbus/system_bus_socket"
_ERROR_CHARS = 200
# The error a reply awaited over the size cap is (the specification's name for a limit hit).
LIMITS_EXCEEDED = "org.freedesktop.DBus.Error.LimitsExceeded"
# What one read from the socket takes (bytes): a skipped message goes in pieces this size.
_CHUNK = 64 * 1024


class Sink(Protocol):
    """Where jeepney puts each message a filter matches (a ``deque`` or anything else with
    ``append``: it calls nothing more)."""

    def append(self, message: Any, /) -> None: ...


class Bus(Protocol):
    """The part of ``jeepney.io.blocking.DBusConnection`` the reader uses."""

    def send_and_get_reply(self, message: Any, *, timeout: float | None = None) -> Any: ...

    def filter(self, rule: Any, *, queue: Sink | None = None) -> Any: ...

    def recv_messages(self, *, timeout: float | None = None) -> None: ...

    def fileno(self) -> int: ...

    def heed(self, sender: Callable[[str], bool]) -> None: ...

    def close(self) -> None: ...


class NotWatched(Exception):
    """No system bus socket."""


class Failed(Exception):
    """The bus failed; ``str()`` is the reason."""


class DBusError(Exception):
    """A D-Bus error reply: ``name`` and its text (:data:`LIMITS_EXCEEDED`: a reply over
    the size cap, not read)."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__(text)
        self.name = name


def bus_address() -> str:
    """``$DBUS_SYSTEM_BUS_ADDRESS``, or the system bus's standard socket."""
    return os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or _DEFAULT_ADDRESS


def system_bus(timeout: float = DEFAULT_TIMEOUT, address: str | None = None) -> Bus:
    """Connect to the system bus (``$DBUS_SYSTEM_BUS_ADDRESS`` or the standard socket).

    Raises ``FileNotFoundError`` when there is no socket, another ``OSError`` or
    ``TimeoutError`` when the bus fails.  Where the address is a path, a missing socket is
    found by one ``stat`` before any socket is made: a host without D-Bus is asked every
    tick.
    """
    from jeepney.bus import get_connectable_addresses  # noqa: PLC0415

    where = next(get_connectable_addresses(address or bus_address()))
    if not where.startswith("\0") and _missing(where):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), where)
    from jeepney import HeaderFields, Message  # noqa: PLC0415
    from jeepney.io.blocking import DBusConnection, prep_socket  # noqa: PLC0415
    from jeepney.wrappers import unwrap_msg  # noqa: PLC0415

    class _Connection(DBusConnection):  # type: ignore[misc]
        # Every read goes through _next (see the module's docstring): receive,
        # recv_messages and send_and_get_reply are jeepney's public methods, the three
        # that read. DBusConnection says Hello without a timeout: a bus that accepts and
        # then never answers would hang the agent. Every call here has one.
        def __init__(self, sock: Any) -> None:
            self._timeout = timeout
            self._heeded: Callable[[str], bool] = lambda _sender: False
            self._awaited: int | None = None
            self._framer = wire.Framer(self._keep)
            super().__init__(sock)

        def heed(self, sender: Callable[[str], bool]) -> None:
            self._heeded = sender

        def _keep(self, frame: wire.Frame, fields: dict[int, str | int]) -> bool:
            sender = fields.get(wire.SENDER)
            if sender == BUS:
                return True
            if _replies(frame, fields, self._awaited):
                return True
            return isinstance(sender, str) and self._heeded(sender)

        def _next(self, deadline: float | None) -> Any:
            """The next message (jeepney's) or :class:`wire.Skipped`; TimeoutError when
            none came by ``deadline`` (monotonic s; None: none)."""
            while True:
                got = self._framer.next()
                if isinstance(got, wire.Kept):
                    return Message.from_buffer(got.data)
                if got is not None:
                    return got
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                if not select.select([self.sock], [], [], left)[0]:
                    raise TimeoutError
                data = self.sock.recv(_CHUNK)
                if not data:
                    raise ConnectionResetError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))
                self._framer.feed(data)

        def _route(self, msg: Any) -> None:
            for handle in self._filters.matches(msg):
                handle.queue.append(msg)

        def receive(self, *, timeout: float | None = None) -> Any:
            deadline = _deadline(timeout)
            while isinstance(got := self._next(deadline), wire.Skipped):
                pass
            return got

        def recv_messages(self, *, timeout: float | None = None) -> None:
            # One message, read or skipped: a caller taking in a bounded number of them
            # is bounded by the skipped ones too.
            got = self._next(_deadline(timeout))
            if not isinstance(got, wire.Skipped):
                self._route(got)

        def send_and_get_reply(
            self, message: Any, *, timeout: float | None = None, unwrap: bool = False
        ) -> Any:
            # unwrap: jeepney 0.7 (Ubuntu 22.04) says Hello through its Proxy, which asks
            # for the body (an error reply raised); 0.8 and later unwrap in the Proxy.
            if unwrap:
                return unwrap_msg(self.send_and_get_reply(message, timeout=timeout))
            deadline = _deadline(timeout or self._timeout)
            serial = next(self.outgoing_serial)
            self._awaited = serial
            try:
                self.send(message, serial=serial)
                while True:
                    got = self._next(deadline)
                    if isinstance(got, wire.Skipped):
                        if got.fields is not None and _replies(got.frame, got.fields, serial):
                            raise _TooLarge(got.frame.size)
                    elif got.header.fields.get(HeaderFields.reply_serial) == serial:
                        return got
                    else:
                        self._route(got)
            finally:
                self._awaited = None

        def fileno(self) -> int:
            # Readable when a message came: the loop waits on it between ticks.
            return int(self.sock.fileno())

    sock = prep_socket(where, timeout=timeout)
    try:
        return cast(Bus, _Connection(sock))
    except BaseException:
        sock.close()
        raise


class _TooLarge(ValueError):
    """A reply awaited of ``size`` bytes, over :data:`~.wire.MESSAGE_MAX`: skipped."""

    def __init__(self, size: int) -> None:
        super().__init__(f"a reply of {size} bytes, over the {wire.MESSAGE_MAX}-byte cap: not read")
        self.size = size


def _replies(frame: wire.Frame, fields: dict[int, str | int], serial: int | None) -> bool:
    """Whether a message is the reply (or error) to the call of ``serial``."""
    return (
        serial is not None
        and frame.kind in (wire.METHOD_RETURN, wire.ERROR)
        and fields.get(wire.REPLY_SERIAL) == serial
    )


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _missing(path: str) -> bool:
    """Whether nothing is at ``path`` (any other answer is left for ``connect`` to give)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        pass
    return False


class Connection:
    """One connection to the bus, made by ``connect`` when first needed."""

    def __init__(self, connect: Callable[[], Bus], timeout: float) -> None:
        self.connect = connect
        self.timeout = timeout
        self.bus: Bus | None = None

    def close(self) -> None:
        """Drop the connection (the next call connects again)."""
        if self.bus is not None:
            bus, self.bus = self.bus, None
            with contextlib.suppress(OSError):
                bus.close()

    def call(self, path: str, interface: str, method: str, sig: str, body: tuple[Any, ...]) -> Any:
        """Call ``method`` of systemd's; its reply's first value."""
        from jeepney import DBusAddress, new_method_call  # noqa: PLC0415

        where = DBusAddress(path, "org.freedesktop.systemd1", interface)
        return self.send(new_method_call(where, method, sig, body))

    def send(self, msg: Any) -> Any:
        """Send ``msg`` and wait for its reply (the timeout); its first value."""
        from jeepney import HeaderFields, MessageType  # noqa: PLC0415

        bus = self.connected()
        try:
            reply = bus.send_and_get_reply(msg, timeout=self.timeout)
        except TimeoutError:
            raise Failed(f"system bus: no answer within {self.timeout:g} s") from None
        except _TooLarge as e:
            raise DBusError(LIMITS_EXCEEDED, str(e)) from None
        except (OSError, ValueError) as e:
            raise Failed(f"system bus: {oserror(e)}") from None
        if reply.header.message_type == MessageType.error:
            name = str(reply.header.fields.get(HeaderFields.error_name, "unknown error"))
            text = str(reply.body[0]) if reply.body else ""
            raise DBusError(name, text)
        return reply.body[0] if reply.body else None

    def connected(self) -> Bus:
        """The bus, connected now if it was not."""
        from jeepney.wrappers import DBusErrorResponse  # noqa: PLC0415

        if self.bus is not None:
            return self.bus
        try:
            self.bus = self.connect()
        except FileNotFoundError:
            raise NotWatched from None
        except TimeoutError:
            raise Failed(
                f"system bus ({bus_address()}): no answer within {self.timeout:g} s"
            ) from None
        except (OSError, ValueError, RuntimeError, DBusErrorResponse) as e:
            # ValueError, RuntimeError: jeepney's address parsing and authentication;
            # DBusErrorResponse: the bus refused the Hello.
            raise Failed(f"system bus ({bus_address()}): {oserror(e)}") from None
        return self.bus


def oserror(e: BaseException) -> str:
    """What failed, in one line."""
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())[:_ERROR_CHARS]


def bus_error(e: DBusError) -> str:
    """An error reply, in one line naming the system bus."""
    text = " ".join(str(e).split())[:_ERROR_CHARS]
    return f"system bus: {e.name}: {text}" if text else f"system bus: {e.name}"
