"""``gpuagent history``: a GPU's story across boots from a real journal file of two boots
(make-test-journal's #@boot), with the agent's own lines and root's clear appended."""

from __future__ import annotations

import json
import os
import pwd
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent.commands.cli import main
from gpuagent.logs import Event
from gpuagent.sources.kernel import timeline
from tests.journalfeed import this_boot
from tests.test_clear import LATER, PERSON_UID, clear_entry
from tests.test_kernel import FELL_OFF
from tests.test_kernlog import append, export_entry, make

__all__ = ["make"]  # the fixture

SLOT = "0000:18:00.0"
EARLIER = "0123456789abcdef0123456789abcdef"


def agent_line(at: float, event: Event, **fields: str) -> bytes:
    """A line of the agent's, as the journal stores it from the service."""
    return export_entry(
        [
            ("__REALTIME_TIMESTAMP", str(int(at * 1e6)).encode()),
            ("__MONOTONIC_TIMESTAMP", str(int((at - 1_699_990_000) * 1e6)).encode()),
            ("_BOOT_ID", this_boot().encode()),
            ("_TRANSPORT", b"stdout"),
            ("_SYSTEMD_UNIT", b"gpuagent.service"),
            ("MESSAGE_ID", event.value.encode()),
            *[(k, v.encode()) for k, v in fields.items()],
            ("MESSAGE", b"GPU 0000:18:00.0: Xid 79 ..."),
        ]
    )


