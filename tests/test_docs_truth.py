"""The reference stays true to the code: every configuration key (gpuagent.configkeys.KEYS) is in
the shipped reference config and in gpuagent.toml(5), which names no other; every problem kind
(gpuagent.verdict.KINDS) is in gpuagent-problems(7), which names no other, with how it ends."""

from __future__ import annotations

import os
import re

import pytest

from gpuagent.configkeys import KEYS
from gpuagent.verdict import KINDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = {k.name for k in KEYS}


def read(*path: str) -> str:
    with open(os.path.join(REPO, *path), encoding="utf-8") as f:
        return f.read()


def section(page: str, name: str) -> str:
    """The roff source of section ``name`` of ``man/page``."""
    m = re.search(rf'^\.SH "?{name}"?\n(.*?)(?=^\.SH |\Z)', read("man", page), re.M | re.S)
    assert m is not None, f"{page}: no section {name}"
    return m.group(1)


def tags(text: str) -> list[list[str]]:
    """The words of each ``.TP`` entry's tag line (``.BR a ", " b`` -> ``["a", "b"]``)."""
    lines = text.split("\n")
    heads = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line == ".TP"]
    return [re.findall(r"[A-Za-z_]\w*", head.split(None, 1)[1]) for head in heads]


def entries(text: str) -> dict[str, str]:
    """Each ``.TP`` entry's body by each word of its tag."""
    out: dict[str, str] = {}
    for part in re.split(r"^\.TP\n", text, flags=re.M)[1:]:
        head, _, body = part.partition("\n")
        for word in re.findall(r"[A-Za-z_]\w*", head.split(None, 1)[1]):
            out[word] = re.split(r"^\.(?:PP|SH|SS)\b", body, flags=re.M)[0]
    return out


def test_every_key_is_in_the_shipped_reference_config() -> None:
    shipped = read("packaging", "gpuagent.toml")
    # A key with a default is shown commented out at it; one unset by default (expected_gpus,
    # processes_interval) and the [xid] table in a comment with an example.
    shown = set(re.findall(r"^# ?\[?(\w+)\]?(?: =|$)", shipped, re.M))
    assert NAMES - shown == set()
    assert {k for k in shown if k in NAMES} == NAMES


def test_every_key_is_in_its_page_with_its_default() -> None:
    keys = section("gpuagent.toml.5", "KEYS")
    documented = [words[0] for words in tags(keys)]
    assert sorted(documented) == sorted(NAMES), "gpuagent.toml(5) KEYS against configkeys.KEYS"
    for key in KEYS:
        assert re.search(rf'^\.BR {key.name} " \(default ', keys, re.M), key.name


def test_every_problem_kind_is_in_its_page() -> None:
    documented = {word for words in tags(section("gpuagent-problems.7", "KINDS")) for word in words}
    assert KINDS - documented == set(), "kinds missing from gpuagent-problems(7)"
    assert documented - KINDS == set(), "gpuagent-problems(7) names a kind the code does not have"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_problem_kind_says_how_it_ends(kind: str) -> None:
    body = entries(section("gpuagent-problems.7", "KINDS"))[kind]
    assert re.search(r"\b(?:ends?|latches)\b", body), kind


@pytest.mark.parametrize("page", ["gpuagent.toml.5", "gpuagent-problems.7"])
def test_the_page_has_examples(page: str) -> None:
    assert ".EX\n" in section(page, "EXAMPLES")
