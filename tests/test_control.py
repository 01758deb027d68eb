"""debian/control declares what the package needs, so that a release it cannot serve refuses
it at install (apt: unmet dependencies) instead of half-configuring it (a byte-compile that
fails in postinst, an import that fails at start).

The floors are the versions scripts/lane tests for Ubuntu 22.04 (.ci/lanes/jammy.txt), the
oldest release served; setup.cfg says the same Python floor.
"""

from __future__ import annotations

import configparser
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# PyPI's name (the lanes' pins) -> the Debian/Ubuntu package.
PACKAGES = {
    "click": "python3-click",
    "jeepney": "python3-jeepney",
    "prometheus-client": "python3-prometheus-client",
    "sdnotify": "python3-sdnotify",
    "systemd-python": "python3-systemd",
    "tomli": "python3-tomli",
}


def paragraphs() -> list[dict[str, str]]:
    """debian/control's paragraphs: field -> value (continuation lines joined by spaces)."""
    out: list[dict[str, str]] = [{}]
    field = ""
    with open(os.path.join(REPO, "debian", "control"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                continue
            if not line.strip():
                if out[-1]:
                    out.append({})
            elif line[0] in " \t":
                out[-1][field] += " " + line.strip()
            else:
                field, _, value = line.partition(":")
                out[-1][field] = value.strip()
    return [p for p in out if p]


def depends() -> dict[str, str]:
    """The binary package's Depends: each alternative's package -> its version relation."""
    binary = next(p for p in paragraphs() if p.get("Package") == "gpuagent")
    out = {}
    for part in re.split(r"[,|]", binary["Depends"]):
        if not part.strip():
            continue
        m = re.fullmatch(r"\s*([^\s(]+)\s*(?:\((.*)\))?\s*", part)
        assert m is not None, part
        out[m.group(1)] = m.group(2) or ""
    return out


def jammy_pins() -> dict[str, str]:
    pins = {}
    with open(os.path.join(REPO, ".ci", "lanes", "jammy.txt"), encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                name, _, version = line.strip().partition("==")
                pins[name] = version
    return pins


def test_the_python_floor_is_3_10_in_control_and_setup_cfg() -> None:
    source = paragraphs()[0]
    assert source["X-Python3-Version"] == ">= 3.10"
    setup = configparser.ConfigParser()
    setup.read(os.path.join(REPO, "setup.cfg"))
    assert setup["options"]["python_requires"] == ">=3.10"


def test_each_dependency_is_versioned_at_the_oldest_release_tested() -> None:
    got = depends()
    pins = jammy_pins()
    assert sorted(pins) == sorted(PACKAGES)
    assert {PACKAGES[n]: got.get(PACKAGES[n]) for n in pins} == {
        PACKAGES[n]: f">= {v}" for n, v in pins.items()
    }


def test_tomli_is_needed_only_where_python_has_no_tomllib() -> None:
    binary = next(p for p in paragraphs() if p.get("Package") == "gpuagent")
    alternatives = [a.strip() for a in binary["Depends"].split(",") if "python3-tomli" in a]
    assert alternatives == ["python3 (>= 3.11) | python3-tomli (>= 1.2.2)"]
