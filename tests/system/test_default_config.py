"""packaging/gpuagent.toml: every key, commented out, at its default, each with a comment."""

from __future__ import annotations

import os
import re

from gpuagent.compat import tomllib
from gpuagent.config import Config, from_mapping

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = os.path.join(REPO, "packaging", "gpuagent.toml")
SETTING = re.compile(r"^#(\w+) = ")


def text() -> str:
    with open(SHIPPED, encoding="utf-8") as f:
        return f.read()


def test_as_shipped_it_sets_nothing() -> None:
    assert tomllib.loads(text()) == {}


def test_uncommented_it_gives_exactly_the_defaults() -> None:
    lines = text().splitlines()
    keys = [m.group(1) for line in lines if (m := SETTING.match(line))]
    # A key unset by default (expected_gpus) cannot be written in TOML, and a table ([xid])
    # cannot be commented out key by key: both are shown in a comment.
    assert keys == [k for k, v in Config()._asdict().items() if v is not None and k != "xid"]
    uncommented = "\n".join(line[1:] if SETTING.match(line) else "" for line in lines)
    assert from_mapping(tomllib.loads(uncommented), source=SHIPPED) == Config()


def test_each_key_is_explained() -> None:
    lines = text().splitlines()
    for i, line in enumerate(lines):
        if SETTING.match(line):
            assert lines[i - 1].startswith("# "), line
