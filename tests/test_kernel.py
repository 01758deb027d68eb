"""The kernel log as the agent's source: real journal files (make-test-journal, this boot),
read by an agent on a fake host, seen in the journal lines, the state, status and metrics."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from gpuagent import metrics
from gpuagent.agent import Agent
from gpuagent.commands import status, statustext
from gpuagent.configkeys import Override
from gpuagent.logs import Event, EventLog
from gpuagent.schema import GpuEntry, State
from gpuagent.sources.kernel.kernel import KernelRecords
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.views import BusView, PciGpu
from tests import fakesysfs, test_kernlog
from tests.conftest import Clock, Host
from tests.test_kernlog import append, corpus_text, export, userspace

make = test_kernlog.make

# The corpus's lines moved to the fake host's slots (its first three GPUs).
FELL_OFF = corpus_text("xid-79-driver535-pid-unknown-crashdump").replace("0000:a1:00", "0000:18:00")
APP = corpus_text("xid-13-driver535-a800-pid-unknown").replace("0000:43:00", "0000:2a:00")
SXID = corpus_text("sxid-22013-driver570-open-nvswitch")
# Any user can log this with logger(1); it is not the driver's.
FORGED = "#@transport stdout\n#@identifier evil\nNVRM: Xid (PCI:0000:3a:00): 48, pid=1, DBE\n"
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def xid_lines(host: Host, event: Event) -> list[logging.LogRecord]:
    return host.events(event)


def running_before(agent: Agent) -> Agent:
    """``agent`` as one that started before the journal's records (at boot), so that they are
    new faults to it, not a restart's restatement."""
    agent.verdict.started = 0.0
    return agent


def entry(state: State, slot: str) -> GpuEntry:
    return next(g for g in state["gpus"] if g["pci_slot"] == slot)


def test_xids_from_the_journal_on_every_surface(host: Host, make: Any) -> None:
    journal = make(FELL_OFF + APP + SXID + FORGED)
    agent = running_before(host.make_agent(journal_directory=journal))
    snap = host.tick().state
    fell, app, forged = host.slots[0], host.slots[1], host.slots[2]
    sick = entry(snap, fell)
    assert sick["health"] == "critical"
    assert [(p["kind"], p["xid"], p["action"]) for p in sick["problems"]] == [("xid", 79, "reboot")]
    assert [(c["xid"], c["count"], c["severity"]) for c in sick["xids"]] == [(79, 1, "critical")]
    assert sick["uuid"] == UUID
    assert [(c["xid"], c["count"]) for c in entry(snap, app)["xids"]] == [(13, 2)]
    assert entry(snap, app)["health"] == "ok"
    assert entry(snap, forged)["xids"] == []
    # One line for the fault, with its own event and fields; none of the generic kind.
    (line,) = xid_lines(host, Event.XID_PROBLEM)
    assert line.levelno == logging.ERROR
    assert (fell, "79", "reboot") == (line.PCI_SLOT, line.XID, line.ACTION)  # type: ignore[attr-defined]
    assert "Xid 79 (GPU has fallen off the bus)" in line.getMessage()
    (counted,) = xid_lines(host, Event.XID_COUNTED)
    assert (counted.PCI_SLOT, counted.XID, counted.levelno) == (app, "13", logging.INFO)  # type: ignore[attr-defined]
    assert len(xid_lines(host, Event.SXID)) == 1
    assert host.events(Event.JOURNAL_UNREADABLE) == []
    # Surfaces: status exit 2 with the counts, Prometheus counters and info.
    assert status.judge(snap, agent.wall())[0] == status.ExitCode.CRITICAL
    text = statustext.render(snap, agent.wall(), status.ExitCode.CRITICAL, "")
    assert "Xid 79 \u00d71, last " in text
    assert "NVSwitch 0000:04:00.0: SXid 22013 \u00d73" in text
    prom = metrics.render(snap)
    smi_uuid = entry(snap, app)["uuid"]
    assert smi_uuid is not None and smi_uuid.startswith("GPU-")
    assert f'xid_errors_total{{pci_slot="{app}",uuid="{smi_uuid}",xid="13"}} 2.0' in prom
    assert f'gpuagent_gpu_xid_errors_total{{pci_slot="{fell}",uuid="{UUID}",xid="79"}} 1.0' in prom
    assert 'gpuagent_nvswitch_sxid_errors_total{pci_slot="0000:04:00.0",sxid="22013"} 3.0' in prom
    assert 'severity="critical"' in prom and 'xid="79"' in prom
    # Never per tick.
    host.tick(3)
    assert len(xid_lines(host, Event.XID_PROBLEM)) == 1
    assert len(xid_lines(host, Event.XID_COUNTED)) == 1
    # A restart reads the boot again to the same counts and says each code once more.
    host.make_agent(journal_directory=journal)
    host.tick()
    assert entry(host.state, fell)["xids"] == sick["xids"]
    assert len(xid_lines(host, Event.XID_PROBLEM)) == 2


