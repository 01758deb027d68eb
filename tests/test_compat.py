"""gpuagent.compat: 3.11's StrEnum and rmtree(dir_fd=) on every Python (scripts/lane runs
these on Ubuntu 22.04's 3.10 and 24.04's 3.12)."""

from __future__ import annotations

import json
import os

import pytest

from gpuagent.compat import StrEnum, rmtree_at, tomllib


class Colour(StrEnum):
    RED = "red"


def test_a_member_is_its_value_in_every_spelling() -> None:
    assert (str(Colour.RED), f"{Colour.RED}", f"{Colour.RED:>5}") == ("red", "red", "  red")
    red: str = "red"
    assert red == Colour.RED and json.dumps([Colour.RED]) == '["red"]'
    assert Colour("red") is Colour.RED


def test_tomllib_reads_toml() -> None:
    assert tomllib.loads('a = 1\n[b]\nc = "d"\n') == {"a": 1, "b": {"c": "d"}}


def test_rmtree_at_removes_a_tree_and_follows_no_symlink(tmp_path: str) -> None:
    base, outside = os.path.join(tmp_path, "base"), os.path.join(tmp_path, "outside")
    os.makedirs(os.path.join(base, "tree", "sub"))
    os.makedirs(outside)
    with open(os.path.join(outside, "keep"), "w") as f:
        f.write("x")
    with open(os.path.join(base, "tree", "sub", "f"), "w") as f:
        f.write("x")
    os.symlink(outside, os.path.join(base, "tree", "link"))
    os.symlink(outside, os.path.join(base, "alink"))
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        rmtree_at("tree", fd)
        with pytest.raises(OSError):  # ELOOP: a symlink is not removed as a tree
            rmtree_at("alink", fd)
        with pytest.raises(FileNotFoundError):
            rmtree_at("tree", fd)
    finally:
        os.close(fd)
    assert sorted(os.listdir(base)) == ["alink"]
    assert os.listdir(outside) == ["keep"]
