"""The Xid corpus (tests/data/corpus/xid) and what each file must count to, for the tests of
the parser (``test_xid``) and of the journal source (``test_kernlog``)."""

from __future__ import annotations

import os
import re

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus", "xid")

# (slot, code) -> (records, severity, action) for every GPU Xid each file holds.
XIDS: dict[str, dict[tuple[str, int], tuple[int, str, str]]] = {
    "not-xid-driver-banners": {},
    "rminitadapter-failed-fedora-syslog": {},
    "rminitadapter-failed-gsp-driver550": {},
    "rminitadapter-failed-wpr2-gsp-bad-state": {},
    "sxid-22013-driver570-open-nvswitch": {},
    "xid-119-gsp-rpc-timeout-xe9680": {("0000:9b:00.0", 119): (5, "critical", "reset_gpu")},
    "xid-120-62-154-45-driver595-open-rtxpro6000": {
        ("0000:01:00.0", 120): (1, "critical", "reset_gpu"),
        ("0000:01:00.0", 154): (2, "critical", "reset_gpu"),
        ("0000:01:00.0", 62): (1, "critical", "reset_gpu"),
        ("0000:01:00.0", 45): (1, "none", "none"),
    },
    "xid-13-109-driver5xx-dmesg-ctime": {
        ("0000:cb:00.0", 13): (3, "none", "restart_app"),
        ("0000:cb:00.0", 109): (1, "critical", "reset_gpu"),
    },
    "xid-13-31-32-driver418-no-pid": {
        ("0000:01:00.0", 31): (1, "none", "restart_app"),
        ("0000:01:00.0", 13): (4, "none", "restart_app"),
        ("0000:01:00.0", 32): (1, "none", "restart_app"),
    },
    "xid-13-driver535-a800-pid-unknown": {("0000:43:00.0", 13): (2, "none", "restart_app")},
    "xid-13-syslog-prefix-no-pid": {("0000:41:00.0", 13): (3, "none", "restart_app")},
    "xid-145-137-b200-user-redacted-pci": {},
    "xid-31-driver352-engmask-no-pid": {("0000:01:00.0", 31): (3, "none", "restart_app")},
    "xid-31-driver5xx-lowercase-channel": {("0000:03:00.0", 31): (1, "none", "restart_app")},
    "xid-32-31-bumblebee-2015-no-pid": {
        ("0000:01:00.0", 32): (2, "none", "restart_app"),
        ("0000:01:00.0", 31): (1, "none", "restart_app"),
    },
    "xid-43-31-94-driver535-ctime": {
        ("0000:00:05.0", 43): (2, "none", "none"),
        ("0000:00:07.0", 31): (1, "none", "restart_app"),
        ("0000:00:08.0", 94): (1, "none", "restart_app"),
    },
    "xid-45-driver590-caused-by-previous-kernel-prefix": {
        ("0000:dc:00.0", 45): (1, "none", "none"),
        ("0000:ed:00.0", 45): (1, "none", "none"),
        ("0000:ba:00.0", 45): (1, "none", "none"),
        ("0000:97:00.0", 45): (1, "none", "none"),
    },
    "xid-48-63-94-driver550-dbe-rowremap": {
        ("0000:52:00.0", 48): (1, "critical", "reset_gpu"),
        ("0000:52:00.0", 63): (1, "warning", "none"),
        ("0000:52:00.0", 94): (1, "none", "restart_app"),
    },
    "xid-48-gpu-operator-syslog-truncated": {("0000:07:00.0", 48): (1, "critical", "reset_gpu")},
    "xid-63-driver510-a100-pid-no-name": {("0000:10:1c.0", 63): (1, "warning", "none")},
    "xid-74-nvlink-domain0003": {("0003:00:00.0", 74): (1, "critical", "reset_gpu")},
    "xid-79-driver525-arm64-domain0004": {
        ("0004:01:00.0", 79): (1, "critical", "reboot"),
        ("0004:01:00.0", 119): (1, "critical", "reset_gpu"),
    },
    "xid-79-driver535-pid-unknown-crashdump": {("0000:a1:00.0", 79): (1, "critical", "reboot")},
    "xid-79-driver570-open-multiline-no-xid": {("0000:b3:00.0", 79): (1, "critical", "reboot")},
    "xid-79-driver580-595-rtx5090-no-pid": {("0000:06:00.0", 79): (1, "critical", "reboot")},
}
# RmInitAdapter failures by GPU slot.
INIT = {
    "rminitadapter-failed-fedora-syslog": {"0000:09:00.0": "0x22:0x56:894"},
    "rminitadapter-failed-gsp-driver550": {"0000:98:00.0": "0x62:0x65:1792"},
    "rminitadapter-failed-wpr2-gsp-bad-state": {"0000:a1:00.0": "0x62:0x40:2168"},
    "xid-48-gpu-operator-syslog-truncated": {"0000:0a:00.0": "0x24:0x72:1568"},
}
# (NVSwitch slot, SXid) -> (records, fatal)
SXIDS = {"sxid-22013-driver570-open-nvswitch": {("0000:04:00.0", 22013): (3, False)}}
# Xids whose slot the poster redacted, by code.
UNATTRIBUTED = {"xid-145-137-b200-user-redacted-pci": {145: 1, 137: 1}}


def names() -> list[str]:
    """Every corpus file's name without ``.txt``."""
    return sorted(f[:-4] for f in os.listdir(DIR) if f.endswith(".txt") and ".source" not in f)


def path(name: str, directory: str = DIR) -> str:
    return os.path.join(directory, name + ".txt")


# The prefixes dmesg, dmesg -T, syslog and journalctl put before a record's MESSAGE.
_PREFIX = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?:\S+ )?kernel: |kernel: )?"
    r"(?:\[[^\]]*\] )?"
)


def messages(name: str, directory: str = DIR) -> list[str]:
    """The file's records (in ``directory``: the Xid corpus, or another of kernel lines) as
    journald stores their MESSAGE: prefixes removed, indented continuation lines joined with
    newlines."""
    out: list[str] = []
    with open(path(name, directory), encoding="utf-8") as f:
        for line in f.read().splitlines():
            if line[:1] in (" ", "\t") and out:
                out[-1] += "\n" + line.strip()
            elif line.strip():
                out.append(_PREFIX.sub("", line, count=1))
    return out
