"""The scheduler's drain in a real Slurm: ../shared/tools/slurm-lab boots a Debian 12 container
(and, for the stuck nvidia-smi, a Debian 13 one too)
with slurmctld and slurmd, the .deb goes in, slurmd's HealthCheckProgram becomes
/usr/sbin/gpuagent-slurm-check, and the agent watches a fake host (as in test_deb) whose GPU
turns critical: the node drains with gpuagent's reason, resumes once the problem clears, or,
for an Xid (which holds until the next boot), once root runs ``gpuagent clear``; an
administrator's drain is left alone; a healthy node's check asks slurmctld nothing, so a
``systemctl restart slurmd`` registers at once even while scontrol would hang (as Slurm
24.11's does before slurmd registers, mej/nhc#159); and the check ends in time with slurmctld
gone.  A stuck nvidia-smi (the fake's process put in a frozen cgroup v1 freezer from the host:
state D, SIGKILL pending until the thaw) drains the node as ``driver_hung``, and its end (the
thaw, three normal answers) resumes it.  The nvidia module unloaded under a drain keeps the
node drained: the problem holds unread until a read shows it gone.
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
from tests.system.test_deb import (
    CAPTURE,
    FAKE,
    FAKE_CONFIG,
    Container,
    fake_host,
    place_journal,
    wait_for,
)
from tests.system.test_package import build
from tests.tools import need

pytestmark = pytest.mark.system

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLURM_LAB = os.path.join(os.path.dirname(REPO), "shared", "tools", "slurm-lab")
LAB = os.path.join(os.path.dirname(REPO), "shared", "tools", "systemd-lab")
# Debian 13's rootfs with Slurm (slurm-lab builds Debian 12's itself), cached as its own is.
ROOTFS = "/var/tmp/slurm-lab-cache/{suite}-slurm.tar.zst"
SLURM_PACKAGES = "slurmctld,slurmd,slurm-client,munge,procps"
WRAPPER = "/usr/sbin/gpuagent-slurm-check"
SLURM_CONF = "/etc/slurm/slurm.conf"
# The wrapper run through one that counts slurmd's health checks, to wait on them, with a
# scontrol first on its PATH that logs each call and hangs while HANG exists.
COUNTED = "/usr/local/sbin/counted-slurm-check"
CHECKS = "/run/gpuagent-test-checks"
SHIM = "/usr/local/lib/gpuagent-test/scontrol"
ASKED = "/run/gpuagent-test-scontrol"
HANG = "/run/gpuagent-test-hang"
RECORD = "/var/lib/gpuagent/slurm-drains.json"
# A slurmd restart must register well within the 20 s a hanging scontrol would cost.
REGISTERED_WITHIN = 8.0


@pytest.fixture(params=["bookworm"])
def lab(request: pytest.FixtureRequest) -> Iterator[Container]:
    """A booted container of Debian ``request.param`` with Slurm ready: slurm-lab's own
    Debian 12 rootfs, or for Debian 13 a rootfs of that release with Slurm built by
    systemd-lab (slurmd and slurmctld fail once before slurm-lab writes their config, so that
    boot is given longer to settle)."""
    need(os.geteuid() == 0, "slurm-lab needs root")
    need(os.access(SLURM_LAB, os.X_OK), f"{SLURM_LAB} is missing")
    suite = request.param
    c = Container(f"gpuagent-slurm-{suite}-{os.getpid()}")
    env = {**os.environ, "SYSTEMD_LAB_SUITE": suite, "SYSTEMD_LAB_BOOT_TIMEOUT": "240"}
    argv = [SLURM_LAB, "up", c.name]
    if suite != "bookworm":
        rootfs = ROOTFS.format(suite=suite)
        made = subprocess.run(
            [LAB, "rootfs", rootfs, SLURM_PACKAGES],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            timeout=900,
        )
        assert made.returncode == 0, made.stdout + made.stderr
        argv.append(rootfs)
    try:
        up = subprocess.run(argv, capture_output=True, text=True, check=False, env=env, timeout=600)
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
        restart_registers_at_once(c)
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
    dark_keeps_the_drain(c, sick, reason)
    scenario(c, None)
    wait_for("the node resumed", lambda: s.state() == "IDLE", 40)
    assert s.reason() == ""


def dark_keeps_the_drain(c: Container, sick: str, reason: str) -> None:
    """The nvidia module unloaded under the drain (a driver upgrade): nobody reset the GPU, so
    the problem holds unread and slurm-check keeps the node drained; the module back, the
    read decides (issue 39)."""
    s = Slurm(c)
    c.run("rm", "-r", f"{FAKE}/sys/module/nvidia")

    def unread() -> bool:
        st = json.loads(c.run("gpuagent", "status", "--json", check=False).stdout)
        gpu = next(g for g in st["gpus"] if g["pci_slot"] == sick)
        return any("unread_since" in p for p in gpu["problems"])

    wait_for("the problem held unread", unread, 30)
    hand = c.run("env", f"SLURMD_NODENAME={c.name}", WRAPPER, check=False)
    assert hand.returncode == 0, hand.stderr
    assert "resuming" not in hand.stdout and f"drained: {reason}" in hand.stdout, hand.stdout
    assert (s.reason(), "DRAIN" in s.state()) == (reason, True)
    assert f"{sick}: recovery_action cleared" not in c.journal()
    c.run("mkdir", "-p", f"{FAKE}/sys/module/nvidia")
    wait_for("read again", lambda: not unread(), 30)


def cleared_by_root(c: Container, work: str) -> None:
    """An Xid holds until the next boot: the node drains, and resumes after root's clear."""
    s = Slurm(c)
    sick = fakesysfs.gpu_slots(8)[2]
    fell = f"NVRM: Xid (PCI:{sick[:-2]}): 79, pid='<unknown>', name=<unknown>, GPU has fallen"
    place_journal(c, work, f"{fell} off the bus.\n", name="slurm-xid")
    # The reason says a clear, not the reboot alone, ends it.
    reason = f"gpuagent: {sick} xid reboot (Xid 79); then gpuagent clear"
    wait_for("the Xid's drain", lambda: s.reason() == reason, 40)
    assert "DRAIN" in s.state()
    said = c.out("gpuagent", "clear", sick, "xid")
    assert said.startswith(f"{sick}: xid cleared by root"), said
    wait_for("the node resumed after the clear", lambda: s.state() == "IDLE", 40)
    assert s.reason() == ""


