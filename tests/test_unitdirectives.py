"""Every directive of the shipped units is one that Ubuntu 22.04's systemd 249 knows.

A directive systemd does not know is ignored with a warning, so a unit written for Debian 12's
252 would start on 249 without the sandbox line it relies on.  The versions are systemd's man
pages' "Added in version N" (tests/data/systemd-directives.tsv); a directive newer than 249
passes only where the line above it says what systemd before that version does with it
(``# before systemd 253: ...``), and one missing from the table fails until it is added.
"""

from __future__ import annotations

import os
import re

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGING = os.path.join(os.path.dirname(HERE), "packaging")
TABLE = os.path.join(HERE, "data", "systemd-directives.tsv")
# Ubuntu 22.04's systemd, the oldest of the releases served (Debian 12 has 252, Ubuntu 24.04
# 255, Debian 13 257).
OLDEST = 249
UNITS = sorted(
    name for name in os.listdir(PACKAGING) if name.endswith((".service", ".path", ".timer"))
)


def versions() -> dict[str, int]:
    """The table: ``Directive`` or ``Directive=value`` -> the systemd version that added it."""
    out: dict[str, int] = {}
    with open(TABLE, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                name, version = line.rstrip("\n").split("\t")
                out[name] = int(version)
    return out


def directives(text: str) -> list[tuple[int, str, str, str]]:
    """Each ``Key=value`` line of a unit: (line number, key, value, the line above it)."""
    out = []
    above = ""
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(r"[A-Za-z]+=", line):
            key, _, value = line.partition("=")
            out.append((number, key, value, above))
        above = line
    return out


def too_new(text: str, table: dict[str, int], oldest: int = OLDEST) -> list[str]:
    """The lines of unit ``text`` that systemd ``oldest`` would not know, each said in words."""
    bad = []
    for number, key, value, above in directives(text):
        added = table.get(f"{key}={value}", table.get(key))
        if added is None:
            bad.append(f"line {number}: {key}= is not in {os.path.basename(TABLE)}")
        elif added > oldest and not re.match(rf"# before systemd {added}\b", above):
            bad.append(f"line {number}: {key}={value} came with systemd {added}")
    return bad


def test_the_table_has_the_versions_of_the_directives_this_test_knows() -> None:
    table = versions()
    assert table["ProtectProc"] == 247
    assert table["Type=notify-reload"] == 253
    assert all(v == 0 or v >= 187 for v in table.values())


@pytest.mark.parametrize("unit", UNITS)
def test_every_directive_is_known_to_systemd_249(unit: str) -> None:
    with open(os.path.join(PACKAGING, unit), encoding="utf-8") as f:
        assert too_new(f.read(), versions()) == []


def test_a_newer_directive_fails_unless_the_line_above_says_what_older_systemd_does() -> None:
    table = versions()
    assert too_new("[Service]\nType=notify-reload\n", table) == [
        "line 2: Type=notify-reload came with systemd 253"
    ]
    guarded = "[Service]\n# before systemd 253: ignored; ExecReload= does it\nType=notify-reload\n"
    assert too_new(guarded, table) == []
    assert too_new("[Service]\nProtectProc=invisible\n", table, oldest=246) == [
        "line 2: ProtectProc=invisible came with systemd 247"
    ]
    assert too_new("[Service]\nFrobnicate=yes\n", table) == [
        "line 2: Frobnicate= is not in systemd-directives.tsv"
    ]


@pytest.mark.parametrize("unit", ["gpuagent.service", "gpuagent-evidence@.service"])
def test_a_unit_that_runs_nvidia_smi_sets_no_device_policy(unit: str) -> None:
    # ProtectClock=yes before systemd 252 adds DeviceAllow=char-rtc (systemd#25075): with any
    # device allow-list /dev/nvidia* is shut out of the unit that runs nvidia-smi.
    with open(os.path.join(PACKAGING, unit), encoding="utf-8") as f:
        keys = {key: value for _, key, value, _ in directives(f.read())}
    assert "ProtectClock" not in keys
    assert "DeviceAllow" not in keys
    assert keys.get("DevicePolicy", "auto") == "auto"
    assert keys.get("PrivateDevices", "no") == "no"