def history(journal: str, tmp_path: str, *args: str) -> tuple[int, str]:
    conf = os.path.join(tmp_path, "h.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(f'journal_directory = "{journal}"\n')
    res = CliRunner(mix_stderr=False).invoke(
        main, ["--config", conf, "history", *args, "--days", "100000"]
    )
    return res.exit_code, res.stdout


def test_the_story_across_two_boots(make: Any, tmp_path: str) -> None:
    other = "0000:2a:00.0"
    journal = make(
        FELL_OFF
        + f"#@boot {this_boot()}\n"
        + FELL_OFF
        + "NVRM: Xid (PCI:0000:2a:00): 13, pid=1, name=x, Graphics Exception\n",
        boot=EARLIER,
    )
    fields = {"PCI_SLOT": SLOT, "PROBLEM": "xid", "XID": "79", "ACTION": "reboot"}
    append(journal, agent_line(LATER - 5, Event.XID_PROBLEM, **fields))
    append(journal, clear_entry("0", LATER, login=str(PERSON_UID), sudo_user="alice"))
    append(journal, clear_entry("1000", LATER + 1))  # not root's: no step
    append(journal, agent_line(LATER + 2, Event.PROBLEM_CLEARED, **fields))
    code, out = history(journal, str(tmp_path), SLOT, "--json")
    assert code == 0, out
    steps = json.loads(out)
    assert [(s["event"], s["boot"][:4], s["xid"]) for s in steps] == [
        ("boot", "0123", None),
        ("xid", "0123", 79),
        ("boot", this_boot()[:4], None),
        ("xid", this_boot()[:4], 79),
        ("problem_start", this_boot()[:4], 79),
        ("clear", this_boot()[:4], None),
        ("problem_end", this_boot()[:4], 79),
    ]
    keys = {"boot", "time", "pci_slot", "uuid", "event", "kind", "xid", "action", "by"}
    keys |= {"serial", "old_uuid", "old_serial", "wear", "victims"}
    assert set(steps[1]) == keys and steps[1]["by"] is None
    assert steps[1]["pci_slot"] == SLOT
    assert steps[1]["uuid"] == "GPU-11111111-2222-3333-4444-555555555555"
    assert steps[1]["action"] == "reboot"
    assert steps[5]["kind"] == "xid" and steps[5]["time"] == LATER
    # The person: the login uid journald stamped, named (not SUDO_USER, which the sender sets).
    person = pwd.getpwuid(PERSON_UID).pw_name
    assert steps[5]["by"] == person
    assert all(s["pci_slot"] != other for s in steps)
    code, text = history(journal, str(tmp_path))
    assert code == 0
    assert text.count("-- boot ") == 2
    assert f"{other}  xid           Xid 13" in text
    assert f"{SLOT}  clear         xid by {person}\n" in text


def test_a_journal_the_caller_may_not_read_is_said(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from systemd import journal  # noqa: PLC0415

    class Unreadable:
        def __init__(self, **_: Any) -> None:
            pass

        def get_usage(self) -> int:
            return 0  # sd-journal skipped every file this process may not read

        def close(self) -> None:
            pass

    monkeypatch.setattr(journal, "Reader", Unreadable)
    conf = os.path.join(str(tmp_path), "h.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write("")
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "history"])
    assert res.exit_code == 1
    assert "run as root or as a member of the systemd-journal group" in res.stderr


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (PermissionError(13, "Permission denied"), "Permission denied"),
        (FileNotFoundError(2, "No such file or directory"), "No such file or directory"),
    ],
)
def test_a_journal_directory_it_may_not_read_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: str, error: OSError, reason: str
) -> None:
    # As root a directory's mode refuses nothing: the refusal sd-journal gives another user.
    from systemd import journal  # noqa: PLC0415

    def refused(**_kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(journal, "Reader", refused)
    directory = os.path.join(str(tmp_path), "journal")
    conf = os.path.join(str(tmp_path), "h.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(f'journal_directory = "{directory}"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "history"])
    assert (res.exit_code, res.stdout) == (1, "")
    assert res.stderr == f"gpuagent: cannot read the journal in {directory}: {reason}\n"


def test_another_hosts_journal_directory_read_offline(make: Any, tmp_path: str) -> None:
    # Laid out as that host's /var/log/journal: one folder per machine id, as journalctl -D
    # reads it; the config's journal_directory (this host's) is not read.
    machine = "f" * 32
    os.mkdir(os.path.join(str(tmp_path), "other"))
    journal = make(FELL_OFF, name=f"other/{machine}", boot=EARLIER)
    append(journal, clear_entry("0", LATER, login=str(PERSON_UID), sudo_user="alice"))
    conf = os.path.join(str(tmp_path), "h.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(f'journal_directory = "{tmp_path}/nowhere"\n')
    other = os.path.join(str(tmp_path), "other")
    args = ["--config", conf, "history", SLOT, "--json", "--days", "100000"]
    res = CliRunner(mix_stderr=False).invoke(main, [*args, "--directory", other])
    assert res.exit_code == 0, res.stderr
    steps = json.loads(res.stdout)
    # The clear is stamped with this boot's id (clear_entry's): a second boot.
    assert [s["event"] for s in steps] == ["boot", "xid", "boot", "clear"]
    # That host's login uid: this host's user database does not name its users.
    assert steps[3]["by"] == f"uid {PERSON_UID}"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("gone", "No such file or directory"),
        ("empty", "no journal file it may read"),
        ("file", "Not a directory"),
    ],
)
def test_a_directory_it_cannot_read_is_one_line(tmp_path: str, name: str, reason: str) -> None:
    os.mkdir(os.path.join(str(tmp_path), "empty"))
    with open(os.path.join(str(tmp_path), "file"), "w", encoding="utf-8") as f:
        f.write("not a journal\n")
    conf = os.path.join(str(tmp_path), "h.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write("")
    directory = os.path.join(str(tmp_path), name)
    res = CliRunner(mix_stderr=False).invoke(
        main, ["--config", conf, "history", "--directory", directory]
    )
    assert (res.exit_code, res.stdout) == (1, "")
    assert res.stderr.startswith(f"gpuagent: cannot read the journal in {directory}: {reason}")
    assert res.stderr.count("\n") == 1


BOARD = "GPU-11111111-2222-3333-4444-555555555555"
NEW_BOARD = "GPU-99999999-8888-7777-6666-555555555555"


def test_a_boards_story_in_whichever_slot_it_was(make: Any, tmp_path: str) -> None:
    # This boot: the board of FELL_OFF (its UUID line, then Xid 79) in slot 0000:18:00.0;
    # the agent's lines name it; another board's problem in 0000:2a:00.0, and that slot's
    # clear, whose board is known only from its boot's other lines.
    journal = make(FELL_OFF)
    fields = {"PCI_SLOT": SLOT, "PROBLEM": "xid", "XID": "79", "ACTION": "reboot"}
    append(journal, agent_line(LATER - 5, Event.XID_PROBLEM, GPU_UUID=BOARD, **fields))
    other = {"PCI_SLOT": "0000:2a:00.0", "PROBLEM": "throttled", "ACTION": "check_host"}
    append(journal, agent_line(LATER - 4, Event.PROBLEM_THROTTLED, GPU_UUID=NEW_BOARD, **other))
    append(journal, clear_entry("0", LATER, slot="0000:2a:00.0"))
    code, out = history(journal, str(tmp_path), BOARD.lower(), "--json")
    assert code == 0, out
    assert [(s["event"], s["pci_slot"], s["uuid"]) for s in json.loads(out)[1:]] == [
        ("xid", SLOT, BOARD),
        ("problem_start", SLOT, BOARD),
    ]
    code, out = history(journal, str(tmp_path), NEW_BOARD, "--json")
    assert [(s["event"], s["kind"]) for s in json.loads(out)[1:]] == [
        ("problem_start", "throttled"),
        ("clear", "xid"),
    ]
    code, out = history(journal, str(tmp_path), "GPU-00000000-0000-0000-0000-000000000000")
    assert (code, out) == (0, "no GPU events in the journal\n")


def test_history_names_what_it_takes() -> None:
    res = CliRunner(mix_stderr=False).invoke(main, ["history", "3b:zz.0"])
    assert res.exit_code == 2
    assert "neither a PCI slot (0000:3b:00.0), a GPU's UUID (GPU-...) nor a board's" in res.stderr


def test_a_board_moved_between_boots_is_followed_pure() -> None:
    def line(at: float, boot: str, slot: str, uuid: str | None) -> tuple[float, dict[str, object]]:
        fields: dict[str, object] = {
            "_BOOT_ID": boot,
            "_SYSTEMD_UNIT": "gpuagent.service",
            "MESSAGE_ID": Event.PROBLEM_THROTTLED.value,
            "PCI_SLOT": slot,
            "PROBLEM": "throttled",
        }
        if uuid is not None:
            fields["GPU_UUID"] = uuid
        return at, fields

    entries = [
        line(1.0, "b1", "0000:18:00.0", BOARD),
        line(2.0, "b1", "0000:2a:00.0", NEW_BOARD),
        # The board moved to 0000:2a:00.0; an older agent's line of its slot names no UUID.
        line(3.0, "b2", "0000:2a:00.0", BOARD),
        line(4.0, "b2", "0000:2a:00.0", None),
        line(5.0, "b2", "0000:18:00.0", NEW_BOARD),
    ]
    steps = timeline.events(entries, None, uuid=BOARD)
    assert [(s.event, s.boot, s.pci_slot, s.time) for s in steps] == [
        ("boot", "b1", None, 1.0),
        ("problem_start", "b1", "0000:18:00.0", 1.0),
        ("boot", "b2", None, 3.0),
        ("problem_start", "b2", "0000:2a:00.0", 3.0),
        ("problem_start", "b2", "0000:2a:00.0", 4.0),
    ]
