"""gpuagent.sources.processes.comm: a process's name from /proc/<pid>/comm, as the kernel keeps
it."""

from __future__ import annotations

import os

import pytest

from gpuagent.sources.processes import comm


@pytest.mark.parametrize(
    ("data", "name"),
    [
        (b"python3\n", "python3"),
        (b"python3", "python3"),
        (b"pt_main_thread\n", "pt_main_thread"),
        (b"123456789012345\n", "123456789012345"),
        (b"a, b\n", "a, b"),
        (b'"quoted\n', '"quoted'),
        (b"x\nGPU-0000000\n", "x?GPU-0000000"),
        (b"tab\there\n", "tab?here"),
        (b"\x1b[31mred\n", "?[31mred"),
        (b"caf\xc3\xa9\n", "caf\u00e9"),
        (b"\xff\xfe\n", "\ufffd\ufffd"),
        (b"\n", None),
        (b"", None),
        (b"1234567890123456\n", None),
    ],
)
def test_name(data: bytes, name: str | None) -> None:
    assert comm.name(data) == name


@pytest.mark.parametrize(
    ("cmdline", "name"),
    [
        ("/usr/bin/python3 train.py --lr 0.1", "python3"),
        ("sleep infinity", "sleep"),
        ("/opt/pt_main_thread_with_a_long_name", "pt_main_thread_"),
        ("[kworker/0:1]", "kworker/0:1"),  # systemd's form of a process without a cmdline
        ('"/opt/my prog" --x', "my prog"),
        ('"/opt/a\\"b\\$c\\\\d" x', 'a"b$c\\d'),
        ('"/opt/x, 1\\nGPU-b, 4242" y', "x, 1?GPU-b, 424"),
        ('"/opt/\\x1b[31mred"', "?[31mred"),
        ('"/opt/caf\\xc3\\xa9"', "caf\u00e9"),
        ('"/opt/\\xff"', "\ufffd"),
        ("/opt/\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9", "\u00e9" * 7 + "\ufffd"),
        ("/opt/x,\nGPU-b", "x,?GPU-b"),
        ("", None),
        ('""', None),
        ("/opt/", None),
    ],
)
def test_from_cmdline(cmdline: str, name: str | None) -> None:
    assert comm.from_cmdline(cmdline) == name


def test_read(tmp_path: str) -> None:
    os.makedirs(os.path.join(tmp_path, "42"))
    with open(os.path.join(tmp_path, "42", "comm"), "wb") as f:
        f.write(b"trainer\n")
    os.makedirs(os.path.join(tmp_path, "43"))
    assert comm.read(str(tmp_path), 42) == "trainer"
    assert comm.read(str(tmp_path), 43) is None  # no comm file: a process hidden
    assert comm.read(str(tmp_path), 44) is None  # gone
    assert comm.read(os.path.join(str(tmp_path), "missing"), 42) is None


def test_read_this_process() -> None:
    with open(f"/proc/{os.getpid()}/comm", "rb") as f:
        expected = comm.name(f.read())
    assert expected is not None
    assert comm.read("/proc", os.getpid()) == expected
