"""gpuagent.edges.statedir: a JSON file under $STATE_DIRECTORY, read at the start and
replaced when what it holds changes, and the one warning while it cannot be read or written."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest

from gpuagent.edges.statedir import StateFile
from gpuagent.logs import EventLog
from tests.test_linksup import recorder

NAME = "things.json"


def things(directory: str | None, log: EventLog) -> StateFile:
    return StateFile(directory, NAME, log, limit=1024, otherwise="the things seen")


def counted(data: Any) -> int:
    """The file's ``{"n": int}``; raises TypeError for anything else."""
    if not isinstance(data, dict) or type(data.get("n")) is not int:
        raise TypeError('expected {"n": an integer}')
    n: int = data["n"]
    return n


def test_written_then_read_back(tmp_path: str) -> None:
    log, records = recorder()
    things(str(tmp_path), log).write({"n": 3, "names": ["a", "b"]}, "the things")
    with open(os.path.join(tmp_path, NAME), "rb") as f:
        assert f.read() == b'{"n":3,"names":["a","b"]}'  # as the state file is written
    again = things(str(tmp_path), log)
    assert again.read(counted, "the things") == 3
    assert again.error is None and records == []


@pytest.mark.parametrize("directory", [None, ""])
def test_without_a_directory_nothing_is_read_or_written(directory: str | None) -> None:
    log, records = recorder()
    file = things(directory, log)
    assert file.path is None
    assert file.read(counted, "the things") is None
    file.write({"n": 1}, "the things")
    assert file.error is None and records == []


def test_no_file_yet_is_nothing_remembered_and_no_word(tmp_path: str) -> None:
    log, records = recorder()
    assert things(str(tmp_path), log).read(counted, "the things") is None
    assert records == [] and os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "text", ["{not json", '{"n": "3"}', "[]", '{"n": NaN}', "[" * 5000 + "]" * 5000, "x" * 2000]
)
def test_a_file_that_cannot_be_read_is_one_warning_naming_it(tmp_path: str, text: str) -> None:
    path = os.path.join(tmp_path, NAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    log, records = recorder()
    file = things(str(tmp_path), log)
    assert file.read(counted, "the things seen before") is None
    assert [r.levelno for r in records] == [logging.WARNING]
    message = records[0].getMessage()
    assert message.startswith(f"{path}: cannot read the things seen before: ")
    assert message.endswith("; going on with the things seen")
    assert "\n" not in message
    assert file.error is not None and message.startswith(file.error)
    # A write that goes through ends the trouble, without a word.
    file.write({"n": 1}, "the things")
    assert file.error is None and len(records) == 1


def test_a_symlink_is_not_followed(tmp_path: str) -> None:
    target = os.path.join(tmp_path, "elsewhere.json")
    with open(target, "w", encoding="utf-8") as f:
        f.write('{"n": 1}')
    os.symlink(target, os.path.join(tmp_path, NAME))
    log, records = recorder()
    file = things(str(tmp_path), log)
    assert file.read(counted, "the things") is None
    assert file.error is not None and "not followed" in file.error
    assert len(records) == 1


def test_an_unwritable_directory_is_one_warning_while_it_lasts(tmp_path: str) -> None:
    directory = os.path.join(tmp_path, "not-a-directory")
    with open(directory, "w", encoding="utf-8"):
        pass  # even root cannot write below a file
    log, records = recorder()
    file = things(directory, log)
    for n in range(3):
        file.write({"n": n}, "the things seen")
    assert [r.levelno for r in records] == [logging.WARNING]
    assert records[0].getMessage() == (
        f"{directory}/{NAME}: cannot remember the things seen: Not a directory; "
        "going on with the things seen"
    )
    assert file.error == f"{directory}/{NAME}: cannot remember the things seen: Not a directory"
    # It becomes a directory: the next write goes through and ends it; failing again is a
    # new spell, and a new warning.
    os.unlink(directory)
    os.mkdir(directory)
    file.write({"n": 3}, "the things seen")
    assert file.error is None
    os.unlink(os.path.join(directory, NAME))
    os.rmdir(directory)
    with open(directory, "w", encoding="utf-8"):
        pass
    file.write({"n": 4}, "the things seen")
    assert len(records) == 2 and file.error is not None


def unsearchable(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """``path`` as a user who may not search its directory sees it: os.path.lexists says
    False, and opening it fails with EACCES (injected: root is never refused)."""
    real = os.open

    def refused(name: str, *args: Any, **kwargs: Any) -> int:
        if name == path:
            raise PermissionError(13, "Permission denied", name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    monkeypatch.setattr(os.path, "lexists", lambda _p: False)


def test_a_directory_it_may_not_search_is_one_warning_not_no_file(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = os.path.join(tmp_path, NAME)
    unsearchable(monkeypatch, path)
    log, records = recorder()
    file = things(str(tmp_path), log)
    assert file.read(counted, "the things seen before") is None
    assert [r.getMessage() for r in records] == [
        f"{path}: cannot read the things seen before: Permission denied; "
        "going on with the things seen"
    ]
