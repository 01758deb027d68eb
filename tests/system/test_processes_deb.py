"""Who is on the GPU, under a real systemd (Debian 12 and 13): real processes in a service, a
transient scope and a login session, reported by the fake nvidia-smi with their real PIDs;
the packaged, sandboxed service names each one's unit in `gpuagent status`, in the state, in
the journal line of an Xid whose record names the PID, and in the series node_exporter serves.
nvidia-smi is not asked for the names: the sandbox (ProtectProc=invisible) hides root's and
alice's /proc from the agent's user, so each `sleep` is named by systemd's record of its
unit's processes, and the PID no process has is named by nothing.

The login session is a real one: `su -l` (PAM, with libpam-systemd installed here) run from a
transient service, as sshd or cron would, so that systemd-logind makes it session-N.scope.
"""

from __future__ import annotations

import json
import re
from dataclasses import astuple, dataclass
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

pytestmark = pytest.mark.system

SERVICE = "train@3.service"
SCOPE = "adhoc-job.scope"
USER = "alice"
# Two processes in the service (a shell's child and the shell become sleep), so that the unit
# series sums them.
TRAIN = "[Service]\nExecStart=/bin/sh -c 'sleep infinity & exec sleep infinity'\n"
MIB = 1048576
# PIDs no process here has (a process in another PID namespace, one gone): one on a GPU, one
# only in an Xid's record.
GHOST, NEVER = 4000000, 4000001


def sleepers(c: Container, unit: str) -> list[int]:
    """The PIDs of the `sleep` processes in ``unit``'s control group, lowest first."""
    group = c.out("systemctl", "show", "-p", "ControlGroup", "--value", unit)
    if not group:
        return []
    listed = c.run("cat", f"/sys/fs/cgroup{group}/cgroup.procs", check=False).stdout.split()
    comm = c.run("sh", "-c", 'for p; do echo "$p $(cat /proc/$p/comm)"; done', "sh", *listed)
    named = (line.partition(" ") for line in comm.stdout.splitlines())
    return sorted(int(pid) for pid, _, name in named if name == "sleep")


@dataclass(frozen=True)
class Jobs:
    """The PIDs of the `sleep`s: the service's two, the scope's, the login session's (and
    the session's scope, ``session``)."""

    main: int
    child: int
    scoped: int
    logged_in: int
    session: str


def start_jobs(c: Container) -> Jobs:
    """A service, a transient scope and a login session, each running `sleep`."""
    c.write("/etc/systemd/system/train@.service", TRAIN)
    c.run("systemctl", "daemon-reload")
    c.run("systemctl", "start", SERVICE)
    # `systemd-run --scope` runs the command itself, in the scope it asked for; backgrounded
    # (its output closed) so that this exec returns while the scope lives on.
    scope = f"systemd-run --quiet --scope --unit={SCOPE} -- sleep infinity"
    c.run("sh", "-c", f"{scope} </dev/null >/dev/null 2>&1 &")
    # PAM's session stack calls pam_systemd: logind moves su and its child into a session.
    c.apt("install", "libpam-systemd")
    c.run("useradd", "--create-home", USER)
    c.run(
        "systemd-run",
        "--quiet",
        "--unit=alice-login",
        "--",
        "su",
        "-l",
        USER,
        "-c",
        "exec sleep infinity",
    )
    # Debian 13's logind gives the user's manager (user@UID.service) a session of its own:
    # the login's is the one with the sleep in it.
    login = wait_for("alice's login session", lambda: _login(c), 30)
    assert login is not None
    session, logged_in = login
    main, child = _sleepers(c, SERVICE, 2)
    (scoped,) = _sleepers(c, SCOPE, 1)
    # The service's shell became its main process; its child was started first.
    main_pid = int(c.out("systemctl", "show", "-p", "MainPID", "--value", SERVICE))
    if main_pid != main:
        main, child = child, main
    return Jobs(main, child, scoped, logged_in, session)


def _login(c: Container) -> tuple[str, int] | None:
    """alice's session scope with one sleep in it, and the sleep's PID."""
    listed = c.run("loginctl", "show-user", USER, "-p", "Sessions", "--value", check=False)
    for n in listed.stdout.split():  # (none yet: "not logged in", exit 1)
        found = sleepers(c, f"session-{n}.scope")
        if len(found) == 1:
            return f"session-{n}.scope", found[0]
    return None