def test_xids_are_read_whatever_the_gates_say(host: Host, make: Any) -> None:
    host.make_agent(journal_directory=make(FELL_OFF), nvidia_smi="/nonexistent/nvidia-smi")
    host.tick()
    assert host.probe["gate"] == "nvidia_smi_missing"
    assert entry(host.state, host.slots[0])["health"] == "critical"
    assert len(xid_lines(host, Event.XID_PROBLEM)) == 1


def test_a_gpu_gone_from_the_bus_keeps_its_xids(host: Host, make: Any) -> None:
    text = FELL_OFF.replace("0000:18:00", "0000:c1:00")
    host.make_agent(journal_directory=make(text))
    host.tick()
    gone = entry(host.state, "0000:c1:00.0")
    assert gone["health"] == "critical"
    assert [c["xid"] for c in gone["xids"]] == [79]


def test_an_unreadable_journal_is_one_warning_and_a_problem(host: Host, make: Any) -> None:
    missing = os.path.join(host.dir, "journal")
    agent = host.make_agent(journal_directory=missing)
    host.tick(3)
    (line,) = host.events(Event.JOURNAL_UNREADABLE)
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith(f"{missing}: cannot read: ")
    assert missing == line.JOURNAL_DIRECTORY  # type: ignore[attr-defined]
    assert host.state["problems"]["journal"].startswith(f"{missing}: cannot read")
    assert host.probe["state"] == "ok"  # sampling goes on
    assert status.judge(host.state, agent.wall())[0] == status.ExitCode.WARNING
    # The journal appears (journald started): one info line, the Xids come.
    made = make(FELL_OFF, "other")
    os.rename(made, missing)
    host.tick()
    assert len(host.events(Event.JOURNAL_READABLE)) == 1
    assert "journal" not in host.state["problems"]
    assert entry(host.state, host.slots[0])["health"] == "critical"


def test_a_reload_to_another_journal_counts_it_instead(host: Host, make: Any) -> None:
    agent = host.make_agent(journal_directory=make(FELL_OFF))
    host.tick()
    agent.configure(host.config(journal_directory=make(APP, "app")))
    snap = host.tick().state
    assert entry(snap, host.slots[0])["xids"] == []
    assert entry(snap, host.slots[0])["health"] == "ok"
    assert len(host.events(Event.PROBLEM_CLEARED)) == 1
    assert [c["xid"] for c in entry(snap, host.slots[1])["xids"]] == [13]


def test_a_nonfatal_link_error_turned_fatal_is_said_once_more(host: Host, make: Any) -> None:
    slot = host.slots[0]
    nonfatal = "NVRM: Xid (PCI:0000:18:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (0x0)\n"
    # Logged a minute ago: well within xid_warning_hold, the warning holds.
    journal = make(nonfatal, start=time.time() - 60)
    running_before(host.make_agent(journal_directory=journal))
    host.tick()
    (first,) = xid_lines(host, Event.XID_PROBLEM)
    assert first.levelno == logging.WARNING
    assert entry(host.state, slot)["health"] == "warning"
    append(journal, export(make(nonfatal.replace("Nonfatal", "Fatal"), "fatal", start=time.time())))
    deadline = time.monotonic() + 20
    while entry(host.state, slot)["health"] != "critical" and time.monotonic() < deadline:
        host.tick()
    assert entry(host.state, slot)["health"] == "critical"
    lines = xid_lines(host, Event.XID_PROBLEM)
    assert [r.levelno for r in lines] == [logging.WARNING, logging.ERROR]
    assert "critical xid: Xid 145" in lines[1].getMessage()
    assert [c["count"] for c in entry(host.state, slot)["xids"]] == [2]
    host.tick(2)
    assert len(xid_lines(host, Event.XID_PROBLEM)) == 2


