"""gpuagent.sources.victims.rule: who a critical fault hit, from the driver's own records
(/work/shared corpus: NVIDIA/open-gpu-kernel-modules#1150's teardown records after an NVLink
Xid 145 and 149) and the processes on the GPU."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent.commands.cli import main
from gpuagent.edges.users import user_name
from gpuagent.logs import Event
from gpuagent.sources.kernel.xid import Xid, cause_of, parse
from gpuagent.sources.victims.rule import (
    MOST,
    OPEN,
    WINDOW,
    Fault,
    Victim,
    Victims,
    as_json,
    describe,
)
from tests.conftest import Host
from tests.journalfeed import this_boot
from tests.replay import CORPUS
from tests.test_kernlog import append, export_entry, make

__all__ = ["make"]  # the fixture

CAUSED = "caused by previous Xid 145"


def kernel_entry(at: float, message: str) -> bytes:
    """A kernel record logged at ``at`` (wall s), as journald stores it."""
    return export_entry(
        [
            ("__REALTIME_TIMESTAMP", str(int(at * 1e6)).encode()),
            ("__MONOTONIC_TIMESTAMP", str(int((at - 1_699_990_000) * 1e6)).encode()),
            ("_BOOT_ID", this_boot().encode()),
            ("_TRANSPORT", b"kernel"),
            ("PRIORITY", b"4"),
            ("MESSAGE", message.encode()),
        ]
    )


TEARDOWNS = os.path.join(CORPUS, "xid", "xid-45-driver590-caused-by-previous-kernel-prefix.txt")


def who(pid: int) -> tuple[str | None, str | None, str | None]:
    return ("slurmstepd.scope", "1234", None) if pid == 1818990 else (None, None, None)


def test_the_drivers_teardown_records_name_their_cause() -> None:
    with open(TEARDOWNS, encoding="utf-8") as f:
        records = [e for line in f for e in parse(line.removeprefix("kernel: "))]
    causes = [
        (x.device, x.code, x.pid, x.process, cause_of(x.text))
        for x in records
        if isinstance(x, Xid)
    ]
    assert causes == [
        ("0000:dc:00", 45, 1818990, "python3", 149),
        ("0000:ed:00", 45, 1818992, "python3", 145),
        ("0000:ba:00", 45, 1818989, "python3", 145),
        ("0000:97:00", 45, 1818987, "python3", 145),
    ]
    # A process named "caused by previous Xid 79" is no cause: the words end the record.
    assert cause_of("pid=1, name=x, Ch 00000001") is None
    assert cause_of("Ch 00000001 caused by previous Xid 149 and more") is None


def test_a_fabric_fault_takes_the_teardowns_on_its_peers() -> None:
    v = Victims()
    v.fault(Fault("0000:dc:00.0", 149, 100.0), [], who)
    on_gpu = [(777, "trainer"), (778, None)]
    v.fault(Fault("0000:ed:00.0", 145, 100.2, 777, "trainer"), on_gpu, who)
    assert v.teardown(Fault("0000:dc:00.0", 45, 100.5, 1818990, "python3"), 149, who)
    peers = (("0000:ed:00.0", 1818992), ("0000:ba:00.0", 1818989), ("0000:97:00.0", 1818987))
    for slot, pid in peers:
        assert v.teardown(Fault(slot, 45, 100.6, pid, "python3"), 145, who)
    assert v.due(100.0 + WINDOW) == []  # still open
    told = dict(v.due(100.3 + WINDOW))
    assert len(v) == 0
    assert told[Fault("0000:dc:00.0", 149, 100.0)] == (
        Victim(1818990, "python3", "torn down", "slurmstepd.scope", "1234"),
    )
    hit = told[Fault("0000:ed:00.0", 145, 100.2, 777, "trainer")]
    assert [(x.pid, x.how) for x in hit] == [
        (777, "named"),
        (1818987, "torn down"),
        (1818989, "torn down"),
        (1818992, "torn down"),
        (778, "on the GPU"),
    ]


def test_a_teardown_without_a_cause_goes_to_its_gpus_fault() -> None:
    v = Victims()
    v.fault(Fault("0000:01:00.0", 62, 50.0), [])
    assert not v.teardown(Fault("0000:02:00.0", 45, 50.1, 12, "x"), None)  # another GPU
    assert v.teardown(Fault("0000:01:00.0", 45, 50.1, 12542, "VLLM::Worker"), None)
    assert not v.teardown(Fault("0000:01:00.0", 45, 50.0 + WINDOW + 1, 13, "late"), None)
    assert not v.teardown(Fault("0000:01:00.0", 45, 50.2), None)  # names no process
    ((fault, hit),) = v.due(1000.0)
    assert fault.code == 62 and [x.pid for x in hit] == [12542]


def test_a_process_is_a_victim_once_by_its_strongest_word() -> None:
    v = Victims()
    v.fault(Fault("0000:01:00.0", 79, 10.0, 5, "a"), [(5, "a"), (6, "b")])
    v.teardown(Fault("0000:01:00.0", 45, 10.1, 6, "b"), 79)
    ((_, hit),) = v.due(100.0)
    assert [(x.pid, x.how) for x in hit] == [(5, "named"), (6, "torn down")]


@pytest.mark.parametrize("n", [OPEN + 5])
def test_bounded(n: int) -> None:
    v = Victims()
    for i in range(n):
        v.fault(Fault("0000:01:00.0", 79, float(i)), [])
    assert len(v) == OPEN
    v = Victims()
    v.fault(Fault("0000:01:00.0", 79, 0.0), [(p, None) for p in range(MOST + 10)])
    ((_, hit),) = v.due(100.0)
    assert len(hit) == MOST


def test_the_words_and_the_json() -> None:
    hit = (
        Victim(4242, "python3", "named", "slurmstepd.scope", "1234"),
        Victim(5, None, "on the GPU", None, "sEKNKTV3WPV500", "alice"),
    )
    assert describe(hit) == (
        "pid 4242 python3 (named, Slurm job 1234, slurmstepd.scope), "
        "pid 5 (on the GPU, Slurm job SLUID sEKNKTV3WPV500, user alice)"
    )
    assert describe(()) == "no process"
    assert describe(hit, limit=1).endswith(", +1 more")
    assert as_json(hit[1]) == {
        "pid": 5,
        "how": "on the GPU",
        "job": "sEKNKTV3WPV500",
        "user": "alice",
    }


def test_the_victims_record_on_a_fake_host_from_a_real_journal(host: Host, make: Any) -> None:
    # An NVLink Xid 145 on one GPU, the driver's teardowns on it and on a peer (the shape of
    # NVIDIA/open-gpu-kernel-modules#1150), a Slurm job's processes on both GPUs.
    a, b = host.slots[0], host.slots[1]
    apps = [
        {"slot": a, "pid": 901, "name": "trainer", "mib": 2048},
        {"slot": a, "pid": 902, "name": "trainer", "mib": 1024},
        {"slot": b, "pid": 903, "name": "trainer", "mib": 1024},
    ]
    host.healthy(apps=apps)
    host.units.pids = {901: "slurmstepd.scope", 902: "slurmstepd.scope", 903: "user@1000.service"}
    host.units.cgroups = {
        901: "/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0",
        902: "/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0",
    }
    journal = make("[    1.000000] nvidia: loading out-of-tree module taints kernel.\n")
    clock = [time.time()]
    host.make_agent(units=host.units, journal_directory=journal, wall=lambda: clock[0])
    host.tick(2)  # the processes read
    at = clock[0] + 1
    dev_a, dev_b = a.rpartition(".")[0], b.rpartition(".")[0]
    for when, text in (
        (
            at,
            f"NVRM: Xid (PCI:{dev_a}): 145, pid=901, name=trainer, RLW_RXPIPE Fatal XC0 i0 Link 11",
        ),
        (
            at + 0.5,
            f"NVRM: Xid (PCI:{dev_a}): 45, pid=902, name=trainer, Ch 00000001 {CAUSED}",
        ),
        (
            at + 0.5,
            f"NVRM: Xid (PCI:{dev_b}): 45, pid=903, name=trainer, Ch 00000002 {CAUSED}",
        ),
    ):
        append(journal, kernel_entry(when, text))
    clock[0] = at + 2
    host.tick(1)
    assert host.events(Event.FAULT_VICTIMS) == []  # its teardowns may still come
    clock[0] = at + WINDOW + 1
    host.tick(1)
    (told,) = host.events(Event.FAULT_VICTIMS)
    assert told.getMessage() == (
        f"GPU {a}: Xid 145 hit pid 901 trainer (named, Slurm job 1234, slurmstepd.scope), "
        "pid 902 trainer (torn down, Slurm job SLUID sEKNKTV3WPV500, slurmstepd.scope), "
        "pid 903 trainer (torn down, user@1000.service, user "
        f"{user_name(1000) or 'uid 1000'})"
    )
    fields = told.__dict__
    assert (fields["PCI_SLOT"], fields["XID"], fields["VICTIM_COUNT"]) == (a, "145", "3")
    assert [v["pid"] for v in json.loads(fields["VICTIMS"])] == [901, 902, 903]
    # Told once; a restart does not tell the boot's faults again.
    host.tick(2)
    host.make_agent(units=host.units, journal_directory=journal, wall=lambda: clock[0] + 100)
    host.tick(2)
    assert len(host.events(Event.FAULT_VICTIMS)) == 1


def victims_entry(at: float, slot: str, hit: str) -> bytes:
    """The agent's FAULT_VICTIMS record, as journald stores it from the service."""
    return export_entry(
        [
            ("__REALTIME_TIMESTAMP", str(int(at * 1e6)).encode()),
            ("__MONOTONIC_TIMESTAMP", str(int((at - 1_699_990_000) * 1e6)).encode()),
            ("_BOOT_ID", this_boot().encode()),
            ("_TRANSPORT", b"journal"),
            ("_SYSTEMD_UNIT", b"gpuagent.service"),
            ("_UID", b"999"),
            ("MESSAGE_ID", Event.FAULT_VICTIMS.value.encode()),
            ("PCI_SLOT", slot.encode()),
            ("XID", b"79"),
            ("VICTIMS", hit.encode()),
            ("MESSAGE", f"GPU {slot}: Xid 79 hit ...".encode()),
        ]
    )


