"""D-Bus messages as bytes on the connection (pure: no I/O): split the stream into messages
and look at a message's header before its body is read, so that what another sender sends
is skipped unparsed and costs a bounded amount whatever its size.

A message is a fixed 16-byte part (endianness, type, flags, version, body length, serial,
header fields length), the header fields (an array of ``(code, variant)``), padding to 8
and the body (the D-Bus specification, "Message Format").  :class:`Framer` is fed the bytes
as they come and hands out each message either whole (:class:`Kept`, when ``keep`` says so
of its header) or as :class:`Skipped` (its bytes discarded as they come, never held).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "BUS",
    "ERROR",
    "FIELDS_MAX",
    "FIXED",
    "MESSAGE_MAX",
    "METHOD_RETURN",
    "REPLY_SERIAL",
    "SENDER",
    "SIGNAL",
    "Frame",
    "Framer",
    "Kept",
    "Malformed",
    "Skipped",
    "fields",
    "frame",
]

# The bus itself: the sender of its replies and signals, a name no client can take.
BUS = "org.freedesktop.DBus"
FIXED = 16
# The header fields the bus and systemd send are a path, an interface, a member, an error
# name, a destination, a sender and a signature: each a few hundred bytes at most (a name is
# at most 255, a unit's escaped object path under 1 KiB).  More is no one's the agent reads.
FIELDS_MAX = 16 * 1024
# The largest message whose body is read.  What the agent asks systemd for comes back in a few
# hundred bytes (an object path, one property, ``ListUnitsByPatterns`` of the three units it
# watches), or as one unit's processes (``GetUnitProcesses``: a cgroup path and a command line
# each, tens of KiB for a job step); systemd's signals carry one unit's changed properties.
# 1 MiB is far above all of them and bounds what parsing one costs (a body of one-byte
# variants is ~70 bytes of Python objects a byte: ~70 MiB, under the unit's MemoryMax).
MESSAGE_MAX = 1024 * 1024
# Message types and header field codes (the specification's).
METHOD_RETURN, ERROR, SIGNAL = 2, 3, 4
_PATH, _INTERFACE, _MEMBER, _ERROR_NAME = 1, 2, 3, 4
REPLY_SERIAL, _DESTINATION, SENDER, _SIGNATURE, _UNIX_FDS = 5, 6, 7, 8, 9
_SIGNATURES = {
    _PATH: "o",
    _INTERFACE: "s",
    _MEMBER: "s",
    _ERROR_NAME: "s",
    REPLY_SERIAL: "u",
    _DESTINATION: "s",
    SENDER: "s",
    _SIGNATURE: "g",
    _UNIX_FDS: "u",
}
_ENDIAN = {ord("l"): "<", ord("B"): ">"}


class Malformed(ValueError):
    """Bytes that are no D-Bus message (the stream cannot be followed past them)."""


@dataclass(frozen=True)
class Frame:
    """A message's fixed part: its byte order (``<`` or ``>``), type, serial, its header's
    end (16 + the header fields' length, bytes) and its whole size (bytes)."""

    order: str
    kind: int
    serial: int
    fields_end: int
    size: int


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def frame(fixed: bytes | bytearray) -> Frame:
    """The fixed part of a message (its first :data:`FIXED` bytes, or more).

    Raises :class:`Malformed` for an unknown byte order, type or protocol version, or fewer
    than 16 bytes."""
    if len(fixed) < FIXED:
        raise Malformed(f"a message header of {len(fixed)} bytes (16 at least)")
    order = _ENDIAN.get(fixed[0])
    if order is None:
        raise Malformed(f"byte order {fixed[0]:#04x} is neither 'l' nor 'B'")
    kind, version = fixed[1], fixed[3]
    if not 1 <= kind <= 4 or version != 1:
        raise Malformed(f"message type {kind}, protocol version {version}")
    body, serial, length = struct.unpack_from(order + "III", fixed, 4)
    end = FIXED + length
    return Frame(order, kind, serial, end, _pad8(end) + body)


def fields(header: bytes | bytearray, f: Frame) -> dict[int, str | int] | None:
    """The header fields of a message whose first ``f.fields_end`` bytes are ``header``:
    by code, each a str (path, names, signature) or an int (serials, fd count); None when
    they are over :data:`FIELDS_MAX` or not as the specification gives each (an unknown code
    or signature, a length past the end), which no bus sends the agent.

    Raises :class:`Malformed` when ``header`` is shorter than ``f.fields_end``."""
    if len(header) < f.fields_end:
        raise Malformed(f"{len(header)} bytes of a {f.fields_end}-byte header")
    if f.fields_end - FIXED > FIELDS_MAX:
        return None
    out: dict[int, str | int] = {}
    pos = FIXED
    try:
        while pos < f.fields_end:
            pos = _pad8(pos)
            code, n = header[pos], header[pos + 1]
            sig = bytes(header[pos + 2 : pos + 2 + n]).decode("ascii")
            pos += 3 + n
            if _SIGNATURES.get(code) != sig:
                return None
            value, pos = _value(header, pos, sig, f.order)
            out[code] = value
    except (IndexError, UnicodeDecodeError, struct.error):
        return None
    return out if pos == f.fields_end else None


def _value(buf: bytes | bytearray, pos: int, sig: str, order: str) -> tuple[str | int, int]:
    if sig == "g":
        n = buf[pos]
        return bytes(buf[pos + 1 : pos + 1 + n]).decode(), pos + 2 + n
    pos = (pos + 3) & ~3
    (n,) = struct.unpack_from(order + "I", buf, pos)
    if sig == "u":
        return n, pos + 4
    end = pos + 4 + n
    if end >= len(buf) or buf[end] != 0:
        raise IndexError("a string past the header's end")
    return bytes(buf[pos + 4 : end]).decode(), end + 1


@dataclass(frozen=True)
class Kept:
    """A whole message, its bytes (for ``jeepney.Message.from_buffer``)."""

    data: bytes


@dataclass(frozen=True)
class Skipped:
    """A message not read: its fixed part and header fields (None: not read either)."""

    frame: Frame
    fields: dict[int, str | int] | None


class Framer:
    """Splits the bytes of a connection into messages; ``keep`` says, of a message's fixed
    part and header fields, whether to read its body (only one of at most
    :data:`MESSAGE_MAX` bytes is); :attr:`skipped` counts the bytes of the messages
    skipped.  What it holds is at most the message it is reading:
    :data:`MESSAGE_MAX`, or :data:`FIELDS_MAX` of a header, plus one :meth:`feed`."""

    def __init__(self, keep: Callable[[Frame, dict[int, str | int]], bool]) -> None:
        self.keep = keep
        self._buf = bytearray()
        # Bytes of a skipped message still to come, discarded as they do.
        self._skip = 0
        self.skipped = 0

    @property
    def held(self) -> int:
        """The bytes held now."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        """Bytes as they came on the connection."""
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
        self._buf += data

    def next(self) -> Kept | Skipped | None:
        """The next message, when enough has come to say (None: feed more).

        Raises :class:`Malformed` for bytes that are no message."""
        buf = self._buf
        if self._skip or len(buf) < FIXED:
            return None
        f = frame(buf)
        if f.fields_end - FIXED > FIELDS_MAX:
            return self._skipped(f, None)
        if len(buf) < f.fields_end:
            return None
        found = fields(buf[: f.fields_end], f)
        if found is None or f.size > MESSAGE_MAX or not self.keep(f, found):
            return self._skipped(f, found)
        if len(buf) < f.size:
            return None
        data = bytes(buf[: f.size])
        del buf[: f.size]
        return Kept(data)

    def _skipped(self, f: Frame, found: dict[int, str | int] | None) -> Skipped:
        n = min(f.size, len(self._buf))
        del self._buf[:n]
        self.skipped += f.size
        self._skip = f.size - n
        return Skipped(f, found)