def test_a_recovery_action_back_to_none_clears_the_problem(host: Host, make: Any) -> None:
    slot = host.slots[0]
    asked = (
        "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
        "(GPU Reset Required)\n"
    )
    journal = make(asked)
    host.make_agent(journal_directory=journal)
    host.tick()
    (problem,) = entry(host.state, slot)["problems"]
    assert (problem["kind"], problem["xid"], problem["action"]) == ("xid", 154, "reset_gpu")
    assert len(xid_lines(host, Event.XID_PROBLEM)) == 1
    # The driver states that the GPU needs no recovery any more: "to 0x0 (None)".
    done = asked.replace(
        "from 0x0 (None) to 0x1 (GPU Reset Required)", "from 0x1 (GPU Reset Required) to 0x0 (None)"
    )
    append(journal, export(make(done, "done")))
    deadline = time.monotonic() + 20
    while entry(host.state, slot)["health"] != "ok" and time.monotonic() < deadline:
        host.tick()
    snap = host.state
    assert entry(snap, slot)["health"] == "ok"
    assert entry(snap, slot)["problems"] == []
    assert [(c["xid"], c["count"]) for c in entry(snap, slot)["xids"]] == [(154, 2)]
    (cleared,) = host.events(Event.PROBLEM_CLEARED)
    assert slot in cleared.getMessage()
    host.tick(2)
    assert len(xid_lines(host, Event.XID_PROBLEM)) == 1
    assert len(host.events(Event.PROBLEM_CLEARED)) == 1


def test_a_gpu_the_driver_could_not_initialise(host: Host, make: Any) -> None:
    text = corpus_text("rminitadapter-failed-gsp-driver550").replace("0000:98:00", "0000:5d:00")
    slot = host.slots[3]
    running_before(host.make_agent(journal_directory=make(text)))
    host.tick(3)
    (problem,) = entry(host.state, slot)["problems"]
    assert (problem["kind"], problem["severity"], problem["action"]) == (
        "init_failed",
        "critical",
        "reboot",
    )
    (line,) = host.events(Event.GPU_INIT_FAILED)
    assert line.levelno == logging.ERROR
    assert "RmInitAdapter failed (0x62:0x65:1792)" in line.getMessage()
    assert (slot, "reboot") == (line.PCI_SLOT, line.ACTION)  # type: ignore[attr-defined]
    assert host.events(Event.XID_PROBLEM) == []


def test_a_warning_xid_ends_after_the_hold_a_critical_one_does_not(host: Host, make: Any) -> None:
    # The B200's Nonfatal Xid 145 (warning; its redacted address put on a GPU of the fake
    # host) and the crash-dump host's Xid 79 (critical), logged just now.
    link = corpus_text("xid-145-137-b200-user-redacted-pci").splitlines()[1]
    link = link.replace("PCI:...", "PCI:0000:2a:00").replace("(...)", "(0x0)") + "\n"
    wall = Clock(time.time())
    journal = make(link + FELL_OFF, start=wall.now - 10)
    agent = host.make_agent(journal_directory=journal, xid_warning_hold=3600.0, wall=wall)
    host.tick()
    app, gone = host.slots[1], host.slots[0]
    assert [p["xid"] for p in entry(host.state, app)["problems"]] == [145]
    assert entry(host.state, app)["health"] == "warning"
    # Held for 20 s after its record (9 s before the first tick): held still, on the agent's
    # monotonic clock, which each tick moves on by the interval (10 s).
    agent.configure(host.config(journal_directory=journal, xid_warning_hold=20.0))
    host.tick()
    assert [p["xid"] for p in entry(host.state, app)["problems"]] == [145]
    # 15 s on, past the hold: the warning ends with its end line; Xid 79 holds until the boot
    # ends.
    wall.now += 15
    host.tick()
    assert entry(host.state, app)["problems"] == []
    assert [c["count"] for c in entry(host.state, app)["xids"]] == [1]  # still counted
    (cleared,) = host.events(Event.PROBLEM_CLEARED)
    assert (
        cleared.getMessage() == f"GPU {app}: Xid 145: no record for 20 s (xid_warning_hold); ended"
    )
    assert [(p["kind"], p.get("xid")) for p in entry(host.state, gone)["problems"]] == [("xid", 79)]


def _nonfatal_link() -> str:
    """The B200's Nonfatal Xid 145 (a warning), its redacted address put on the fake host's
    second GPU."""
    link = corpus_text("xid-145-137-b200-user-redacted-pci").splitlines()[1]
    return link.replace("PCI:...", "PCI:0000:2a:00").replace("(...)", "(0x0)") + "\n"


