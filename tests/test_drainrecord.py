"""slurm-check's record of its drains: its file (0644 JSON, atomic, the directory made when
missing), what a damaged one reads as, and where it lives: the agent's StateDirectory, which
systemd alone owns (the package ships no such directory to fight over)."""

from __future__ import annotations

import json
import os
import re
import stat

from gpuagent.commands import drainrecord

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_record_is_a_small_json_file_every_user_may_read(tmp_path: str) -> None:
    path = os.path.join(str(tmp_path), "lib", "gpuagent", "slurm-drains.json")
    old = os.umask(0o077)
    try:
        assert drainrecord.write(path, {"n1": "gpuagent: 0000:3a:00.0 xid reboot (Xid 79)"}) == ""
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    with open(path) as f:
        assert json.load(f) == {"drained": {"n1": "gpuagent: 0000:3a:00.0 xid reboot (Xid 79)"}}
    assert drainrecord.read(path) == ({"n1": "gpuagent: 0000:3a:00.0 xid reboot (Xid 79)"}, "")
    assert drainrecord.write(path, {}) == ""
    assert drainrecord.read(path) == ({}, "")
    assert os.listdir(os.path.dirname(path)) == ["slurm-drains.json"]  # no temporary left


def test_no_record_is_none_without_a_reason(tmp_path: str) -> None:
    assert drainrecord.read(os.path.join(str(tmp_path), "none.json")) == (None, "")


def test_a_record_too_big_is_damaged(tmp_path: str) -> None:
    path = os.path.join(str(tmp_path), "slurm-drains.json")
    with open(path, "w") as f:
        json.dump({"drained": {"n1": "x" * drainrecord.LIMIT}}, f)
    drained, why = drainrecord.read(path)
    assert drained is None
    assert why == f"{path}: cannot read the record of its drains: larger than 65536 bytes"


def test_a_record_that_cannot_be_written_says_why(tmp_path: str) -> None:
    blocker = os.path.join(str(tmp_path), "a-file")
    with open(blocker, "w") as f:
        f.write("")
    path = os.path.join(blocker, "slurm-drains.json")
    assert drainrecord.write(path, {}) == f"{path}: cannot record its drains: File exists"


def test_the_record_lives_in_the_unit_s_state_directory() -> None:
    with open(os.path.join(REPO, "packaging", "gpuagent.service")) as f:
        unit = f.read()
    (directory,) = re.findall(r"^StateDirectory=(\S+)$", unit, re.M)
    assert os.path.dirname(drainrecord.PATH) == f"/var/lib/{directory}"
    # systemd makes it and gives it to User= (root writes in it all the same); a directory
    # the package shipped would have a second owner, dpkg, with root's ownership in its books.
    with open(os.path.join(REPO, "debian", "gpuagent.dirs")) as f:
        assert "var/lib" not in f.read()
    assert not [p for p in os.listdir(os.path.join(REPO, "debian")) if "tmpfile" in p]
