"""``slurm-check`` and slurmctld's own view of the node, ``SLURM_NODE_IS_HEALTHY`` (Slurm
26.05.2 and later): the pure agreement (every case), then the command against a fake scontrol
on $PATH that records its calls."""

from __future__ import annotations

import os
import time

import pytest

from gpuagent.commands import drainrecord
from gpuagent.commands.drain import Worst, agreed, critical
from tests.test_drain import REASON, Slurm, check, healthy, record, sick, slurm
from tests.test_status import write_state

__all__ = ["record", "slurm"]  # the fixtures

BAD = critical(sick())
assert BAD is not None and BAD.reason == REASON


@pytest.mark.parametrize("view", [None, "yes", "no", "", "YES", "1", "0", "true", "unset"])
@pytest.mark.parametrize("bad", [None, BAD])
@pytest.mark.parametrize("held", [None, REASON, "gpuagent: 0000:2a:00.0 xid reboot (Xid 79)"])
def test_agreed(view: str | None, bad: Worst | None, held: str | None) -> None:
    said = agreed(view, bad, held)
    # Only what slurmd sets is a view: "yes" with no critical problem, "no" with gpuagent's
    # own drain for this very problem recorded.  Anything else asks scontrol, as before.
    if view == "yes" and bad is None:
        assert said == "no critical GPU problem"
    elif view == "no" and bad is not None and held == REASON:
        assert said == f"drained: {REASON}"
    else:
        assert said is None


def run(slurm: Slurm, view: str | None) -> tuple[int, str, list[str]]:
    """slurm-check as slurmd runs it, with ``view`` in SLURM_NODE_IS_HEALTHY (None: unset)."""
    env = {"SLURMD_NODENAME": "n1"}
    if view is not None:
        env["SLURM_NODE_IS_HEALTHY"] = view
    code, out, err = check(os.path.join(slurm.dir, "c.toml"), env=env)
    return code, out + err, slurm.calls()


def test_agreeing_views_spawn_no_scontrol(slurm: Slurm, record: str) -> None:
    # gpuagent drained the node for a critical problem; slurmctld says it is not healthy.
    write_state(slurm.dir, sick(at=time.time()))
    drainrecord.write(record, {"n1": REASON})
    assert run(slurm, "no") == (
        0,
        f"gpuagent slurm-check: n1: drained: {REASON}; slurmctld agrees"
        " (SLURM_NODE_IS_HEALTHY=no)\n",
        [],
    )
    # No critical problem, and healthy to slurmctld: nothing to resume, whatever the record
    # says (an administrator resumed gpuagent's drain): it forgets the drain.
    write_state(slurm.dir, healthy(time.time()))
    code, said, calls = run(slurm, "yes")
    assert (code, calls) == (0, [])
    assert said.endswith(
        "n1: no critical GPU problem; slurmctld agrees (SLURM_NODE_IS_HEALTHY=yes)\n"
    )
    assert drainrecord.read(record) == ({}, "")
    # No record at all (the first check after an install): written, still without scontrol.
    os.unlink(record)
    assert run(slurm, "yes")[0::2] == (0, [])
    assert drainrecord.read(record) == ({}, "")


def test_differing_or_absent_views_ask_scontrol(slurm: Slurm, record: str) -> None:
    # A critical problem on a node slurmctld finds healthy: drained.
    write_state(slurm.dir, sick(at=time.time()))
    drainrecord.write(record, {})
    code, said, calls = run(slurm, "yes")
    assert (code, calls) == (
        0,
        ["show node n1 -o", f"update NodeName=n1 State=DRAIN Reason={REASON}"],
    )
    assert said == f"gpuagent slurm-check: n1: draining: {REASON}\n"
    # Unhealthy to slurmctld but no drain of gpuagent's recorded: down, in maintenance or
    # drained by another, which only scontrol tells.
    drainrecord.write(record, {})
    slurm.show("MAINTENANCE+RESERVED")
    assert run(slurm, "no")[2] == [
        "show node n1 -o",
        f"update NodeName=n1 State=DRAIN Reason={REASON}",
    ]
    # gpuagent's drain recorded, no critical problem any more, slurmctld says unhealthy: resumed.
    write_state(slurm.dir, healthy(time.time()))
    slurm.show("IDLE+DRAIN", REASON)
    assert run(slurm, "no")[2] == ["show node n1 -o", "update NodeName=n1 State=RESUME"]
    # Unset (before the node registers, or an older slurmd) or a value slurmd never sets: as
    # before.
    for view in (None, "1", "YES", ""):
        write_state(slurm.dir, sick(at=time.time()))
        drainrecord.write(record, {"n1": REASON})
        slurm.show("IDLE+DRAIN", REASON)
        assert run(slurm, view)[2] == ["show node n1 -o"], view