def _sleepers(c: Container, unit: str, n: int) -> list[int]:
    def exactly() -> list[int]:
        found = sleepers(c, unit)
        return found if len(found) == n else []

    return wait_for(f"{n} sleep in {unit}", exactly, 30)


def test_who_is_on_the_gpu_under_systemd(
    deb: str,  # noqa: F811
    container: Container,  # noqa: F811
    tmp_path: str,
) -> None:
    c = container
    need_make_journal()
    slots = fakesysfs.gpu_slots(8)
    try:
        install(c, deb)
        # Who is on each GPU every tick: the jobs below start and stop within seconds, and the
        # loop sampler's own period for the read is minutes.
        fake_host(c, {"capture": CAPTURE, "slots": slots}, "processes_interval = 0.5\n")
        wait_for("8 GPUs sampled", lambda: c.prop("StatusText") == "8 GPUs, sampling", 30)
        j = start_jobs(c)
        on = {SERVICE: slots[3], SCOPE: slots[0], j.session: slots[1]}
        apps = [
            {"slot": on[SERVICE], "pid": j.main, "mib": 40960},
            {"slot": on[SERVICE], "pid": j.child, "mib": 1228},
            {"slot": on[SCOPE], "pid": j.scoped, "mib": 2048},
            {"slot": on[j.session], "pid": j.logged_in, "mib": 512},
            {"slot": slots[2], "pid": GHOST, "mib": 256},
        ]
        scenario = {"capture": CAPTURE, "slots": slots, "apps": apps}
        c.write(f"{FAKE}/scenario.json", json.dumps(scenario))
        the_units_seen(c, slots, on, j)
        node_exporter_serves_them(c, on, slots)
        xids_name_the_units(c, tmp_path, on, j)
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}")
        raise


def state(c: Container) -> dict[str, Any]:
    st: dict[str, Any] = json.loads(c.status("--json").stdout)
    return st


