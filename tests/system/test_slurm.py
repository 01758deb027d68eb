"""The scheduler's drain in a real Slurm: ../shared/tools/slurm-lab boots a Debian 12 container
with slurmctld and slurmd, the .deb goes in, slurmd's HealthCheckProgram becomes
/usr/sbin/gpuagent-slurm-check, and the agent watches a fake host (as in test_deb) whose GPU
turns critical: the node drains with gpuagent's reason, resumes once the problem clears, or,
for an Xid (which holds until the next boot), once root runs ``gpuagent clear``; an
administrator's drain is left alone, and the check ends in time with slurmctld gone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests import fakesysfs
from tests.system.test_deb import CAPTURE, FAKE, Container, fake_host, place_journal, wait_for
from tests.system.test_package import build
from tests.tools import need

pytestmark = pytest.mark.system

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLURM_LAB = os.path.join(os.path.dirname(REPO), "shared", "tools", "slurm-lab")
WRAPPER = "/usr/sbin/gpuagent-slurm-check"
SLURM_CONF = "/etc/slurm/slurm.conf"
# The wrapper run through one that counts slurmd's health checks, to wait on them.
COUNTED = "/usr/local/sbin/counted-slurm-check"
CHECKS = "/run/gpuagent-test-checks"


@pytest.fixture
def lab() -> Iterator[Container]:
    need(os.geteuid() == 0, "slurm-lab needs root")
    need(os.access(SLURM_LAB, os.X_OK), f"{SLURM_LAB} is missing")
    c = Container(f"gpuagent-slurm-{os.getpid()}")
    try:
        up = subprocess.run(
            [SLURM_LAB, "up", c.name], capture_output=True, text=True, check=False, timeout=600
        )
        assert up.returncode == 0, up.stdout + up.stderr
        yield c
    finally:
        subprocess.run([SLURM_LAB, "down", c.name], check=False, timeout=120)


class Slurm:
    """The lab's one node as scontrol shows it."""

    def __init__(self, c: Container) -> None:
        self.c = c

    def show(self) -> str:
        return self.c.out("scontrol", "show", "node", self.c.name, "-o")

    def state(self) -> str:
        m = re.search(r"\bState=(\S+)", self.show())
        assert m is not None, self.show()
        return m.group(1)

    def reason(self) -> str:
        m = re.search(r"\bReason=(.*?) \[[^]]*\]$", self.show())
        return m.group(1) if m else ""


def scenario(c: Container, sick: str | None) -> None:
    slots = fakesysfs.gpu_slots(8)
    step: dict[str, object] = {"capture": CAPTURE, "slots": slots}
    if sick is not None:
        step["override"] = {sick: {"gpu_recovery_action": "Reset"}}
    c.write(f"{FAKE}/scenario.json", json.dumps(step))


def test_slurm_drains_and_resumes_only_its_own(tmp_path: str, lab: Container) -> None:
    c = lab
    deb = build(str(tmp_path))
    try:
        c.copy(deb, "/root/")
        c.apt("update")
        c.apt("install", f"/root/{os.path.basename(deb)}")
        fake_host(c, {"capture": CAPTURE, "slots": fakesysfs.gpu_slots(8)})
        wait_for("8 GPUs sampled", lambda: c.prop("StatusText") == "8 GPUs, sampling", 30)
        drained_by_us(c)
        cleared_by_root(c, tmp_path)
        admin_drain(c)
        slurmctld_gone(c)
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}")
        print(c.run("journalctl", "-u", "slurmd", "--no-pager", check=False).stdout[-4000:])
        raise


def drained_by_us(c: Container) -> None:
    """README's slurm.conf lines: the wrapper drains on the critical GPU, resumes after."""
    s = Slurm(c)
    c.run("sed", "-i", "/^HealthCheck/d", SLURM_CONF)
    lines = f"HealthCheckProgram={WRAPPER}\nHealthCheckInterval=10\nHealthCheckNodeState=ANY\n"
    c.run("sh", "-c", f"cat >>{SLURM_CONF}", stdin=lines)
    c.run("systemctl", "restart", "slurmctld", "slurmd")
    wait_for("the node idle", lambda: s.state() == "IDLE", 60)
    sick = fakesysfs.gpu_slots(8)[0]
    scenario(c, sick)
    reason = f"gpuagent: {sick} recovery_action reset_gpu"
    wait_for("the gpuagent: drain", lambda: s.reason() == reason, 40)
    assert "DRAIN" in s.state()
    scenario(c, None)
    wait_for("the node resumed", lambda: s.state() == "IDLE", 40)
    assert s.reason() == ""


