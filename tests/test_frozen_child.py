"""A real nvidia-smi child that SIGKILL cannot reap: the fake nvidia-smi joins a frozen cgroup
v1 freezer (its tasks sleep uninterruptibly, state D, as a child stuck in the driver does:
NVIDIA/nvidia-docker#377), so the runner's SIGKILL stays pending until the thaw.

The writer makes it a critical ``driver_hung`` at once (action reboot) that every surface
reads (``status`` exits 2, Slurm's drain reason names it); after the thaw the child is reaped,
and three normal answers in a row end it.  Root and a cgroup v1 freezer only (a cgroup v2
freezer lets a fatal signal through), skipped elsewhere.  A property of the host, not of a
fresh container: marked ``system``, so it runs with the booted tests (on the CI host, root with
the v1 freezer) and not in fresh-check, whose containers have no freezer of their own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from gpuagent.commands import drain
from gpuagent.commands.status import ExitCode, judge
from gpuagent.schema import ProbeState
from tests.conftest import Host
from tests.fakehost import FAKE_SMI

FREEZER = "/sys/fs/cgroup/freezer"


pytestmark = pytest.mark.system


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


@pytest.fixture
def frozen() -> Iterator[str]:
    """A frozen cgroup v1 freezer of this test's own; thawed and removed after."""
    # Not a tool CI installs: a property of the machine, so a skip there too.
    if os.geteuid() != 0 or not os.path.isdir(FREEZER):
        pytest.skip("needs root and a cgroup v1 freezer")
    path = os.path.join(FREEZER, f"gpuagent-test-{os.getpid()}")
    os.mkdir(path)
    try:
        _write(os.path.join(path, "freezer.state"), "FROZEN")
        yield path
    finally:
        _write(os.path.join(path, "freezer.state"), "THAWED")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(os.path.join(path, "tasks")) as f:
                if not f.read().strip():
                    break
            time.sleep(0.05)
        os.rmdir(path)


def test_a_child_in_d_state_drains_at_once_and_three_answers_end_it(
    host: Host, frozen: str
) -> None:
    # nvidia-smi as a wrapper that joins the frozen cgroup: frozen on its way back from the
    # write, before it prints anything.
    os.unlink(host.smi)
    _write(host.smi, f'#!/bin/sh\necho $$ >{frozen}/tasks\nexec {FAKE_SMI} "$@"\n')
    os.chmod(host.smi, 0o700)
    host.make_agent(probe_timeout=0.5)
    report = host.tick()
    assert host.probe["state"] == ProbeState.STUCK
    assert host.runner is not None and host.runner.stuck is not None
    with open(f"/proc/{host.runner.stuck.pid}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] == "D"
    (hung,) = report.state["host_problems"]
    assert (hung["kind"], hung["severity"], hung["action"]) == ("driver_hung", "critical", "reboot")
    now = time.time()
    assert judge(report.state, now)[0] == ExitCode.CRITICAL
    assert drain.reason(report.state, "", now) == (True, "gpuagent: host driver_hung reboot")
    spawns = host.spawns
    host.tick(3)
    assert host.spawns == spawns  # no second child while the first lives
    # The thaw: the pending SIGKILL ends the child, the runner reaps it, nvidia-smi answers.
    _write(os.path.join(frozen, "freezer.state"), "THAWED")
    os.unlink(host.smi)
    os.symlink(FAKE_SMI, host.smi)
    host.healthy()
    host.patient()
    for _ in range(10):  # the backoff's cap is 6 ticks
        if host.tick().state["probe"]["state"] == ProbeState.OK:
            break
    else:
        pytest.fail(f"no answer 10 ticks after the thaw: {host.probe}")
    assert [p["kind"] for p in host.state["host_problems"]] == ["driver_hung"]  # one answer
    host.tick(2)
    assert host.state["host_problems"] == []
    assert drain.reason(host.state, "", time.time()) == (True, "")


def test_a_loop_child_in_d_state_is_driver_hung_at_once(host: Host, frozen: str) -> None:
    """sampler = "loop": the loop child (not the first spawn) joins the frozen cgroup; it
    stalls, outlives SIGKILL and is the runner's stuck child: driver_hung at once."""
    os.unlink(host.smi)
    _write(
        host.smi,
        f'#!/bin/sh\ncase "$*" in *-lms*) echo $$ >{frozen}/tasks;; esac\n'
        f'FAKE_NVIDIA_SMI_SCENARIO={host.smi}.json exec {FAKE_SMI} "$@"\n',
    )
    os.chmod(host.smi, 0o700)
    host.make_agent(sampler="loop", interval=1.0, probe_timeout=0.5)
    assert host.agent is not None
    try:
        host.tick()
        end = time.monotonic() + 30
        while host.probe["state"] != ProbeState.STUCK:
            assert time.monotonic() < end, host.probe
            host.tick()
        assert host.runner is not None and host.runner.stuck is not None
        kinds = [(p["kind"], p["action"]) for p in host.state["host_problems"]]
        assert ("driver_hung", "reboot") in kinds
    finally:
        _write(os.path.join(frozen, "freezer.state"), "THAWED")
        host.agent.close()