def test_stepping_the_wall_clock_back_does_not_bring_an_ended_xid_warning_back(
    host: Host, make: Any
) -> None:
    wall = Clock(time.time())
    journal = make(_nonfatal_link(), start=wall.now - 10)
    host.make_agent(journal_directory=journal, xid_warning_hold=20.0, wall=wall)
    app = host.slots[1]
    host.tick(3)
    assert entry(host.state, app)["problems"] == []
    # Someone sets the clock back an hour: the record is "newer" than the wall clock now.
    wall.now -= 3600
    host.tick(2)
    assert entry(host.state, app)["problems"] == []
    assert len(host.events(Event.PROBLEM_CLEARED)) == 1


def test_stepping_the_wall_clock_on_does_not_end_a_held_xid_warning(host: Host, make: Any) -> None:
    wall = Clock(time.time())
    journal = make(_nonfatal_link(), start=wall.now - 10)
    host.make_agent(journal_directory=journal, xid_warning_hold=3600.0, wall=wall)
    app = host.slots[1]
    host.tick()
    wall.now += 7200
    host.tick()
    assert [p["xid"] for p in entry(host.state, app)["problems"]] == [145]
    assert host.events(Event.PROBLEM_CLEARED) == []


class FedJournal(KernelLog):
    """A journal whose next read gives ``pending``: (realtime s, message) pairs."""

    def __init__(self, directory: str) -> None:
        self.directory, self.error = directory, None
        self.pending: list[tuple[float, str]] = []
        self.reading = False

    def poll(
        self, sink: Any, loaders: Any = None, other: Any = None, budget: float | None = None
    ) -> int:
        read, self.pending = self.pending, []
        for at, message in read:
            sink(at, message)
        return len(read)


def test_a_recurrence_logged_after_the_clock_went_back_restarts_the_hold() -> None:
    mono, wall = Clock(0.0), Clock(1_700_000_000.0)
    journal = FedJournal("")
    kernel = KernelRecords(
        "", EventLog(), open_log=lambda _: journal, hold=60.0, wall=wall, monotonic=mono
    )
    gpu = PciGpu("0000:2a:00.0", "0x2901", "0x030200", "nvidia")
    bus = BusView((gpu,), frozenset({gpu.slot}))
    journal.pending = [(wall.now - 5, _nonfatal_link().removeprefix("kernel: "))]
    assert [f.kind for f in kernel.poll(bus)["0000:2a:00.0"]] == ["xid"]
    # 50 s on the clock is set back a day; 50 s later the Xid comes again, stamped then.
    mono.now, wall.now = 50.0, wall.now + 50 - 86400
    assert [f.kind for f in kernel.poll(bus)["0000:2a:00.0"]] == ["xid"]
    mono.now, wall.now = 100.0, wall.now + 50
    journal.pending = [(wall.now, _nonfatal_link().removeprefix("kernel: "))]
    assert [f.kind for f in kernel.poll(bus)["0000:2a:00.0"]] == ["xid"]
    # Held 60 s from the recurrence on the monotonic clock, not from the first record.
    mono.now, wall.now = 150.0, wall.now + 50
    assert [f.kind for f in kernel.poll(bus)["0000:2a:00.0"]] == ["xid"]
    mono.now, wall.now = 160.0, wall.now + 10
    assert "0000:2a:00.0" not in kernel.poll(bus)


def test_the_sites_xid_table_has_the_last_word(host: Host, make: Any) -> None:
    journal = make(APP)
    app = host.slots[1]
    agent = host.make_agent(
        journal_directory=journal, xid={13: Override(severity="critical", action="reset_gpu")}
    )
    host.tick()
    (problem,) = entry(host.state, app)["problems"]
    assert (problem["severity"], problem["action"], problem["xid"]) == ("critical", "reset_gpu", 13)
    assert problem["message"].endswith("(as this site's [xid] table says)")
    assert [(c["severity"], c["action"]) for c in entry(host.state, app)["xids"]] == [
        ("critical", "reset_gpu")
    ]
    assert status.judge(host.state, time.time())[0] == status.ExitCode.CRITICAL
    # A reload to 13 = { severity = "none" }: counted only, no problem.
    agent.configure(host.config(journal_directory=journal, xid={13: Override(severity="none")}))
    host.tick()
    assert entry(host.state, app)["problems"] == []
    assert [c["severity"] for c in entry(host.state, app)["xids"]] == ["none"]