def cleared_by_root(c: Container, work: str) -> None:
    """An Xid holds until the next boot: the node drains, and resumes after root's clear."""
    s = Slurm(c)
    sick = fakesysfs.gpu_slots(8)[2]
    fell = f"NVRM: Xid (PCI:{sick[:-2]}): 79, pid='<unknown>', name=<unknown>, GPU has fallen"
    place_journal(c, work, f"{fell} off the bus.\n", name="slurm-xid")
    reason = f"gpuagent: {sick} xid reboot"
    wait_for("the Xid's drain", lambda: s.reason() == reason, 40)
    assert "DRAIN" in s.state()
    said = c.out("gpuagent", "clear", sick, "xid")
    assert said.startswith(f"{sick}: xid cleared by root"), said
    wait_for("the node resumed after the clear", lambda: s.state() == "IDLE", 40)
    assert s.reason() == ""


def count_checks(c: Container) -> None:
    """slurmd's HealthCheckProgram becomes the wrapper run through one that counts."""
    s = Slurm(c)
    c.write(COUNTED, f'#!/bin/sh\necho >>{CHECKS}\nexec {WRAPPER} "$@"\n')
    c.run("chmod", "755", COUNTED)
    c.run("sed", "-i", f"s|^HealthCheckProgram=.*|HealthCheckProgram={COUNTED}|", SLURM_CONF)
    c.run("systemctl", "restart", "slurmctld", "slurmd")
    wait_for("the node idle", lambda: s.state() == "IDLE", 60)


def checks(c: Container) -> int:
    return int(c.out("sh", "-c", f"cat {CHECKS} 2>/dev/null | wc -l"))


def wait_checks(c: Container, n: int) -> None:
    """Wait until slurmd has run ``n`` more health checks (every 10 s)."""
    start = checks(c)
    wait_for(f"{n} more health checks by slurmd", lambda: checks(c) >= start + n, 60)


def admin_drain(c: Container) -> None:
    """An administrator's drain stays, through a critical problem and its end."""
    s = Slurm(c)
    count_checks(c)
    c.run("scontrol", "update", f"NodeName={c.name}", "State=DRAIN", "Reason=admin: bad fan")
    sick = fakesysfs.gpu_slots(8)[1]
    scenario(c, sick)
    hand = ("env", f"SLURMD_NODENAME={c.name}", WRAPPER)
    wait_for(
        "the critical problem", lambda: c.run("gpuagent", "status", check=False).returncode == 2, 20
    )
    by_hand = c.run(*hand, check=False)
    assert by_hand.returncode == 0, by_hand.stderr
    assert "left as drained by another: admin: bad fan" in by_hand.stdout
    wait_checks(c, 2)
    assert (s.reason(), "DRAIN" in s.state()) == ("admin: bad fan", True)
    scenario(c, None)
    wait_for(
        "the problem's end", lambda: c.run("gpuagent", "status", check=False).returncode == 0, 20
    )
    wait_checks(c, 2)
    assert (s.reason(), "DRAIN" in s.state()) == ("admin: bad fan", True)
    c.run("scontrol", "update", f"NodeName={c.name}", "State=RESUME")


def slurmctld_gone(c: Container) -> None:
    """slurmctld stopped: the check still ends within slurmd's 60 s, and says why."""
    c.run("systemctl", "stop", "slurmctld")
    start = time.monotonic()
    proc = c.run("env", f"SLURMD_NODENAME={c.name}", WRAPPER, check=False, timeout=90)
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert took < 60, took
    assert proc.stderr.startswith(f"gpuagent slurm-check: {c.name}: scontrol show node"), (
        proc.stderr
    )
