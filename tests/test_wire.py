"""gpuagent.edges.systemd.wire: D-Bus messages split from the bytes of a connection and looked
at before their bodies are read (pure), on messages jeepney serialises and on crafted bytes."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from gpuagent.edges.systemd import wire
from gpuagent.edges.systemd.wire import (
    FIELDS_MAX,
    MESSAGE_MAX,
    SENDER,
    Frame,
    Framer,
    Kept,
    Malformed,
    Skipped,
    fields,
    frame,
)

SYSTEMD = ":1.5"
OTHER = ":1.666"


def signal(sender: str, big: bool = False, body: tuple[Any, ...] = ("a", 7)) -> bytes:
    """A signal from ``sender`` serialised by jeepney (``big``: big-endian)."""
    from jeepney import DBusAddress, Endianness, HeaderFields, new_signal  # noqa: PLC0415

    msg = new_signal(DBusAddress("/org/x", interface="org.x.I"), "Changed", "su", body)
    msg.header.fields[HeaderFields.sender] = sender
    if big:
        msg.header.endianness = Endianness.big
    return bytes(msg.serialise(serial=9))


def from_systemd(_frame: Frame, found: dict[int, str | int]) -> bool:
    return found.get(SENDER) == SYSTEMD


def split(data: bytes, chunk: int) -> list[Kept | Skipped]:
    """What a framer keeping systemd's makes of ``data`` fed ``chunk`` bytes at a time."""
    framer = Framer(from_systemd)
    out: list[Kept | Skipped] = []
    for i in range(0, len(data), chunk):
        framer.feed(data[i : i + chunk])
        while (got := framer.next()) is not None:
            out.append(got)
    assert framer.held == 0
    return out


@pytest.mark.parametrize("big", [False, True])
def test_the_fixed_part_and_the_fields_in_either_byte_order(big: bool) -> None:
    from jeepney import Message  # noqa: PLC0415

    data = signal(SYSTEMD, big)
    f = frame(data[:16])
    assert (f.order, f.kind, f.serial, f.size) == (">" if big else "<", wire.SIGNAL, 9, len(data))
    assert fields(data[: f.fields_end], f) == {
        1: "/org/x",
        2: "org.x.I",
        3: "Changed",
        7: SYSTEMD,
        8: "su",
    }
    (kept,) = split(data, 4096)
    assert isinstance(kept, Kept)
    assert Message.from_buffer(kept.data).body == ("a", 7)


@pytest.mark.parametrize("chunk", [1, 7, 16, 100, 1 << 20])
def test_any_split_of_the_bytes_gives_the_same_messages(chunk: int) -> None:
    stream = signal(OTHER) + signal(SYSTEMD, True) + signal(OTHER, True) + signal(SYSTEMD)
    got = split(stream, chunk)
    assert [type(g) for g in got] == [Skipped, Kept, Skipped, Kept]
    assert [g.data for g in got if isinstance(g, Kept)] == [signal(SYSTEMD, True), signal(SYSTEMD)]
    skipped = [g for g in got if isinstance(g, Skipped)]
    assert all(g.fields is not None and g.fields[SENDER] == OTHER for g in skipped)


def test_a_truncated_message_waits_for_the_rest() -> None:
    data = signal(SYSTEMD)
    framer = Framer(from_systemd)
    for cut in (3, 15, 16, 40, len(data) - 1):
        framer = Framer(from_systemd)
        framer.feed(data[:cut])
        assert framer.next() is None
    framer.feed(data[len(data) - 1 :])
    assert framer.next() == Kept(data)
    with pytest.raises(Malformed):
        frame(data[:15])
    f = frame(data)
    with pytest.raises(Malformed):
        fields(data[: f.fields_end - 1], f)


def _crafted(fields_length: int, body_length: int, order: bytes = b"l") -> bytes:
    code = "<" if order == b"l" else ">"
    return (
        order
        + bytes([wire.SIGNAL, 0, 1])
        + struct.pack(code + "III", body_length, 3, fields_length)
    )


def test_header_fields_over_the_cap_are_skipped_unread_as_they_come() -> None:
    length = FIELDS_MAX + 8
    framer = Framer(lambda _f, _found: True)
    framer.feed(_crafted(length, 40 << 20))
    got = framer.next()
    assert isinstance(got, Skipped) and got.fields is None
    assert got.frame.size == 16 + length + (40 << 20)
    # 40 MiB more of it, then the next message: nothing of it held meanwhile.
    chunk = bytes(64 * 1024)
    for _ in range((length + (40 << 20)) // len(chunk)):
        framer.feed(chunk)
        assert framer.held == 0 and framer.next() is None
    framer.feed(bytes((length + (40 << 20)) % len(chunk)) + signal(SYSTEMD))
    assert framer.next() == Kept(signal(SYSTEMD))


def test_a_message_over_the_size_cap_is_skipped_whoever_sent_it() -> None:
    big = signal(SYSTEMD, body=("x" * MESSAGE_MAX, 1))
    assert split(big + signal(SYSTEMD), 64 * 1024) == [
        Skipped(frame(big), {1: "/org/x", 2: "org.x.I", 3: "Changed", 7: SYSTEMD, 8: "su"}),
        Kept(signal(SYSTEMD)),
    ]


@pytest.mark.parametrize(
    ("mangle", "why"),
    [
        (lambda d: b"X" + d[1:], "byte order"),
        (lambda d: d[:1] + b"\x09" + d[2:], "message type"),
        (lambda d: d[:3] + b"\x02" + d[4:], "protocol version"),
    ],
)
def test_bytes_that_are_no_message_are_malformed(mangle: Any, why: str) -> None:
    framer = Framer(from_systemd)
    framer.feed(mangle(signal(SYSTEMD)))
    with pytest.raises(Malformed, match=why):
        framer.next()


def test_fields_not_as_the_specification_gives_them_are_none() -> None:
    data = bytearray(signal(SYSTEMD))
    f = frame(data)
    # The path field's signature ('o') made a string's ('s'); then an unknown code (42).
    wrong_sig = bytearray(data)
    wrong_sig[18] = ord("s")
    assert fields(wrong_sig[: f.fields_end], f) is None
    unknown = bytearray(data)
    unknown[16] = 42
    assert fields(unknown[: f.fields_end], f) is None
    # A string length past the header's end.
    past = bytearray(data)
    struct.pack_into("<I", past, 20, 10_000)
    assert fields(past[: f.fields_end], f) is None
    framer = Framer(lambda _f, _found: True)
    framer.feed(bytes(past) + signal(SYSTEMD))
    assert isinstance(framer.next(), Skipped)
    assert framer.next() == Kept(signal(SYSTEMD))