# leptonai/gpud#1160 and #1174: a GB200 tray's Xid naming 0000:00:00, where a root port sits.
NETIR = (
    "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 "
    "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)\n"
)


def test_an_xid_naming_a_root_port_is_the_hosts_not_a_gpus(host: Host, make: Any) -> None:
    fakesysfs.add_device(host.root, "0000:00:00.0", 0x8086, 0x09A2, 0x060400)
    host.healthy()
    host.make_agent(journal_directory=make(NETIR))
    host.tick(2)
    assert "0000:00:00.0" not in [g["pci_slot"] for g in host.state["gpus"]]
    assert len(host.state["gpus"]) == len(host.slots)
    (problem,) = host.state["host_problems"]
    assert (problem["kind"], problem["severity"], problem["action"], problem["xid"]) == (
        "xid",
        "warning",
        "check_host",
        149,
    )
    assert problem["message"].endswith(
        "; logged for PCI 0000:00:00.0, which is no GPU (sysfs: a bridge (class 0x060400)): "
        "check the host"
    )
    assert status.judge(host.state, time.time())[0] == status.ExitCode.WARNING
    # No GPU series for it: the host's problem names the address in its message alone.
    assert 'pci_slot="0000:00:00' not in metrics.render(host.state)
    (line,) = xid_lines(host, Event.XID_PROBLEM)
    assert line.getMessage().startswith("host: warning xid: Xid 149 ")


def test_an_xid_naming_nothing_on_the_bus_says_so(host: Host, make: Any) -> None:
    host.make_agent(journal_directory=make(NETIR))
    host.tick()
    (problem,) = host.state["host_problems"]
    assert "which is no GPU (sysfs: nothing)" in problem["message"]


def test_a_gpu_seen_on_the_bus_that_fell_off_stays_a_gpu_problem(host: Host, make: Any) -> None:
    # The crash-dump host's Xid 79 lines without its UUID banner: only the bus knew the GPU.
    gone = host.slots[0]
    text = "".join(line + "\n" for line in FELL_OFF.splitlines() if "GPU-" not in line)
    journal = make(text, start=time.time())
    host.make_agent()
    host.tick()
    fakesysfs.remove_device(host.root, gone)
    host.agent.configure(host.config(journal_directory=journal))  # type: ignore[union-attr]
    host.tick()
    assert host.state["host_problems"] == []
    assert [
        (p["kind"], p.get("xid"), p["action"]) for p in entry(host.state, gone)["problems"]
    ] == [
        ("gone_from_bus", None, "reboot"),
        ("xid", 79, "reboot"),
    ]


def test_an_xid_in_a_module_loaders_record_counts_for_nothing(host: Host, make: Any) -> None:
    # The loaders' records are read for why the module is absent, never as the driver's.
    journal = make("[    1.000000] Linux version 6.1.0-28-amd64\n")
    xid = "NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus."
    append(journal, userspace(xid, comm="modprobe") + userspace(xid, comm="systemd-modules-load"))
    host.make_agent(journal_directory=journal)
    host.tick()
    assert entry(host.state, host.slots[0])["xids"] == []
    assert entry(host.state, host.slots[0])["problems"] == []
    assert host.state["host_problems"] == []


def test_a_warning_xid_says_its_end_and_its_lapse_says_why(host: Host, make: Any) -> None:
    """The end it tells is the end it has (issue 39): the state's ``ends`` and the start line
    come from the hold that ends it, and its end line says it lapsed, nobody's repair."""
    wall = Clock(time.time())
    journal = make(_nonfatal_link(), start=wall.now - 10)
    host.make_agent(journal_directory=journal, xid_warning_hold=20.0, wall=wall)
    app = host.slots[1]
    host.tick()
    (p,) = entry(host.state, app)["problems"]
    assert (
        p["ends"]
        == f"ends by itself 20 s after its last record; or sooner: gpuagent clear {app} xid"
    )
    (start,) = host.events(Event.XID_PROBLEM)
    assert p["ends"] in start.getMessage()
    assert "after the repair" not in start.getMessage()
    host.tick(3)
    assert entry(host.state, app)["problems"] == []
    (end,) = host.events(Event.PROBLEM_CLEARED)
    assert end.getMessage() == f"GPU {app}: Xid 145: no record for 20 s (xid_warning_hold); ended"
