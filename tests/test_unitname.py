"""gpuagent.edges.systemd.unitname: what a unit's name says, for each kind of unit."""

from __future__ import annotations

import pytest

from gpuagent.edges.systemd.unitname import Owner, classify, slurm_job

DOCKER = "3f4e5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f"


@pytest.mark.parametrize(
    ("unit", "cgroup", "owner", "words"),
    [
        ("train@3.service", None, Owner("service", "train@3"), "service"),
        ("ollama.service", None, Owner("service", "ollama"), "service"),
        ("user@1000.service", None, Owner("user", "1000"), "user 1000"),
        ("session-3.scope", None, Owner("session", "3"), "login session 3"),
        ("session-c2.scope", None, Owner("session", "c2"), "login session c2"),
        (
            f"docker-{DOCKER}.scope",
            None,
            Owner("container", "docker:3f4e5a6b7c8d"),
            "docker container 3f4e5a6b7c8d",
        ),
        (
            f"libpod-{DOCKER}.scope",
            None,
            Owner("container", "podman:3f4e5a6b7c8d"),
            "podman container 3f4e5a6b7c8d",
        ),
        (
            f"cri-containerd-{DOCKER}.scope",
            None,
            Owner("container", "containerd:3f4e5a6b7c8d"),
            "containerd container 3f4e5a6b7c8d",
        ),
        (
            f"crio-{DOCKER}.scope",
            None,
            Owner("container", "cri-o:3f4e5a6b7c8d"),
            "cri-o container 3f4e5a6b7c8d",
        ),
        ("machine-gpu1.scope", None, Owner("machine", "gpu1"), "machine gpu1"),
        (
            "slurmstepd.scope",
            "/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0",
            Owner("slurm", "1234"),
            "Slurm job 1234",
        ),
        (
            "slurmstepd.scope",
            "/system.slice/slurmstepd.scope/system",
            Owner("slurm"),
            "a Slurm job step",
        ),
        ("slurmstepd.scope", None, Owner("slurm"), "a Slurm job step"),
        # Slurm 26.05's cgroup v2 default: the job's directory is its SLUID (cgroup.conf(5)'s
        # example), shown as such.
        (
            "slurmstepd.scope",
            "/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0",
            Owner("slurm", "sEKNKTV3WPV500"),
            "Slurm job SLUID sEKNKTV3WPV500",
        ),
        # Several slurmd on one host (MULTIPLE_SLURMD): the scope carries the node's name.
        (
            "node1_slurmstepd.scope",
            "/system.slice/node1_slurmstepd.scope/job_1234/step_batch/user/task_0",
            Owner("slurm", "1234"),
            "Slurm job 1234",
        ),
        (
            "gpu-a_b_slurmstepd.scope",
            "/system.slice/gpu-a_b_slurmstepd.scope/sEKNKTV3WPV500/step_extern/user/task_special",
            Owner("slurm", "sEKNKTV3WPV500"),
            "Slurm job SLUID sEKNKTV3WPV500",
        ),
        ("node1_slurmstepd.scope", None, Owner("slurm"), "a Slurm job step"),
        ("notslurmstepd.scope", None, Owner("scope", "notslurmstepd"), "scope"),
        ("run-u42.scope", None, Owner("scope", "run-u42"), "scope"),
        ("init.scope", None, Owner("scope", "init"), "scope"),
        ("-.slice", None, Owner("other", "-.slice"), "other"),
        (None, None, Owner("unknown"), "no unit systemd knows"),
        # Not a container id: hex of 12 or more only.
        ("docker-compose.scope", None, Owner("scope", "docker-compose"), "scope"),
        ("libpod-conmon-xyz.scope", None, Owner("scope", "libpod-conmon-xyz"), "scope"),
    ],
)
def test_each_kind(unit: str | None, cgroup: str | None, owner: Owner, words: str) -> None:
    assert classify(unit, cgroup) == owner
    assert owner.describe() == words


@pytest.mark.parametrize(
    ("cgroup", "job"),
    [
        ("/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0", "77"),
        ("/slurm/uid_1000/job_9/step_0", "9"),
        ("/system.slice/slurmstepd.scope/job_5", "5"),
        ("/system.slice/slurmstepd.scope/system", None),
        ("/system.slice/myjob_5/x", None),
        ("", None),
        # 26.05's SLUID layout, and its slurmstepd's own cgroup beside the jobs'.
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0", "sEKNKTV3WPV500"),
        ("/system.slice/slurmstepd.scope/s0000000000001", "s0000000000001"),
        ("/system.slice/node1_slurmstepd.scope/sEKNKTV3WPV500/step_batch", "sEKNKTV3WPV500"),
        ("/system.slice/slurmstepd.scope/job_77/step_0", "77"),
        ("/system.slice/node1_slurmstepd.scope/job_77/step_0", "77"),
        # Not a SLUID: lower case, too short or long, base32's I L O U, or not under the scope.
        ("/system.slice/slurmstepd.scope/sekn1tv3wpv500/step_0", None),
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV50/step_0", None),
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV5000/step_0", None),
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPVU00/step_0", None),
        ("/system.slice/other.scope/sEKNKTV3WPV500/step_0", None),
        ("/system.slice/slurmstepd.scope/slurm", None),
    ],
)
def test_the_slurm_job_in_a_control_group(cgroup: str, job: str | None) -> None:
    assert slurm_job(cgroup) == job
