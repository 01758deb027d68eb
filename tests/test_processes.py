"""Who is on each GPU, wired: the fake nvidia-smi's --query-compute-apps on a fake host, the
units from a stand-in for systemd, seen in the state, status, metrics and the journal."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from jeepney import DBusAddress, new_method_call

from gpuagent import metrics
from gpuagent.commands import statustext
from gpuagent.edges.systemd.unitname import Owner
from gpuagent.edges.systemd.units import PidResult, UnitProcess, Watch
from gpuagent.logs import Event
from gpuagent.schema import GpuEntry, State
from gpuagent.sources.processes.owners import Owners, source_words
from gpuagent.sources.victims.rule import WINDOW
from gpuagent.views import Seen
from tests import replay, test_kernlog
from tests.conftest import Host
from tests.fake_units import FakeUnits
from tests.test_kernlog import append
from tests.test_metrics import series
from tests.test_victims import kernel_entry

make = test_kernlog.make
DOCKER = "3f4e5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f"


def entry(state: State, slot: str) -> GpuEntry:
    return next(g for g in state["gpus"] if g["pci_slot"] == slot)


def busy(host: Host, *apps: dict[str, Any], **step: Any) -> None:
    host.healthy(apps=list(apps), **step)


def test_an_idle_host_has_no_process_and_one_spawn_more_per_tick(host: Host) -> None:
    host.make_agent()
    report = host.tick(4)
    assert (host.spawns, host.apps_spawns) == (4, 4)
    assert all(g["processes"] == [] for g in report.state["gpus"])
    got = series(metrics.render(report.state))
    counts = {k: v for k, v in got.items() if k[0] == "gpuagent_gpu_processes"}
    assert len(counts) == len(host.slots) and set(counts.values()) == {0.0}
    assert not any(k[0] == "gpuagent_gpu_unit_memory_bytes" for k in got)
    assert host.lines(logging.WARNING) == []
    assert host.units.pid_calls == 0


def test_slurm_jobs_on_both_cgroup_layouts(host: Host) -> None:
    # cgroup v2 as Slurm 26.05 lays it out by default (the job's SLUID), with
    # CgroupJobIdPaths=yes (job_<id>), and under multiple slurmd (<node>_slurmstepd.scope).
    a = host.slots[0]
    mib = {901: 2048, 902: 1024, 903: 512}
    busy(host, *({"slot": a, "pid": pid, "name": "trainer", "mib": m} for pid, m in mib.items()))
    units = host.units
    units.pids = {901: "slurmstepd.scope", 902: "slurmstepd.scope", 903: "n1_slurmstepd.scope"}
    units.cgroups = {
        901: "/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0",
        902: "/system.slice/slurmstepd.scope/job_1234/step_batch/user/task_0",
        903: "/system.slice/n1_slurmstepd.scope/sEKNKTV3WPV501/step_0/user/task_1",
    }
    host.make_agent(units=units)
    state = host.tick(2).state
    assert [(p["unit_kind"], p["unit_ref"]) for p in entry(state, a)["processes"]] == [
        ("slurm", "sEKNKTV3WPV500"),
        ("slurm", "1234"),
        ("slurm", "sEKNKTV3WPV501"),
    ]
    text = statustext.render(state, state["updated_at"], 0, "", width=200)
    assert "slurmstepd.scope (Slurm job SLUID sEKNKTV3WPV500) 2.0 GiB (pid 901 trainer)" in text
    assert "slurmstepd.scope (Slurm job 1234) 1.0 GiB (pid 902 trainer)" in text
    assert "n1_slurmstepd.scope (Slurm job SLUID sEKNKTV3WPV501) 512 MiB (pid 903" in text


def test_each_process_with_its_unit_everywhere(host: Host) -> None:
    a, b = host.slots[0], host.slots[1]
    busy(
        host,
        {"slot": a, "pid": 48213, "name": "python3", "mib": 42189},
        {"slot": a, "pid": 48214, "name": "python3", "mib": 1024},
        {"slot": a, "pid": 777, "name": "ffmpeg", "mib": 512},
        {"slot": b, "pid": 900, "name": "cuda_app", "mib": "[N/A]"},
        {"slot": b, "pid": 901, "name": "trainer", "mib": 2048},
    )
    units = host.units
    units.pids = {
        48213: "train@3.service",
        48214: "train@3.service",
        900: f"docker-{DOCKER}.scope",
        901: "slurmstepd.scope",
    }
    units.cgroups = {901: "/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0"}
    host.make_agent(units=units)
    state = host.tick(3).state
    assert units.pid_calls == 5  # once per process, not per tick
    assert entry(state, a)["processes"] == [
        {
            "pid": 48213,
            "name": "python3",
            "used_memory_mib": 42189,
            "unit": "train@3.service",
            "unit_kind": "service",
            "unit_ref": "train@3",
        },
        {
            "pid": 48214,
            "name": "python3",
            "used_memory_mib": 1024,
            "unit": "train@3.service",
            "unit_kind": "service",
            "unit_ref": "train@3",
        },
        {
            "pid": 777,
            "name": "ffmpeg",
            "used_memory_mib": 512,
            "unit": None,
            "unit_kind": "unknown",
            "unit_ref": None,
        },
    ]
    (docker, slurm) = entry(state, b)["processes"]
    assert (docker["unit_kind"], docker["unit_ref"], docker["used_memory_mib"]) == (
        "container",
        "docker:3f4e5a6b7c8d",
        None,
    )
    assert (slurm["unit"], slurm["unit_kind"], slurm["unit_ref"]) == (
        "slurmstepd.scope",
        "slurm",
        "1234",
    )
    assert all(entry(state, s)["processes"] == [] for s in host.slots[2:])

    text = statustext.render(state, state["updated_at"], 0, "", width=200)
    assert "      train@3.service 41.2 GiB (pid 48213 python3)" in text
    assert "      train@3.service 1.0 GiB (pid 48214 python3)" in text
    assert "      no unit 512 MiB (pid 777 ffmpeg)" in text
    assert "      slurmstepd.scope (Slurm job 1234) 2.0 GiB (pid 901 trainer)" in text
    assert "      docker container 3f4e5a6b7c8d memory n/a (pid 900 cuda_app)" in text

    got = series(metrics.render(state))
    uuid_a, uuid_b = entry(state, a)["uuid"], entry(state, b)["uuid"]

    def key(name: str, slot: str, uuid: str | None, **more: str) -> Any:
        return (name, frozenset({"pci_slot": slot, "uuid": uuid or "", **more}.items()))

    mib = 1048576
    assert got[key("gpuagent_gpu_processes", a, uuid_a)] == 3
    assert got[key("gpuagent_gpu_processes", b, uuid_b)] == 2
    assert got[key("gpuagent_gpu_unit_memory_bytes", a, uuid_a, unit="train@3.service")] == (
        43213 * mib
    )
    assert got[key("gpuagent_gpu_unit_memory_bytes", a, uuid_a, unit="")] == 512 * mib
    assert got[key("gpuagent_gpu_unit_memory_bytes", b, uuid_b, unit="slurmstepd.scope")] == (
        2048 * mib
    )
    # Memory nvidia-smi cannot tell is no series; no PID is ever a label.
    assert not any("pid" in dict(labels) for _, labels in got)
    assert (
        key("gpuagent_gpu_unit_memory_bytes", b, uuid_b, unit=f"docker-{DOCKER}.scope") not in got
    )
    assert host.lines(logging.WARNING) == []


def test_a_pid_given_to_another_program_is_asked_about_again(host: Host) -> None:
    a = host.slots[0]
    busy(host, {"slot": a, "pid": 5, "name": "one", "mib": 1})
    host.units.pids = {5: "one.service"}
    host.make_agent(units=host.units)
    host.tick(2)
    host.units.pids = {5: "two.service"}
    busy(host, {"slot": a, "pid": 5, "name": "two", "mib": 1})
    state = host.tick().state
    assert host.units.pid_calls == 2
    assert entry(state, a)["processes"][0]["unit"] == "two.service"


def test_processes_interval_is_in_seconds_rounded_up_to_ticks(host: Host) -> None:
    host.make_agent(processes_interval=25.0)
    host.tick(9)
    assert (host.spawns, host.apps_spawns) == (9, 3)


def test_a_failing_read_is_one_warning_then_not_known_then_one_line(host: Host) -> None:
    a = host.slots[0]
    busy(host, {"slot": a, "pid": 5, "name": "x", "mib": 1})
    host.make_agent()
    host.tick()
    host.healthy(apps={"stdout": "Unknown Error\n", "exit": 15})
    host.tick(2)
    assert "processes" in entry(host.state, a)  # a blip: the last read holds
    assert host.events(Event.PROCESSES_READ_FAILED) == []
    host.tick()
    (line,) = host.events(Event.PROCESSES_READ_FAILED)
    assert line.getMessage() == (
        "the GPUs' processes not read: nvidia-smi --query-compute-apps=gpu_uuid,pid,"
        "used_memory --format=csv,noheader,nounits: exit 15: Unknown Error"
    )
    assert "processes" not in entry(host.state, a)
    assert not any(k[0] == "gpuagent_gpu_processes" for k in series(metrics.render(host.state)))
    host.tick(10)  # on the backoff: not every tick
    assert host.apps_spawns < 1 + 3 + 10
    assert len(host.events(Event.PROCESSES_READ_FAILED)) == 1
    busy(host, {"slot": a, "pid": 5, "name": "x", "mib": 1})
    host.agent.configure()  # type: ignore[union-attr]
    host.tick()
    (back,) = host.events(Event.PROCESSES_READ_RECOVERED)
    assert back.levelno == logging.INFO
    assert [p["pid"] for p in entry(host.state, a)["processes"]] == [5]


def test_a_failing_probe_knows_no_process_and_spawns_no_read(host: Host) -> None:
    busy(host, {"slot": host.slots[0], "pid": 5, "name": "x", "mib": 1})
    host.make_agent()
    host.tick()
    host.failing()
    host.tick(3)
    assert host.apps_spawns == 1
    assert all("processes" not in g for g in host.state["gpus"])


def test_an_unreadable_line_is_said_once(host: Host) -> None:
    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    host.healthy(apps={"stdout": f"{uuid}, 12, 1\n{uuid}, twelve, 2\n"})
    host.make_agent()
    host.tick(3)
    (line,) = host.events(Event.PROCESSES_UNREADABLE)
    assert line.getMessage() == (
        "nvidia-smi --query-compute-apps: cannot read the line "
        "'GPU-00000000-0000-0000-0000-000000000000, twelve, 2': pid 'twelve' is not "
        "1..4294967295; the other processes are read"
    )


def test_unreadable_lines_are_one_warning_per_spell_whatever_their_memory(host: Host) -> None:
    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    host.make_agent()
    for mib in range(1, 4):  # the bad line's memory cell moves every read
        host.healthy(apps={"stdout": f"{uuid}, 0, {mib}\n{uuid}, x, {mib}\n"})
        host.tick()
    (line,) = host.events(Event.PROCESSES_UNREADABLE)
    assert "'GPU-00000000-0000-0000-0000-000000000000, 0, 1' (and 1 more): pid '0'" in (
        line.getMessage()
    )
    host.healthy(apps={"stdout": f"{uuid}, 7, 1\n"})
    host.tick(2)
    host.healthy(apps={"stdout": f"{uuid}, 0, 1\n"})
    host.tick(2)
    assert len(host.events(Event.PROCESSES_UNREADABLE)) == 2


def test_a_failing_bus_lists_the_processes_without_units(host: Host) -> None:
    a = host.slots[0]
    busy(
        host,
        {"slot": a, "pid": 5, "name": "x", "mib": 10},
        {"slot": a, "pid": 6, "name": "y", "mib": 20},
    )
    host.units.pids = {5: "x.service", 6: "y.service"}
    host.units.pid_watch = Watch.ERROR
    host.make_agent(units=host.units)
    host.tick(2)
    assert host.units.pid_calls == 2  # one failed lookup per read, not one per process
    (line,) = host.events(Event.PROCESS_UNITS_UNKNOWN)
    assert line.getMessage() == (
        "the systemd units of the GPUs' processes not known: system bus: no answer within 2 s"
    )
    assert [(p["unit"], p["unit_kind"]) for p in entry(host.state, a)["processes"]] == [
        (None, None),
        (None, None),
    ]
    text = statustext.render(host.state, host.state["updated_at"], 0, "", width=200)
    assert "      unit not known 20 MiB (pid 6 y)" in text
    host.units.pid_watch = Watch.OK
    host.tick()
    assert len(host.events(Event.PROCESS_UNITS_KNOWN)) == 1
    assert [p["unit"] for p in entry(host.state, a)["processes"]] == ["x.service", "y.service"]


def test_no_system_bus_lists_the_processes_without_a_word(host: Host) -> None:
    busy(host, {"slot": host.slots[0], "pid": 5, "name": "x", "mib": 10})
    host.units.pid_watch = Watch.NOT_WATCHED
    host.make_agent(units=host.units)
    host.tick(2)
    assert host.events(Event.PROCESS_UNITS_UNKNOWN) == []
    assert entry(host.state, host.slots[0])["processes"][0]["unit_kind"] is None


HIDDEN_LINE = (
    "      no process visible to the agent, 29.3 GiB in use "
    "(a process in another PID namespace, or a leaked context)"
)


def test_memory_in_use_with_no_process_visible_is_no_note_on_a_healthy_host(host: Host) -> None:
    # A container's processes are in another PID namespace: the normal case of a busy host.
    idle = {slot: {"memory.used": "300 MiB"} for slot in host.slots}  # a display's own use
    host.healthy(override={**idle, host.slots[0]: {"memory.used": "30000 MiB"}})
    host.make_agent()
    state = host.tick().state
    text = statustext.render(state, state["updated_at"], 0, "", width=200)
    assert "no process visible" not in text
    assert all(not g["problems"] for g in state["gpus"])


def test_memory_in_use_with_no_process_visible_explains_a_problem(host: Host) -> None:
    idle = {slot: {"memory.used": "300 MiB"} for slot in host.slots}
    sick = {"memory.used": "30000 MiB", "ecc.errors.uncorrected.volatile.total": "2"}
    also = {"memory.used": "30000 MiB"}  # busy and healthy: no note
    host.healthy(override={**idle, host.slots[0]: sick, host.slots[1]: also})
    host.make_agent()
    state = host.tick().state
    text = statustext.render(state, state["updated_at"], 0, "", width=200)
    assert HIDDEN_LINE in text
    assert text.count("no process visible") == 1
    assert [p["kind"] for p in entry(state, host.slots[0])["problems"]] == ["ecc_uncorrected"]


def test_an_xid_names_the_unit_its_pid_was_last_seen_in(host: Host, make: Any) -> None:
    a = host.slots[1]
    busy(host, {"slot": a, "pid": 48213, "name": "python3", "mib": 4000})
    host.units.pids = {48213: "train@3.service"}
    agent = host.make_agent(units=host.units)
    agent.verdict.started = 0.0  # the records are new faults to it
    host.tick()
    # An application's Xid is counted, not the GPU's problem; the driver's 119 is one.
    xids = (
        "NVRM: Xid (PCI:0000:2a:00): 31, pid=48213, name=python3, Ch 00000010, intr 10000000.\n"
        "NVRM: Xid (PCI:0000:2a:00): 43, pid=99, name=gone, Ch 00000010\n"
        "NVRM: Xid (PCI:0000:2a:00): 119, pid=48213, name=python3, Timeout waiting for RPC\n"
    )
    journal = make(xids, start=time.time())
    agent.configure(agent.config._replace(journal_directory=journal))
    state = host.tick().state
    counted = {r.__dict__["XID"]: r for r in host.events(Event.XID_COUNTED)}
    assert (
        counted["31"]
        .getMessage()
        .startswith("Xid 31 on GPU 0000:2a:00.0 from train@3.service (pid 48213 python3): ")
    )
    assert counted["31"].__dict__["UNIT"] == "train@3.service"
    assert (
        counted["43"]
        .getMessage()
        .startswith(
            "Xid 43 on GPU 0000:2a:00.0 from pid 99 gone (never seen on a GPU by the agent): "
        )
    )
    assert not hasattr(counted["43"], "UNIT")
    assert (counted["43"].__dict__["PROCESS_PID"], counted["43"].__dict__["PROCESS_COMM"]) == (
        "99",
        "gone",
    )
    (problem,) = entry(state, a)["problems"]
    assert (problem["xid"], problem["unit"]) == (119, "train@3.service")
    assert " from train@3.service (pid 48213 python3): " in problem["message"]
    (start,) = host.events(Event.XID_PROBLEM)
    assert start.__dict__["UNIT"] == "train@3.service"
    assert "from train@3.service (pid 48213 python3)" in start.getMessage()
    text = statustext.render(state, state["updated_at"], 0, "", width=200)
    assert "Xid 119 (" in text and "from train@3.service (pid 48213 python3)" in text


@dataclass
class _Uint32Units(FakeUnits):
    """systemd's stand-in, asked as :class:`gpuagent.edges.systemd.units.Units` asks:
    ``GetUnitByPID`` marshalled by jeepney, whose ``u`` takes 0..4294967295 only (else
    ``struct.error``); ``asked`` the PIDs."""

    asked: list[int] = field(default_factory=list)

    def unit_for_pid(self, pid: int) -> PidResult:
        self.asked.append(pid)
        where = DBusAddress(
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1",
            "org.freedesktop.systemd1.Manager",
        )
        new_method_call(where, "GetUnitByPID", "u", (pid,)).serialise(serial=1)
        return super().unit_for_pid(pid)


@pytest.mark.parametrize("pid", ["4294967296", "0", "-1", "99999999999"])
def test_a_pid_outside_uint32_is_a_malformed_row_and_the_tick_reaches_its_verdict(
    host: Host, pid: str
) -> None:
    a, sick = host.slots[0], host.slots[1]
    uuid_a = replay.gpu_uuid(a)
    apps = [{"slot": a, "pid": pid, "mib": 100}, {"slot": a, "pid": 4242, "mib": 200}]
    host.healthy(apps=apps, override={sick: {"gpu_recovery_action": "Reset"}})
    host.make_agent(units=_Uint32Units(pids={4242: "train@3.service"}))
    state = host.tick(3).state
    assert "internal" not in state["problems"]
    assert [p["kind"] for p in entry(state, sick)["problems"]] == ["recovery_action"]
    assert [(p["pid"], p["unit"]) for p in entry(state, a)["processes"]] == [
        (4242, "train@3.service")
    ]
    (line,) = host.events(Event.PROCESSES_UNREADABLE)
    assert f"'{uuid_a}, {pid}, 100': pid '{pid}' is not 1..4294967295" in line.getMessage()
    # 0 would ask systemd for the agent's own unit.
    assert isinstance(host.units, _Uint32Units) and host.units.asked == [4242]


def test_a_process_name_with_a_newline_forges_no_process_on_another_gpu(host: Host) -> None:
    a, b = host.slots[0], host.slots[1]
    # The name ends its own row and starts a well-formed one on GPU b, as nvidia-smi prints
    # process_name: "GPU-a, 5, x, 1\nGPU-b, 4242, python, 1024".
    forged = f"x, 1\n{replay.gpu_uuid(b)}, 4242, python"
    busy(host, {"slot": a, "pid": 5, "name": forged, "mib": 1024})
    host.make_agent()
    state = host.tick().state
    assert entry(state, b)["processes"] == []
    # The kernel's comm: 15 bytes of the name, its newline not printable.
    assert [(p["pid"], p["name"]) for p in entry(state, a)["processes"]] == [(5, "x, 1?GPU-000000")]
    assert host.lines(logging.WARNING) == []


@pytest.mark.parametrize("name", ["a, b", '"quoted', 'x", 1'])
def test_a_process_name_with_a_comma_or_a_quote_hides_no_process(host: Host, name: str) -> None:
    a = host.slots[0]
    busy(
        host,
        {"slot": a, "pid": 5, "name": name, "mib": 10},
        {"slot": a, "pid": 6, "name": "python3", "mib": 20},
    )
    host.make_agent()
    state = host.tick().state
    assert [(p["pid"], p["name"]) for p in entry(state, a)["processes"]] == [
        (5, name),
        (6, "python3"),
    ]
    assert host.lines(logging.WARNING) == []


def test_a_process_hidden_from_the_agent_in_no_unit_is_listed_without_a_name(host: Host) -> None:
    busy(host, {"slot": host.slots[0], "pid": 5, "name": "[N/A]", "mib": 10})
    host.make_agent()
    state = host.tick().state
    (p,) = entry(state, host.slots[0])["processes"]
    assert (p["pid"], p["name"]) == (5, None)
    text = statustext.render(state, state["updated_at"], 0, "", width=200)
    assert "(pid 5)" in text
    assert host.units.process_calls == 0  # in no unit: nothing to list


def test_a_process_whose_comm_is_hidden_is_named_by_systemd_once(host: Host) -> None:
    a = host.slots[0]
    # ProtectProc=invisible hides other users' /proc/<pid>: systemd lists the command line.
    busy(
        host,
        {"slot": a, "pid": 5, "name": "[N/A]", "mib": 10},
        {"slot": a, "pid": 6, "name": "trainer", "mib": 20},
    )
    host.units.pids = {5: "train@3.service", 6: "train@3.service"}
    host.units.cmdlines = {5: "/usr/bin/python3 train.py --lr 0.1", 6: "/opt/other"}
    host.make_agent(units=host.units)
    state = host.tick(3).state
    assert [(p["pid"], p["name"]) for p in entry(state, a)["processes"]] == [
        (5, "python3"),
        (6, "trainer"),  # comm first
    ]
    text = statustext.render(state, state["updated_at"], 0, "", width=200)
    assert "train@3.service 10 MiB (pid 5 python3)" in text
    # Asked with the unit, once for the hidden process only, not again on later ticks.
    assert (host.units.pid_calls, host.units.process_calls) == (2, 1)
    assert host.agent is not None
    seen = host.agent.last.processes.last_seen.get(5)
    assert seen is not None and seen.name == "python3"


@pytest.mark.parametrize(
    ("cmdline", "name"),
    [
        # systemd quotes an argument that needs it, a newline escaped.
        ('"/opt/x, 1\\nGPU-b, 4242, py" --arg', "x, 1?GPU-b, 424"),
        # An older systemd's line as it is.
        ("/opt/x,\nGPU-b, 4242, py", "x,?GPU-b,"),
    ],
)
def test_a_cmdline_from_systemd_with_a_newline_or_a_comma_is_one_name_on_one_row(
    host: Host, cmdline: str, name: str
) -> None:
    a, b = host.slots[0], host.slots[1]
    busy(host, {"slot": a, "pid": 5, "name": "[N/A]", "mib": 10})
    host.units.pids = {5: "x.service"}
    host.units.cmdlines = {5: cmdline}
    host.make_agent(units=host.units)
    state = host.tick().state
    assert entry(state, b)["processes"] == []
    assert [(p["pid"], p["name"]) for p in entry(state, a)["processes"]] == [(5, name)]
    text = statustext.render(state, state["updated_at"], 0, "", width=200)
    assert len([line for line in text.splitlines() if "(pid 5 " in line]) == 1


def test_source_words() -> None:
    seen = Seen(5, "/opt/x", "x.service", Owner("service", "x"))
    assert source_words(5, "x", seen) == (" from x.service (pid 5 x)", "x.service")
    assert source_words(5, None, seen) == (" from x.service (pid 5 /opt/x)", "x.service")
    assert source_words(5, None, None) == (" from pid 5 (never seen on a GPU by the agent)", None)
    nowhere = Seen(5, "x", None, Owner("unknown"))
    assert source_words(5, "x", nowhere) == (" from pid 5 x (in no systemd unit)", None)
    unasked = Seen(5, "x", None, None)
    assert source_words(5, "x", unasked) == (" from pid 5 x (its unit not known)", None)


class _Lookup:
    def __init__(self) -> None:
        self.asked: list[int] = []
        self.answer = PidResult(Watch.OK, "a.service")

    def unit_for_pid(self, pid: int) -> PidResult:
        self.asked.append(pid)
        return self.answer

    def process_in(self, unit: str, pid: int) -> UnitProcess | None:
        return None


def test_owners_remember_a_bounded_number_of_pids() -> None:
    lookup = _Lookup()
    owners = Owners(lookup, remember=3)
    for pid in range(1, 6):
        owners.resolve([(pid, "p", "s")])
    assert [owners.last_seen(p) is not None for p in range(1, 6)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert lookup.asked == [1, 2, 3, 4, 5]
    owners.resolve([(5, "p", "t")])
    assert lookup.asked == [1, 2, 3, 4, 5]
    seen = owners.last_seen(5)
    assert seen is not None and seen.slot == "t"


def test_owners_stop_asking_after_a_failure_until_the_next_read() -> None:
    lookup = _Lookup()
    lookup.answer = PidResult(Watch.ERROR, error="system bus: gone")
    owners = Owners(lookup)
    out = owners.resolve([(1, "a", "s"), (2, "b", "s"), (3, "c", "s")])
    assert lookup.asked == [1]
    assert owners.error == "system bus: gone"
    assert all(s.owner is None for s in out.values())
    lookup.answer = PidResult(Watch.OK, None)
    out = owners.resolve([(1, "a", "s"), (2, "b", "s"), (3, "c", "s")])
    assert lookup.asked == [1, 1, 2, 3]
    assert owners.error is None
    assert {s.owner for s in out.values()} == {Owner("unknown")}


def test_under_the_loop_sampler_the_read_is_every_3_minutes(host: Host) -> None:
    # A 60 s tick: every 3 minutes is every third tick (spawn mode reads every tick).
    host.healthy(loop_ms=20)
    host.make_agent(sampler="loop", interval=60.0)
    try:
        host.tick(7)
        assert host.apps_spawns == 3
        host.make_agent(sampler="loop", interval=20.0, processes_interval=20.0)
        before = host.apps_spawns
        host.tick(3)
        assert host.apps_spawns - before == 3  # a set processes_interval holds
    finally:
        assert host.agent is not None
        host.agent.close()


def test_under_the_loop_sampler_a_critical_xid_reads_at_once_for_its_victims(
    host: Host, make: Any
) -> None:
    slot = host.slots[0]
    busy(host, {"slot": slot, "pid": 901, "name": "trainer", "mib": 1024}, loop_ms=20)
    journal = make("[    1.000000] nvidia: loading out-of-tree module taints kernel.\n")
    clock = [time.time()]
    host.make_agent(sampler="loop", interval=20.0, journal_directory=journal, wall=lambda: clock[0])
    try:
        host.tick(2)
        assert host.apps_spawns == 1
        # A job started since the last read; the GPU falls off the bus.
        busy(host, {"slot": slot, "pid": 907, "name": "late", "mib": 1024}, loop_ms=20)
        at = clock[0] + 1
        dev = slot.rpartition(".")[0]
        append(journal, kernel_entry(at, f"NVRM: Xid (PCI:{dev}): 79, GPU has fallen off the bus."))
        clock[0] = at + 2
        host.tick(1)
        assert host.apps_spawns == 2  # at once, not on the third tick
        clock[0] = at + WINDOW + 1
        host.tick(1)
        (told,) = host.events(Event.FAULT_VICTIMS)
        assert "pid 907 late (on the GPU" in told.getMessage()
        assert "901" not in told.getMessage()
    finally:
        assert host.agent is not None
        host.agent.close()