def count_checks(c: Container) -> None:
    """slurmd's HealthCheckProgram becomes the wrapper run through one that counts."""
    s = Slurm(c)
    c.write(
        SHIM,
        f'#!/bin/sh\necho "$*" >>{ASKED}\n[ -e {HANG} ] && sleep 60\nexec /usr/bin/scontrol "$@"\n',
    )
    c.write(
        COUNTED,
        f'#!/bin/sh\necho >>{CHECKS}\nPATH={os.path.dirname(SHIM)}:$PATH exec {WRAPPER} "$@"\n',
    )
    c.run("chmod", "755", COUNTED, SHIM)
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


# Inside the container: restart slurmd, then wait (with a deadline) until slurmctld shows the
# node registered by the new slurmd (a new SlurmdStartTime) and responding; print the seconds.
RESTART = """\
import re, subprocess, sys, time
node, deadline = sys.argv[1], float(sys.argv[2])
def show():
    out = subprocess.run(["/usr/bin/scontrol", "show", "node", node, "-o"],
                         capture_output=True, text=True, timeout=10).stdout
    started = re.search(r"SlurmdStartTime=(\\S+)", out)
    state = re.search(r"State=(\\S+)", out)
    return (started.group(1) if started else ""), (state.group(1) if state else "")
before, _ = show()
start = time.monotonic()
subprocess.run(["systemctl", "restart", "slurmd"], check=True, timeout=60)
while True:
    started, state = show()
    took = time.monotonic() - start
    if started not in ("", before) and "*" not in state and "NOT_RESPONDING" not in state:
        print(f"{took:.2f} {state}")
        break
    if took > deadline:
        sys.exit(f"not registered after {took:.2f} s: SlurmdStartTime={started} State={state}")
    time.sleep(0.1)
"""

