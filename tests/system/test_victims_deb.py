"""Who a fault hit, under a real systemd (Debian 12 and 13): real processes in a service, a
transient scope and two Slurm step scopes whose control groups are laid out as Slurm's cgroup
v2 plugin lays them out, reported on the GPUs by the fake nvidia-smi with their real PIDs.  A
critical Xid naming one of them and the driver's teardown records naming the others make one
FAULT_VICTIMS record naming each process with its unit and Slurm job, and `gpuagent victims`
prints them.

The Slurm layouts are real control groups, made as slurmstepd makes them
(src/plugins/cgroup/v2/cgroup_v2.c): a scope with Delegate=yes asked of systemd, then the job's
directories made under it with mkdir and the step's process moved in through cgroup.procs:

- ``system.slice/slurmstepd.scope/job_1234/step_0/user/task_0``: before Slurm 26.05, or with
  ``CgroupJobIdPaths=yes``;
- ``system.slice/node1_slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0``: 26.05's default,
  the job's SLUID, here under a second slurmd's scope (``<node>_slurmstepd.scope``).

The sandboxed agent cannot read these processes' /proc: systemd's GetUnitByPID names the scope
and GetUnitProcesses gives each one's control group, where the job is read.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuagent.logs import Event
from tests import fakesysfs
from tests.system.test_deb import (  # noqa: F401 - container and deb are fixtures
    CAPTURE,
    FAKE,
    Container,
    container,
    deb,
    fake_host,
    install,
    need_make_journal,
    one,
    place_journal,
    wait_for,
)
from tests.system.test_processes_deb import sleepers

pytestmark = pytest.mark.system

SERVICE = "train@3.service"
SCOPE = "adhoc-job.scope"
JOB, SLUID = "1234", "sEKNKTV3WPV500"
# Each Slurm scope and the job's directory under it, as Slurm's cgroup v2 plugin names them.
SLURM = {
    "slurmstepd.scope": f"job_{JOB}/step_0/user/task_0",
    "node1_slurmstepd.scope": f"{SLUID}/step_0/user/task_0",
}
TRAIN = "[Service]\nExecStart=/bin/sleep infinity\n"


def scoped(c: Container, unit: str, *properties: str) -> int:
    """A `sleep` in the transient scope ``unit`` (under system.slice); its PID."""
    argv = " ".join(
        [
            "systemd-run --quiet --scope --slice=system.slice",
            *(f"-p {p}" for p in properties),
            f"--unit={unit} -- sleep infinity",
        ]
    )
    # Backgrounded (its output closed) so that this exec returns while the scope lives on.
    c.run("sh", "-c", f"{argv} </dev/null >/dev/null 2>&1 &")
    found = wait_for(f"the sleep in {unit}", lambda: sleepers(c, unit), 30)
    assert len(found) == 1, found
    return found[0]


def into_step(c: Container, unit: str, pid: int, job: str) -> str:
    """Move ``pid`` into ``job``'s step directory under ``unit``'s control group, made as
    slurmstepd makes it; returns the directory (under the cgroup tree's root)."""
    group = c.out("systemctl", "show", "-p", "ControlGroup", "--value", unit)
    assert group == f"/system.slice/{unit}", group
    where = f"{group}/{job}"
    c.run("mkdir", "-p", f"/sys/fs/cgroup{where}")
    c.run("sh", "-c", f"echo {pid} >/sys/fs/cgroup{where}/cgroup.procs")
    # The unified hierarchy's line (the host may list v1 hierarchies too).
    groups = c.out("cat", f"/proc/{pid}/cgroup").splitlines()
    assert f"0::{where}" in groups, groups
    return where


def test_a_fault_names_its_victims_units_and_jobs(
    deb: str,  # noqa: F811
    container: Container,  # noqa: F811
    tmp_path: str,
) -> None:
    c = container
    need_make_journal()
    slots = fakesysfs.gpu_slots(8)
    sick, peer = slots[0], slots[1]
    try:
        install(c, deb)
        # Who is on each GPU every tick, so that the state shows the jobs before the fault (the
        # loop sampler's own period for the read is minutes; its read on the fault's tick is
        # tests/test_processes.py's).
        fake_host(c, {"capture": CAPTURE, "slots": slots}, "processes_interval = 0.5\n")
        wait_for("8 GPUs sampled", lambda: c.prop("StatusText") == "8 GPUs, sampling", 30)
        c.write("/etc/systemd/system/train@.service", TRAIN)
        c.run("systemctl", "daemon-reload")
        c.run("systemctl", "start", SERVICE)
        [trainer] = wait_for("the sleep in the service", lambda: sleepers(c, SERVICE), 30)
        adhoc = scoped(c, SCOPE)
        by_id = scoped(c, "slurmstepd.scope", "Delegate=yes")
        by_sluid = scoped(c, "node1_slurmstepd.scope", "Delegate=yes")
        for unit, pid in (("slurmstepd.scope", by_id), ("node1_slurmstepd.scope", by_sluid)):
            into_step(c, unit, pid, SLURM[unit])
        apps = [
            {"slot": sick, "pid": trainer, "mib": 40960},
            {"slot": sick, "pid": adhoc, "mib": 2048},
            {"slot": sick, "pid": by_id, "mib": 1024},
            {"slot": peer, "pid": by_sluid, "mib": 512},
        ]
        c.write(
            f"{FAKE}/scenario.json", json.dumps({"capture": CAPTURE, "slots": slots, "apps": apps})
        )
        want = {
            trainer: (SERVICE, "service", "train@3"),
            adhoc: (SCOPE, "scope", "adhoc-job"),
            by_id: ("slurmstepd.scope", "slurm", JOB),
            by_sluid: ("node1_slurmstepd.scope", "slurm", SLUID),
        }
        wait_for("the processes' units in the state", lambda: _units(c) == want, 30)

        def device(slot: str) -> str:
            return slot.rpartition(".")[0]

        # The fault names the service's process; the driver tears down the job step's on the
        # GPU and the SLUID job's on its peer, each record naming the fault's Xid.
        place_journal(
            c,
            str(tmp_path),
            f"NVRM: Xid (PCI:{device(sick)}): 119, pid={trainer}, name=python3, Timeout after "
            "6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
            "(GSP_RM_CONTROL) (0x20800a4c 0x4).\n"
            f"NVRM: Xid (PCI:{device(sick)}): 45, pid={by_id}, name=python3, Ch 00000001 "
            "caused by previous Xid 119\n"
            f"NVRM: Xid (PCI:{device(peer)}): 45, pid={by_sluid}, name=python3, Ch 0000000c "
            "caused by previous Xid 119\n",
        )
        record = one(wait_for("the victims", lambda: c.events(Event.FAULT_VICTIMS), 60), "119")
        assert (record["PCI_SLOT"], record["XID"], record["VICTIM_COUNT"]) == (sick, "119", "4")
        victims = [
            {"pid": trainer, "how": "named", "name": "python3", "unit": SERVICE},
            {"pid": by_id, "how": "torn down", "name": "python3", "unit": "slurmstepd.scope"}
            | {"job": JOB},
            {"pid": by_sluid, "how": "torn down", "name": "python3"}
            | {"unit": "node1_slurmstepd.scope", "job": SLUID},
            {"pid": adhoc, "how": "on the GPU", "name": "sleep", "unit": SCOPE},
        ]
        assert json.loads(record["VICTIMS"]) == victims, record
        for words in (
            f"pid {by_id} python3 (torn down, Slurm job {JOB}, slurmstepd.scope)",
            f"pid {by_sluid} python3 (torn down, Slurm job SLUID {SLUID}, node1_slurmstepd",
        ):
            assert words in record["MESSAGE"], record["MESSAGE"]
        # What a requeue script reads (root, or a member of systemd-journal, reads the
        # system journal).
        [fault] = json.loads(c.out("gpuagent", "victims", "--json"))
        assert (fault["pci_slot"], fault["xid"]) == (sick, 119), fault
        printed = [{k: v for k, v in hit.items() if v is not None} for hit in fault["victims"]]
        assert printed == victims, fault
        text = c.out("gpuagent", "victims", sick)
        assert f"Xid 119 hit pid {trainer} python3 (named, {SERVICE})" in text, text
        assert f"Slurm job SLUID {SLUID}" in text, text
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}")
        raise


def _units(c: Container) -> dict[int, tuple[Any, ...]]:
    """Each process on a GPU as the state has it: (unit, unit_kind, unit_ref) by PID."""
    st = json.loads(c.status("--json").stdout)
    return {
        p["pid"]: (p["unit"], p["unit_kind"], p["unit_ref"])
        for g in st["gpus"]
        for p in g.get("processes") or ()
    }
