"""packaging/gpuagent.service: `systemd-analyze verify` clean, exposure <= 1.5, no device traps.

Runs on the host, offline: no booted systemd needed. tests/system/test_deb.py checks the
installed unit again inside a booted container.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from tests.tools import tool

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(REPO, "packaging", "gpuagent.service")
MAN = os.path.join(REPO, "man", "gpuagent.8")
MAX_EXPOSURE = 1.5
# Options that lock the agent out of /dev/nvidia* or /proc/driver/nvidia (see the unit).
DEVICE_TRAPS = ("PrivateDevices", "ProcSubset", "DevicePolicy", "DeviceAllow")


def settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    with open(UNIT, encoding="utf-8") as f:
        for line in f:
            if "=" in line and not line.startswith(("#", "[")):
                key, _, value = line.strip().partition("=")
                out.setdefault(key, []).append(value)
    return out


def fake_root(root: str) -> None:
    """A root holding the host's system units, the unit, its commands and its man page."""
    units = "/usr/lib/systemd/system"
    if not os.path.isdir(units):
        units = "/lib/systemd/system"
    shutil.copytree(units, os.path.join(root, "usr/lib/systemd/system"), symlinks=True)
    os.makedirs(os.path.join(root, "usr/bin"))
    os.symlink("usr/bin", os.path.join(root, "bin"))
    os.symlink("usr/lib", os.path.join(root, "lib"))
    shutil.copy(UNIT, os.path.join(root, "usr/lib/systemd/system"))
    with open(os.path.join(root, "usr/bin/gpuagent"), "w", encoding="ascii") as f:
        f.write("#!/bin/sh\n")
    os.chmod(os.path.join(root, "usr/bin/gpuagent"), 0o700)
    os.makedirs(os.path.join(root, "usr/share/man/man8"))
    shutil.copy(MAN, os.path.join(root, "usr/share/man/man8"))


def test_verify_is_clean(tmp_path: str) -> None:
    root = str(tmp_path)
    fake_root(root)
    tool("man")  # verify checks Documentation=man:gpuagent(8) with man(1)
    env = {
        **os.environ,
        "MANPATH": os.path.join(root, "usr/share/man"),
        "SYSTEMD_LOG_LEVEL": "notice",
    }
    proc = subprocess.run(
        [tool("systemd-analyze"), "verify", f"--root={root}", "gpuagent.service"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


def test_exposure_is_at_most_1_5() -> None:
    proc = subprocess.run(
        [tool("systemd-analyze"), "security", "--offline=yes", "--no-pager", UNIT],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    m = re.search(r"Overall exposure level for gpuagent\.service: (\d+\.\d+)", proc.stdout)
    assert m is not None, proc.stdout + proc.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE, proc.stdout


def test_device_traps_are_left_out_with_a_reason() -> None:
    with open(UNIT, encoding="utf-8") as f:
        comments = "".join(line for line in f if line.startswith("#"))
    found = settings()
    for option in DEVICE_TRAPS:
        assert option not in found
        assert option in comments, f"no comment on why {option} is left out"


def test_the_issue_s_settings() -> None:
    s = settings()
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "ExecStart": "/usr/bin/gpuagent run",
        "Restart": "on-failure",
        "RestartPreventExitStatus": "78",
        "RuntimeDirectory": "gpuagent",
        "RuntimeDirectoryMode": "0755",
        # A static system user: the system bus refuses a dynamic one.
        "User": "gpuagent",
        "Group": "gpuagent",
        # $STATE_DIRECTORY: the GPUs this host had (known.py).
        "StateDirectory": "gpuagent",
        "SupplementaryGroups": "video systemd-journal",
        "Documentation": "man:gpuagent(8)",
        "CapabilityBoundingSet": "",
        "AmbientCapabilities": "",
        "PrivateNetwork": "yes",
        "RestrictAddressFamilies": "AF_UNIX",
        # Left out: before systemd 252 (Ubuntu 22.04) it shuts /dev/nvidia* out.
        "ProtectClock": None,
        # nvidia-smi's memory and time grow with the open-file limit.
        "LimitNOFILE": "1024",
    }
    assert {k: s.get(k, [None])[0] for k in expected} == expected
    # Checked first, then signalled without kill(1), which a minimal image lacks.
    assert s["ExecReload"] == [
        "/usr/bin/gpuagent check-config --quiet",
        "-+/usr/bin/gpuagent link-textfile",
        "/usr/bin/gpuagent reload $MAINPID",
    ]
    # A stopped agent's state would read as a live one's.
    assert "RuntimeDirectoryPreserve" not in s
    # Everything DynamicUser=yes implied (systemd.exec(5)), written out.
    assert "DynamicUser" not in s
    implied = {
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "RemoveIPC": "yes",
        "NoNewPrivileges": "yes",
        "RestrictSUIDSGID": "yes",
    }
    assert {k: s.get(k, [None])[0] for k in implied} == implied
    assert s["ProtectHome"][0] in ("yes", "read-only")
    assert "@system-service" in s["SystemCallFilter"]
    assert s["WatchdogSec"] and s["MemoryMax"] and s["TasksMax"]