# Inside the container: run the wrapper as slurmd would, print its exit status and seconds.
TIMED = """\
import subprocess, sys, time
start = time.monotonic()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=90)
print(proc.returncode, f"{time.monotonic() - start:.2f}")
print(proc.stdout + proc.stderr, end="")
"""


def timed_check(c: Container) -> tuple[int, float, str]:
    """The wrapper run by hand: its exit status, the seconds it took and what it printed."""
    out = c.out("python3", "-c", TIMED, "env", f"SLURMD_NODENAME={c.name}", WRAPPER)
    first, _, said = out.partition("\n")
    code, took = first.split()
    return int(code), float(took), said


def restart_registers_at_once(c: Container) -> None:
    """No critical problem and no drain of gpuagent's: slurmd's health check asks slurmctld
    nothing, so a restart registers at once even while scontrol hangs."""
    s = Slurm(c)
    assert "DRAIN" not in s.state()
    assert json.loads(c.out("cat", RECORD)) == {"drained": {}}
    # The agent's restart leaves root's record as it is in the directory systemd gave the agent.
    c.run("systemctl", "restart", "gpuagent")
    wait_for("the agent back", lambda: c.run("gpuagent", "status", check=False).returncode == 0, 30)
    owners = c.out("stat", "-c", "%U %a", os.path.dirname(RECORD), RECORD).splitlines()
    assert owners == ["gpuagent 755", "root 644"], owners
    c.run("sh", "-c", f"rm -f {ASKED}; touch {HANG}")
    log = int(c.out("stat", "-c", "%s", "/var/log/slurm/slurmd.log"))
    ran = checks(c)
    try:
        took, state = c.out("python3", "-c", RESTART, c.name, str(REGISTERED_WITHIN)).split()
        print(f"slurmd restarted and registered in {took} s ({state})")
        wait_checks(c, 1)
    finally:
        c.run("rm", "-f", HANG)
    assert checks(c) > ran
    assert c.run("cat", ASKED, check=False).stdout == ""  # scontrol never asked
    since = c.out("tail", "-c", f"+{log + 1}", "/var/log/slurm/slurmd.log")
    assert "health_check failed" not in since, since
    assert float(took) < REGISTERED_WITHIN


def slurmctld_gone(c: Container) -> None:
    """slurmctld stopped: a healthy node's check still exits 0 at once; one that must drain
    ends within slurmd's 60 s, and says why."""
    c.run("systemctl", "stop", "slurmctld")
    code, took, said = timed_check(c)
    print(f"the healthy check with slurmctld gone: exit {code} in {took:.2f} s")
    assert (code, said) == (0, f"gpuagent slurm-check: {c.name}: no critical GPU problem")
    assert took < 5, took
    scenario(c, fakesysfs.gpu_slots(8)[3])
    wait_for(
        "the critical problem", lambda: c.run("gpuagent", "status", check=False).returncode == 2, 20
    )
    start = time.monotonic()
    proc = c.run("env", f"SLURMD_NODENAME={c.name}", WRAPPER, check=False, timeout=90)
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert took < 60, took
    assert proc.stderr.startswith(f"gpuagent slurm-check: {c.name}: scontrol show node"), (
        proc.stderr
    )


# The host's cgroup v1 freezer: a task frozen there sleeps uninterruptibly (state D) and a
# SIGKILL stays pending until the thaw, as for a child stuck in the driver (a cgroup v2
# freezer lets a fatal signal through).
FREEZER = "/sys/fs/cgroup/freezer"
SMI = b"fake_nvidia_smi.py"


def container_pids(c: Container) -> set[int]:
    """The host's pids of every process in the container (systemd-lab's cgroups)."""
    pids: set[int] = set()
    for top in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup"):
        for root, _, files in os.walk(os.path.join(top, f"systemd-lab-{c.name}")):
            if "cgroup.procs" in files:
                with open(os.path.join(root, "cgroup.procs")) as f:
                    pids.update(int(p) for p in f.read().split())
    return pids


def freeze_smi(c: Container, frozen: str) -> int:
    """Move the container's fake nvidia-smi processes into ``frozen``; how many it moved."""
    moved = 0
    for pid in container_pids(c):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if SMI not in f.read():
                    continue
            with open(os.path.join(frozen, "tasks"), "w") as f:
                f.write(str(pid))
            moved += 1
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended between the listing and the move
    return moved


