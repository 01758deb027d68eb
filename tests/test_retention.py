"""Whether the journal can hold ``history_days`` (issue 30, "evidence that lasts"): journald's
settings, a fake root's ``/var/log/journal`` and real journal files (make-test-journal)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import Any

import pytest

from gpuagent.config import Config
from gpuagent.logs import EventLog
from gpuagent.sources.retention.judge import MAX_DEFAULT, Store, cap, judge, settings, size
from gpuagent.sources.retention.source import EVERY, KIND, Retention
from gpuagent.sources.retention.store import journald, lasts, look
from gpuagent.views import Tick
from tests.test_kernlog import make

__all__ = ["make"]  # the fixture

DAY = 86400.0
NOW = 1_800_000_000.0
MACHINE = "5" * 32
G = 1024**3
# Stamped by uptime (dmesg's form), so the entry is at the boot's start make-test-journal takes.
UPTIME_XID = (
    "[    5.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
)


def write(root: str, path: str, text: str) -> None:
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)


def test_settings_are_journalds_in_its_order() -> None:
    main = "[Journal]\n#Storage=volatile\nStorage=auto\nSystemMaxUse=1G\n[Other]\nStorage=none\n"
    dropin = "; a comment\n[Journal]\nSystemMaxUse=\nStorage = persistent\n"
    # A later file wins; an empty value restores the default; other sections are not read.
    assert settings([main, dropin]) == {"Storage": "persistent"}
    assert settings([main]) == {"Storage": "auto", "SystemMaxUse": "1G"}
    assert settings(["Storage=volatile\n"]) == {}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4G", 4 * G),
        ("500M", 500 * 1024**2),
        ("1.5G", 3 * G // 2),
        ("2048", 2048),
        ("64K", 65536),
        ("1T", 1024 * G),
        ("8MB", 8 * 1024**2),
        (" 8m ", 8 * 1024**2),
        ("", None),
        (None, None),
        ("lots", None),
        ("1G 500M", None),
        # Issue 40: 400 digits overflowed the check (float inf); not ASCII digits; over 64 bits.
        ("9" * 400, None),
        ("9" * 400 + "G", None),
        ("\u00b2G", None),
        ("\u0663G", None),
        ("99999999999E", None),
    ],
)
def test_sizes(text: str | None, value: int | None) -> None:
    assert size(text) == value


def test_the_cap_is_system_max_use_else_a_tenth_at_most_4g() -> None:
    assert cap(G, 100 * G) == G
    assert cap(None, 20 * G) == 2 * G
    assert cap(None, 100 * G) == MAX_DEFAULT


def test_judge() -> None:
    lost = Store("/var/log/journal", "there is no /var/log/journal", "mkdir /var/log/journal")
    case, said = judge(lost, 30, NOW) or ("", "")
    assert case == "volatile"
    assert said == (
        "the journal cannot hold history_days (30): there is no /var/log/journal, so it lives "
        "in /run and is lost at each boot; recurrence across boots is blind; "
        "mkdir /var/log/journal"
    )
    full = Store("/j", usage=G, oldest=NOW - 10 * DAY, max_use=G)
    case, said = judge(full, 30, NOW) or ("", "")
    assert case == "at_cap"
    assert said == (
        "the journal holds 10.0 of history_days (30) days: /j is at journald's cap (1.0G of "
        "1.0G, SystemMaxUse); recurrence beyond that is blind; raise SystemMaxUse in "
        "journald.conf, or lower history_days"
    )
    assert judge(full, 10, NOW) is None  # it holds the days asked for
    assert judge(replace(full, usage=G - G // 8 - 1), 30, NOW) is None  # young: it grows
    assert judge(replace(full, usage=G - G // 8), 30, NOW) is not None  # a file from the cap
    assert judge(replace(full, oldest=None), 30, NOW) is None  # nothing there yet
    tenth = replace(full, max_use=None, filesystem=10 * G)
    assert "10% of its filesystem" in (judge(tenth, 30, NOW) or ("", ""))[1]


def test_dropins_in_name_order_etc_masking_usr_lib(tmp_path: Any) -> None:
    root = str(tmp_path)
    write(root, "etc/systemd/journald.conf", "[Journal]\nStorage=volatile\nSystemMaxUse=1G\n")
    write(root, "usr/lib/systemd/journald.conf.d/10-a.conf", "[Journal]\nStorage=none\n")
    write(root, "etc/systemd/journald.conf.d/10-a.conf", "[Journal]\nStorage=persistent\n")
    write(root, "run/systemd/journald.conf.d/20-b.conf", "[Journal]\nSystemMaxUse=2G\n")
    write(root, "run/systemd/journald.conf.d/30-c.txt", "[Journal]\nSystemMaxUse=3G\n")
    assert journald(root) == {"Storage": "persistent", "SystemMaxUse": "2G"}
    assert journald(os.path.join(root, "nothing")) == {}


def never(_directory: str, _system: bool) -> tuple[int, float | None]:
    raise AssertionError("a volatile journal is not opened")


@pytest.mark.parametrize(
    ("conf", "machine_dir", "why"),
    [
        ("", False, f"there is no /var/log/journal/{MACHINE}"),
        ("[Journal]\nStorage=persistent\n", False, f"there is no /var/log/journal/{MACHINE}"),
        ("[Journal]\nStorage=volatile\n", True, "journald.conf has Storage=volatile"),
        ("[Journal]\nStorage=none\n", True, "journald.conf has Storage=none"),
    ],
)
def test_a_volatile_system_journal(tmp_path: Any, conf: str, machine_dir: bool, why: str) -> None:
    root = str(tmp_path)
    write(root, "etc/systemd/journald.conf", conf)
    write(root, "etc/machine-id", MACHINE + "\n")
    os.makedirs(os.path.join(root, "var/log/journal", MACHINE if machine_dir else ""))
    seen = look(root, "", never)
    assert seen is not None and seen.volatile == why
    assert ("Storage=persistent" if "Storage=" in why else "mkdir /var/log/journal") in (
        seen.fix or ""
    )


def test_a_configured_directory_in_run_is_volatile(tmp_path: Any) -> None:
    seen = look(str(tmp_path), "/run/log/journal", never)
    assert seen is not None and seen.volatile == "journal_directory /run/log/journal lies in /run"


@pytest.mark.parametrize(
    ("conf", "machine_dir", "directory", "kept"),
    [
        ("", True, "", True),
        ("", False, "", False),
        ("[Journal]\nStorage=volatile\n", True, "", False),
        ("[Journal]\nStorage=persistent\n", True, "", True),
        ("", False, "/srv/journal", True),
        ("", True, "/run/log/journal", False),
    ],
)
def test_lasts_is_the_volatile_rule_turned_round(
    tmp_path: Any, conf: str, machine_dir: bool, directory: str, kept: bool
) -> None:
    # The state's "history" (issue 42): a journal kept across boots without an earlier boot
    # has none yet; a volatile one holds this boot only.
    root = str(tmp_path)
    write(root, "etc/systemd/journald.conf", conf)
    write(root, "etc/machine-id", MACHINE + "\n")
    if machine_dir:
        os.makedirs(os.path.join(root, "var/log/journal", MACHINE))
    assert lasts(root, directory) is kept
    if not directory:
        seen = look(root, "", lambda _d, _s: (0, None))
        assert seen is not None and (seen.volatile is None) is kept


def test_a_journal_it_cannot_read_is_left_to_the_kernel_source(tmp_path: Any) -> None:
    root = str(tmp_path)
    write(root, "etc/machine-id", MACHINE + "\n")
    os.makedirs(os.path.join(root, "var/log/journal", MACHINE))

    def refused(_directory: str, _system: bool) -> tuple[int, float | None]:
        raise PermissionError(13, "Permission denied")

    assert look(root, "", refused) is None
    assert look(root, os.path.join(root, "gone")) is None  # real sd-journal: no such folder


def test_real_files_at_their_cap_and_below_it(make: Any, tmp_path: Any) -> None:
    root = str(tmp_path)
    write(root, "etc/machine-id", MACHINE + "\n")
    os.makedirs(os.path.join(root, "var/log/journal"))
    start = time.time() - 2 * DAY  # a journal that holds two days
    system_file(make, f"var/log/journal/{MACHINE}", start)
    write(root, "etc/systemd/journald.conf", "[Journal]\nSystemMaxUse=4M\n")
    seen = look(root, "")
    assert seen is not None and seen.volatile is None and seen.max_use == 4 * 1024**2
    assert seen.usage >= 4 * 1024**2 and seen.filesystem > 0
    assert seen.oldest is not None and abs(seen.oldest - start) < 60
    case, said = judge(seen, 30, time.time()) or ("", "")
    assert case == "at_cap" and said.startswith("the journal holds 2.0 of history_days (30)")
    write(root, "etc/systemd/journald.conf", "[Journal]\nSystemMaxUse=1G\n")
    seen = look(root, "")
    assert seen is not None and judge(seen, 30, time.time()) is None
    # A configured directory: judged itself, against the same journald's cap.
    write(root, "etc/systemd/journald.conf", "[Journal]\nSystemMaxUse=4M\n")
    other = look(root, os.path.join(root, "var/log/journal", MACHINE))
    assert other is not None and (judge(other, 30, time.time()) or ("",))[0] == "at_cap"


def system_file(make: Any, name: str, start: float, file: str = "system.journal") -> None:
    """A real journal file named ``file`` in ``<tmp>/<name>``, its one entry at ``start``."""
    folder = make(UPTIME_XID, name=name, start=start)
    os.rename(os.path.join(folder, "x.journal"), os.path.join(folder, file))


def test_a_users_own_journal_file_is_not_the_systems_oldest(make: Any, tmp_path: Any) -> None:
    # Issue 40: user-1000.journal beside the system's, older than it, made the system journal
    # look as if it held 40 days: the at-cap warning never came.
    root = str(tmp_path)
    write(root, "etc/machine-id", MACHINE + "\n")
    write(root, "etc/systemd/journald.conf", "[Journal]\nSystemMaxUse=4M\n")
    os.makedirs(os.path.join(root, "var/log/journal"))
    now = time.time()
    system_file(make, f"var/log/journal/{MACHINE}", now - 2 * DAY)
    system_file(make, "user", now - 40 * DAY, "user-1000.journal")
    os.rename(
        os.path.join(root, "user", "user-1000.journal"),
        os.path.join(root, "var/log/journal", MACHINE, "user-1000.journal"),
    )
    seen = look(root, "")
    assert seen is not None and seen.oldest is not None
    assert abs(seen.oldest - (now - 2 * DAY)) < 60  # the system's file's, not the user's
    assert seen.usage >= 8 * 1024**2  # both files count against journald's cap
    assert (judge(seen, 30, now) or ("",))[0] == "at_cap"


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.got: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.got.append(record)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_source_warns_once_and_holds_the_trouble() -> None:
    lost = Store("/var/log/journal", "there is no /var/log/journal", "mkdir /var/log/journal")
    seen: list[Store | None] = [lost]
    looks: list[tuple[str, str]] = []

    def fake(root: str, directory: str) -> Store | None:
        looks.append((root, directory))
        return seen[0]

    clock = Clock()
    # A logger of its own: another test's logging setup does not change what it records.
    logger = logging.getLogger("tests.retention")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    records = Records()
    logger.addHandler(records)
    source = Retention(EventLog(logger), root="/fake", look=fake, monotonic=clock)
    config = Config(journal_directory="", history_days=30)
    tick = Tick(NOW, 0.0, config)
    for _ in range(3):
        clock.now += 10
        trouble = source.step(tick).trouble[KIND]
        assert trouble is not None and "lost at each boot" in trouble
    assert looks == [("/fake", "")]  # once an hour, not each tick
    warned = [r for r in records.got if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == [trouble]
    clock.now += EVERY
    source.step(tick)
    assert len(looks) == 2 and len(records.got) == 1  # the same case: said once
    seen[0] = None
    source.reset(config, config)  # a reload looks now
    assert source.step(tick).trouble == {KIND: None}
    assert len(looks) == 3
    assert records.got[-1].getMessage() == "the journal holds history_days again"
    logger.removeHandler(records)
