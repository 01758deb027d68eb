"""What a systemd unit's name says about who runs a process (pure).

systemd's ``GetUnitByPID`` answers with the unit a process is in; its name tells the kind:

- ``train@3.service``: a system service (``service``, the name before ``.service``);
- ``user@1000.service``: a user's own service manager and what it runs (``user``, the UID);
- ``session-3.scope``: a login session (``session``, its number);
- ``docker-<id>.scope``, ``libpod-<id>.scope`` (podman), ``cri-containerd-<id>.scope``,
  ``crio-<id>.scope``: a container (``container``, ``runtime:id`` with the id's first 12
  characters, as ``docker ps`` shows it);
- ``machine-<name>.scope``: a container or VM registered with systemd-machined (``machine``);
- ``slurmstepd.scope`` (``<node>_slurmstepd.scope`` under multiple slurmd): Slurm's job steps
  (``slurm``), the job read from the process's control group where systemd gives it: its id
  (``.../job_1234/step_0/...``: cgroup v1, and v2 before Slurm 26.05 or with
  ``CgroupJobIdPaths=yes``) or its SLUID (``.../slurmstepd.scope/sEKNKTV3WPV500/step_0/...``:
  v2 from 26.05 on), never one read as the other;
- any other ``.scope``: a transient scope (``systemd-run --scope``; ``scope``);
- no unit: systemd does not know the PID (``unknown``: another PID namespace, or gone).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "CONTAINER_RUNTIMES",
    "Owner",
    "classify",
    "is_slurm_scope",
    "job_words",
    "slurm_job",
]

CONTAINER_RUNTIMES = {
    "docker": "docker",
    "libpod": "podman",
    "cri-containerd": "containerd",
    "crio": "cri-o",
}
_CONTAINER = re.compile(
    r"^(?P<runtime>docker|libpod|cri-containerd|crio)-(?P<id>[0-9a-f]{12,64})\.scope$"
)
_USER = re.compile(r"^user@(?P<uid>\d{1,10})\.service$")
_SESSION = re.compile(r"^session-(?P<id>[^.]{1,64})\.scope$")
_MACHINE = re.compile(r"^machine-(?P<name>.{1,200})\.scope$")
_JOB = re.compile(r"/job_(?P<job>\d{1,12})(?:/|$)")
# Slurm's src/plugins/cgroup/v2/cgroup_v2.c: the scope is "slurmstepd.scope", or
# "<node>_slurmstepd.scope" where one host runs several slurmd (MULTIPLE_SLURMD).
_SLURM_SCOPE = re.compile(r"^(?:[^/]{1,200}_)?slurmstepd\.scope$")
# From 26.05 the job's directory right under the scope is its SLUID as src/common/sluid.c
# prints it: "s" and 13 characters of Crockford's base32, upper case (sEKNKTV3WPV500).
_SLUID = re.compile(r"slurmstepd\.scope/(?P<sluid>s[0-9A-HJKMNP-TV-Z]{13})(?:/|$)")
_SHORT_ID = 12


@dataclass(frozen=True)
class Owner:
    """Who a unit is: ``kind`` (see the module), ``ref`` (the service, UID, session,
    ``runtime:id``, machine or Slurm job id; ``None`` where the name gives none) and a few
    words for a person (``describe``)."""

    kind: str
    ref: str | None = None

    def describe(self) -> str:
        """``docker container 3f4e5a6b7c8d``, ``Slurm job 1234``, ``user 1000``, …"""
        if self.kind == "container" and self.ref is not None:
            runtime, _, cid = self.ref.partition(":")
            return f"{runtime} container {cid}"
        words = {
            "user": "user {}",
            "session": "login session {}",
            "machine": "machine {}",
        }
        if self.kind == "slurm" and self.ref is not None:
            return job_words(self.ref)
        if self.kind in words and self.ref is not None:
            return words[self.kind].format(self.ref)
        if self.kind == "slurm":
            return "a Slurm job step"
        if self.kind == "unknown":
            return "no unit systemd knows"
        return self.kind


def classify(unit: str | None, cgroup: str | None = None) -> Owner:
    """The :class:`Owner` of ``unit`` (``None``: systemd knows no unit for the PID);
    ``cgroup`` is the process's control group where known (Slurm's job id is only there)."""
    if unit is None:
        return Owner("unknown")
    if m := _CONTAINER.match(unit):
        return Owner("container", f"{CONTAINER_RUNTIMES[m['runtime']]}:{m['id'][:_SHORT_ID]}")
    if m := _USER.match(unit):
        return Owner("user", m["uid"])
    if is_slurm_scope(unit):
        return Owner("slurm", slurm_job(cgroup) if cgroup is not None else None)
    if m := _SESSION.match(unit):
        return Owner("session", m["id"])
    if m := _MACHINE.match(unit):
        return Owner("machine", m["name"])
    if unit.endswith(".service"):
        return Owner("service", unit.removesuffix(".service"))
    if unit.endswith(".scope"):
        return Owner("scope", unit.removesuffix(".scope"))
    return Owner("other", unit)


def is_slurm_scope(unit: str) -> bool:
    """Whether ``unit`` is the scope of Slurm's job steps (``slurmstepd.scope``, or
    ``node1_slurmstepd.scope`` where several slurmd share a host)."""
    return _SLURM_SCOPE.match(unit) is not None


def slurm_job(cgroup: str) -> str | None:
    """The Slurm job in a job step's control group path: its id (cgroup v2
    ``/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0``, v1
    ``/slurm/uid_1000/job_1234/step_0``) or its SLUID (v2 from Slurm 26.05,
    ``/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0``), or ``None``."""
    m = _JOB.search(cgroup) or _SLUID.search(cgroup)
    if m is None:
        return None
    return m["job"] if "job" in m.groupdict() else m["sluid"]


def job_words(ref: str) -> str:
    """A Slurm job as a person reads it: ``Slurm job 1234``, or ``Slurm job SLUID
    sEKNKTV3WPV500`` (Slurm's tools take either where they take a job)."""
    return f"Slurm job SLUID {ref}" if ref.startswith("s") else f"Slurm job {ref}"