def processes(st: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
    """Each GPU's processes as (pid, name, unit, unit_kind, unit_ref, used_memory_mib), by
    slot."""
    return {
        g["pci_slot"]: sorted(
            (p["pid"], p["name"], p["unit"], p["unit_kind"], p["unit_ref"], p["used_memory_mib"])
            for p in g.get("processes") or ()
        )
        for g in st["gpus"]
    }


def the_units_seen(c: Container, slots: list[str], on: dict[str, str], j: Jobs) -> None:
    main, child, scoped, logged_in, session = astuple(j)
    number = session.removeprefix("session-").removesuffix(".scope")
    idle: dict[str, list[tuple[Any, ...]]] = {slot: [] for slot in slots}
    want = idle | {
        on[SERVICE]: sorted(
            [
                (main, "sleep", SERVICE, "service", "train@3", 40960),
                (child, "sleep", SERVICE, "service", "train@3", 1228),
            ]
        ),
        on[SCOPE]: [(scoped, "sleep", SCOPE, "scope", "adhoc-job", 2048)],
        on[session]: [(logged_in, "sleep", session, "session", number, 512)],
        slots[2]: [(GHOST, None, None, "unknown", None, 256)],
    }
    wait_for("the processes' units in the state", lambda: processes(state(c)) == want, 30)
    st = state(c)
    assert st["problems"] == {}, st  # the system bus answered the service's user
    # A PID systemd has no process for is no unit, not a failing bus.
    assert c.events(Event.PROCESS_UNITS_UNKNOWN) == []
    status = c.status()
    assert status.returncode == 0, status.stdout + status.stderr
    for line in (
        f"{SERVICE} 40.0 GiB (pid {main} sleep)",
        f"{SERVICE} 1.2 GiB (pid {child} sleep)",
        f"{SCOPE} 2.0 GiB (pid {scoped} sleep)",
        f"{session} 512 MiB (pid {logged_in} sleep)",
        f"no unit 256 MiB (pid {GHOST})",
    ):
        assert re.search(rf"^ +{re.escape(line)}$", status.stdout, re.M), status.stdout


def node_exporter_serves_them(c: Container, on: dict[str, str], slots: list[str]) -> None:
    def series(name: str, slot: str, unit: str | None = None) -> re.Pattern[str]:
        labels = f'pci_slot="{slot}",' + (f'unit="{re.escape(unit)}",' if unit is not None else "")
        return re.compile(rf'^{name}\{{{labels}uuid="GPU-[0-9a-f-]+"\}} (\S+)$', re.M)

    memory = series("gpuagent_gpu_unit_memory_bytes", on[SERVICE], SERVICE)
    served = wait_for("the unit series in node_exporter", lambda: memory.search(c.metrics()), 30)
    assert served is not None and float(served[1]) == (40960 + 1228) * MIB
    text = c.metrics()
    for unit, n in ((SERVICE, 2), (SCOPE, 1)):
        count = series("gpuagent_gpu_processes", on[unit]).search(text)
        assert count is not None and float(count[1]) == n, text
    # The ghost's memory: under unit="", no unit known.
    nobody = series("gpuagent_gpu_unit_memory_bytes", slots[2], "").search(text)
    assert nobody is not None and float(nobody[1]) == 256 * MIB, text
    idle = series("gpuagent_gpu_processes", slots[7]).search(text)
    assert idle is not None and float(idle[1]) == 0, text
    assert "pid=" not in text  # PIDs are never labels


def xids_name_the_units(c: Container, work: str, on: dict[str, str], j: Jobs) -> None:
    """Xid records naming the processes' PIDs (and one never seen): each line names the
    unit the PID was in, in its text and its field UNIT."""
    main, _, scoped, logged_in, session = astuple(j)

    def device(unit: str) -> str:
        return on[unit].rpartition(".")[0]

    place_journal(
        c,
        work,
        f"NVRM: Xid (PCI:{device(SERVICE)}): 31, pid={main}, name=python3, channel 0x00000019, "
        "intr 10000000. MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_5 faulted @ "
        "0x32_0134b000. Fault is of type FAULT_PDE ACCESS_TYPE_READ\n"
        f"NVRM: Xid (PCI:{device(session)}): 13, pid={logged_in}, name=sleep, Graphics SM "
        "Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter\n"
        f"NVRM: Xid (PCI:{device(SCOPE)}): 119, pid={scoped}, name=sleep, Timeout after 6s "
        "of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) "
        "(0x2081 0x4).\n"
        f"NVRM: Xid (PCI:{device(SERVICE)}): 43, pid={NEVER}, name=gone, Ch 00000010\n",
    )

    def counted() -> dict[str, dict[str, Any]]:
        return {e["XID"]: e for e in c.events(Event.XID_COUNTED)}

    wait_for("three Xids counted", lambda: len(counted()) == 3, 30)
    got = counted()
    assert (got["31"]["PCI_SLOT"], got["31"]["UNIT"], got["31"]["PROCESS_PID"]) == (
        on[SERVICE],
        SERVICE,
        str(main),
    )
    assert f" from {SERVICE} (pid {main} python3): " in got["31"]["MESSAGE"], got["31"]
    assert (got["13"]["PCI_SLOT"], got["13"]["UNIT"]) == (on[session], session)
    assert f" from {session} (pid {logged_in} sleep): " in got["13"]["MESSAGE"], got["13"]
    assert "UNIT" not in got["43"], got["43"]
    assert f"from pid {NEVER} gone (never seen on a GPU by the agent)" in got["43"]["MESSAGE"]
    problem = one(wait_for("Xid 119's line", lambda: c.events(Event.XID_PROBLEM), 30), "119")
    assert (problem["PRIORITY"], problem["PCI_SLOT"], problem["XID"]) == ("3", on[SCOPE], "119")
    assert problem["UNIT"] == SCOPE, problem
    assert f" from {SCOPE} (pid {scoped} sleep): " in problem["MESSAGE"], problem
    entry = next(g for g in state(c)["gpus"] if g["pci_slot"] == on[SCOPE])
    assert [(p["kind"], p["unit"]) for p in entry["problems"]] == [("xid", SCOPE)], entry
    status = c.status(columns=200)
    assert status.returncode == 2, status.stdout + status.stderr
    assert f"from {SCOPE} (pid {scoped} sleep)" in status.stdout, status.stdout