def emptied(cgroup: str) -> bool:
    """Whether no task is left in ``cgroup``."""
    with open(os.path.join(cgroup, "tasks")) as f:
        return not f.read().strip()


@pytest.mark.parametrize("lab", ["bookworm", "trixie"], indirect=True)
def test_a_stuck_nvidia_smi_drains_the_node_and_its_end_resumes_it(
    tmp_path: str, lab: Container
) -> None:
    # NVIDIA/nvidia-docker#377: "an unkillable nvidia-smi means the driver is hung"; issue 24:
    # status said critical while slurm-check said "no critical GPU problem".
    need(os.path.isdir(FREEZER), "no cgroup v1 freezer on this host")
    c = lab
    s = Slurm(c)
    frozen = os.path.join(FREEZER, f"gpuagent-test-{os.getpid()}")
    os.mkdir(frozen)
    try:
        with open(os.path.join(frozen, "freezer.state"), "w") as f:
            f.write("FROZEN")
        deb = build(str(tmp_path))
        c.copy(deb, "/root/")
        c.apt("update")
        c.apt("install", f"/root/{os.path.basename(deb)}")
        fake_host(c, {"capture": CAPTURE, "slots": fakesysfs.gpu_slots(8)})
        # Ticks of 5 s, a probe of 4: time to find the hanging fake and freeze it.
        c.write(f"{FAKE}/gpuagent.toml", FAKE_CONFIG.replace("interval = 0.5", "interval = 5"))
        c.run("systemctl", "restart", "gpuagent")
        wait_for("8 GPUs sampled", lambda: c.prop("StatusText") == "8 GPUs, sampling", 30)
        c.run("sed", "-i", "/^HealthCheck/d", SLURM_CONF)
        lines = f"HealthCheckProgram={WRAPPER}\nHealthCheckInterval=10\nHealthCheckNodeState=ANY\n"
        c.run("sh", "-c", f"cat >>{SLURM_CONF}", stdin=lines)
        c.run("systemctl", "restart", "slurmctld", "slurmd")
        wait_for("the node idle", lambda: s.state() == "IDLE", 60)
        c.write(f"{FAKE}/scenario.json", json.dumps({"hang": 600}))

        def stuck() -> bool:
            freeze_smi(c, frozen)
            st = json.loads(c.run("gpuagent", "status", "--json", check=False).stdout or "{}")
            return bool(st) and st["probe"]["state"] == "stuck"

        wait_for("nvidia-smi stuck in the driver", stuck, 60)
        st = json.loads(c.run("gpuagent", "status", "--json", check=False).stdout)
        hung = [(p["kind"], p["severity"], p["action"]) for p in st["host_problems"]]
        assert hung == [("driver_hung", "critical", "reboot")], st["host_problems"]
        assert c.run("gpuagent", "status", check=False).returncode == 2
        reason = "gpuagent: host driver_hung reboot"
        wait_for("the driver_hung drain", lambda: s.reason() == reason, 40)
        assert "DRAIN" in s.state()
        # The end: the thaw lets the pending SIGKILL through, nvidia-smi answers 3 times.
        c.write(
            f"{FAKE}/scenario.json",
            json.dumps({"capture": CAPTURE, "slots": fakesysfs.gpu_slots(8)}),
        )
        with open(os.path.join(frozen, "freezer.state"), "w") as f:
            f.write("THAWED")
        wait_for("the node resumed", lambda: s.state() == "IDLE", 120)
        # Slurm 24.11 (Debian 13) keeps the last reason on a resumed node; 22.05 drops it.
        assert s.reason() in ("", reason)
        st = json.loads(c.out("gpuagent", "status", "--json"))
        assert st["host_problems"] == []
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}\n--- the node ---\n{s.show()}")
        raise
    finally:
        with open(os.path.join(frozen, "freezer.state"), "w") as f:
            f.write("THAWED")
        wait_for("the frozen cgroup empty", lambda: emptied(frozen), 30)
        os.rmdir(frozen)