def test_the_command_lists_them_for_a_requeue_script(tmp_path: str, make: Any) -> None:
    journal = make("[    1.000000] nvidia: loading out-of-tree module taints kernel.\n")
    now = time.time()
    hit = '[{"pid":901,"how":"named","name":"trainer","job":"1234"},{"pid":"x"},{"how":1}]'
    append(journal, victims_entry(now - 60, "0000:18:00.0", hit))
    append(journal, victims_entry(now - 30, "0000:2a:00.0", "not json \x1b[2J"))
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'journal_directory = "{journal}"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "victims", "--json"])
    assert res.exit_code == 0, res.stderr
    got = json.loads(res.stdout)
    assert [(g["pci_slot"], g["xid"]) for g in got] == [("0000:18:00.0", 79), ("0000:2a:00.0", 79)]
    assert got[0]["victims"] == [
        {"pid": 901, "name": "trainer", "how": "named", "unit": None, "job": "1234", "user": None}
    ]
    assert got[1]["victims"] == []  # a field that is not the agent's JSON: none
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "victims", "18:00.0"])
    (line,) = res.stdout.splitlines()
    assert line.endswith("0000:18:00.0  Xid 79 hit pid 901 trainer (named, Slurm job 1234)")
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "history", "0000:18:00.0"])
    assert "victims       Xid 79 hit pid 901 trainer (named, Slurm job 1234)" in res.stdout
    assert CliRunner(mix_stderr=False).invoke(main, ["victims", "bogus"]).exit_code == 2
