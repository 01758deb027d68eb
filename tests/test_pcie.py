"""The PCIe path on every surface: a real journal (make-test-journal) with the kernel's AER
records of a capture, a GPU laid out under its root port as sysfs does, and the agent's
state, journal lines and status; and the kernel source's Xid 79 blamed on its path."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from gpuagent.commands import status
from gpuagent.configkeys import Override
from gpuagent.logs import Event, EventLog
from gpuagent.sources.bus import pci
from gpuagent.sources.kernel import aerrecord
from gpuagent.sources.kernel.kernel import KernelRecords
from gpuagent.views import AerRecord, BusView, PciGpu, XidInfo
from tests import fakesysfs, test_kernlog, xidcorpus
from tests.conftest import Host
from tests.test_aer import CORPUS, sample
from tests.test_kernel import FedJournal

make = test_kernlog.make
FELL_OFF = "aer-fatal-surprise-down-root-port-then-xid79-id-format"
ROOT, BRIDGE = "0000:00:02.0", "0000:17:00.0"
INFO = XidInfo("GPU has fallen off the bus", "critical", "reboot", "reboot the host")


def capture(slot: str) -> str:
    """The capture, its GPU (0000:02:00) moved to ``slot``; its root port stays 00:02.0."""
    with open(os.path.join(CORPUS, FELL_OFF + ".txt"), encoding="utf-8") as f:
        return f.read().replace("0000:02:00", slot.rsplit(".", 1)[0])


def test_an_xid_79_after_its_root_port_erred_blames_the_path(host: Host, make: Any) -> None:
    gpu = host.slots[0]
    fakesysfs.nest(host.root, gpu, (ROOT, BRIDGE))
    host.make_agent(journal_directory=make(capture(gpu)))
    snap = host.tick().state
    (entry,) = [g for g in snap["gpus"] if g["pci_slot"] == gpu]
    assert entry["health"] == "critical"
    problems = {p["kind"]: p for p in entry["problems"]}
    assert set(problems) == {"xid", "pcie_error"}
    xid, path = problems["xid"], problems["pcie_error"]
    assert (xid["xid"], xid["severity"], xid["action"]) == (79, "critical", "check_host")
    # The count says the same as the problem.
    assert [(c["xid"], c["action"]) for c in entry["xids"]] == [(79, "check_host")]
    assert (
        f"PCIe fatal and correctable errors at {ROOT}, its root port, 0 s before"
        in (xid["message"])
    )
    assert f"lspci -vvv -s {ROOT}" in xid["message"]
    assert (path["severity"], path["action"], path["pcie_device"]) == (
        "critical",
        "check_host",
        ROOT,
    )
    assert path["message"].startswith(f"PCIe uncorrectable errors at {ROOT}, its root port: ")
    # The journal says each once, with its own MESSAGE_ID and the path's action.
    (line,) = host.events(Event.XID_PROBLEM)
    assert (line.XID, line.ACTION) == ("79", "check_host")  # type: ignore[attr-defined]
    (start,) = host.events(Event.PROBLEM_PCIE_ERROR)
    assert start.levelno == logging.ERROR and ROOT in start.getMessage()
    assert status.judge(snap, time.time())[0] == status.ExitCode.CRITICAL
    host.tick(2)
    assert len(host.events(Event.PROBLEM_PCIE_ERROR)) == 1


def test_other_gpus_and_a_flat_tree_are_not_blamed(host: Host, make: Any) -> None:
    gpu, other = host.slots[0], host.slots[1]
    host.make_agent(journal_directory=make(capture(gpu)))
    snap = host.tick().state
    (entry,) = [g for g in snap["gpus"] if g["pci_slot"] == gpu]
    # Without its bridges in sysfs the GPU's path is the GPU alone: the catalog's Xid 79.
    assert [(p["kind"], p["action"]) for p in entry["problems"]] == [("xid", "reboot")]
    assert all(not g["problems"] for g in snap["gpus"] if g["pci_slot"] == other)


def nested_with_counters(host: Host, gpu: str) -> str:
    """``gpu`` under ROOT and BRIDGE, each with the ABI sample's AER counter files; returns
    sysfs's devices directory."""
    fakesysfs.nest(host.root, gpu, (ROOT, BRIDGE))
    links = os.path.join(host.root, "bus", "pci", "devices")
    for slot in (ROOT, BRIDGE, gpu):
        for kind in ("fatal", "nonfatal"):
            with open(os.path.join(links, slot, f"aer_dev_{kind}"), "w", encoding="ascii") as f:
                f.write(sample(kind))
    return links


def test_counters_rising_on_a_bridge_are_the_gpus_problem(host: Host) -> None:
    gpu = host.slots[0]
    links = nested_with_counters(host, gpu)
    host.make_agent()
    assert not [g for g in host.tick().state["gpus"] if g["problems"]]
    nonfatal = sample("nonfatal").replace("Completion Timeout 0", "Completion Timeout 3")
    with open(os.path.join(links, BRIDGE, "aer_dev_nonfatal"), "w", encoding="ascii") as f:
        f.write(nonfatal)
    snap = host.tick().state
    (sick,) = [g for g in snap["gpus"] if g["problems"]]
    assert sick["pci_slot"] == gpu and sick["health"] == "warning"
    (problem,) = sick["problems"]
    assert (problem["kind"], problem["pcie_device"], problem["action"]) == (
        "pcie_error",
        BRIDGE,
        "check_host",
    )
    assert "3 non-fatal (3 Completion Timeout)" in problem["message"]
    assert status.judge(snap, time.time())[0] == status.ExitCode.WARNING


def test_the_kernel_source_blames_an_xid_79_on_its_path_within_the_hour() -> None:
    journal = FedJournal("")
    kernel = KernelRecords("", EventLog(), open_log=lambda _: journal, wall=lambda: 10_000.0)
    gpu = PciGpu("0000:02:00.0", "0x1db4", "0x030200", "nvidia")
    bus = BusView((gpu,), frozenset({gpu.slot}))
    lines = xidcorpus.messages(FELL_OFF, CORPUS)
    journal.pending = [(1000.0 + i, m) for i, m in enumerate(lines)]
    paths: dict[str, tuple[str, ...]] = {gpu.slot: (ROOT, "0000:01:00.0", gpu.slot)}
    (xid,) = kernel.poll(bus, path=paths.__getitem__)[gpu.slot]
    assert xid.action == "check_host"
    assert f"at {ROOT}, its root port, 8 s before" in xid.message
    # The path found once holds for the boot: the GPU may leave sysfs after its Xid 79.
    paths[gpu.slot] = (gpu.slot,)
    (xid,) = kernel.poll(bus, path=paths.__getitem__)[gpu.slot]
    assert xid.action == "check_host"
    assert kernel.view([gpu.slot]).xids[gpu.slot, 79].info.action == "check_host"
    # The site's [xid] action has the last word.
    kernel.configure("", {79: Override(action="drain_and_rma")})
    (xid,) = kernel.poll(bus, path=paths.__getitem__)[gpu.slot]
    assert xid.action == "drain_and_rma"
    # Without its path the same records are the catalog's Xid 79.
    journal2 = FedJournal("")
    plain = KernelRecords("", EventLog(), open_log=lambda _: journal2, wall=lambda: 10_000.0)
    journal2.pending = [(1000.0 + i, m) for i, m in enumerate(lines)]
    (xid,) = plain.poll(bus)[gpu.slot]
    assert xid.action == "reboot"


def test_fallen_off_looks_back_an_hour_above_the_gpu_only() -> None:
    path = (ROOT, BRIDGE, "0000:18:00.0")
    at = 10_000.0
    old = AerRecord(at - aerrecord.LOOKBACK - 1, ROOT, ROOT, "fatal")
    assert aerrecord.fallen_off(INFO, path, [old], at) is None
    own = AerRecord(at - 5, ROOT, "0000:18:00.0", "fatal")
    assert aerrecord.fallen_off(INFO, path, [own], at) is None  # the GPU's own: the board
    after = AerRecord(at + 1, ROOT, BRIDGE, "nonfatal")
    assert aerrecord.fallen_off(INFO, path, [after], at) is None
    other = AerRecord(at - 5, ROOT, "0000:99:00.0", "fatal")
    assert aerrecord.fallen_off(INFO, path, [other], at) is None
    hits = [
        AerRecord(at - 600, ROOT, ROOT, "correctable"),
        AerRecord(at - 60, ROOT, BRIDGE, "nonfatal"),
        AerRecord(at - 30, ROOT, BRIDGE, "correctable"),
    ]
    blamed = aerrecord.fallen_off(INFO, path, hits, at)
    assert blamed is not None and blamed.action == "check_host"
    assert blamed.severity == "critical" and blamed.name == INFO.name
    assert blamed.advice.startswith(
        f"its path logged PCIe non-fatal and correctable errors at {BRIDGE}, a bridge on its "
        "path (PCIe switch or riser), 30 s before: "
    )


def test_path_of_a_nested_and_a_flat_entry(host: Host) -> None:
    gpu, flat = host.slots[0], host.slots[1]
    fakesysfs.nest(host.root, gpu, (ROOT, BRIDGE))
    assert pci.path_of(host.root, gpu) == (ROOT, BRIDGE, gpu)
    assert pci.path_of(host.root, flat) == (flat,)
    assert pci.path_of(host.root, "0000:77:00.0") == ("0000:77:00.0",)


def test_a_firmware_first_hosts_aer_lines_blame_an_xid_79_on_its_path(
    host: Host, make: Any
) -> None:
    """Where the firmware handles PCIe errors first (APEI/GHES) the kernel prints no "error
    received" line, only the erring device's registers (cper_print_aer, drivers/pci/pcie/
    aer.c): they blame an Xid 79 as the records do (issue 39)."""
    gpu = host.slots[0]
    fakesysfs.nest(host.root, gpu, (ROOT, BRIDGE))
    lines = (
        f"kernel: pcieport {BRIDGE}: AER: aer_status: 0x00000020, aer_mask: 0x00000000\n"
        f"kernel: pcieport {BRIDGE}: AER: aer_layer=Transaction Layer, aer_agent=Receiver ID\n"
        f"kernel: NVRM: Xid (PCI:{gpu[:-2]}): 79, pid='<unknown>', name=<unknown>, GPU has "
        "fallen off the bus.\n"
    )
    host.make_agent(journal_directory=make(lines))
    snap = host.tick().state
    (entry,) = [g for g in snap["gpus"] if g["pci_slot"] == gpu]
    (xid,) = [p for p in entry["problems"] if p["kind"] == "xid"]
    assert xid["action"] == "check_host"
    assert f"PCIe firmware-reported errors at {BRIDGE}, a bridge on its path" in xid["message"]
    # Its severity unknown, it makes no pcie_error of its own: the counters say that.
    assert [p["kind"] for p in entry["problems"]] == ["xid"]


def test_the_firmware_first_line_is_a_record_of_the_device_that_erred() -> None:
    line = "pcieport 0000:00:1C.0: AER: aer_status: 0x00004000, aer_mask: 0x00000000"
    assert aerrecord.record(5.0, line) == AerRecord(5.0, "0000:00:1c.0", "0000:00:1c.0", "reported")
    for other in (
        "pcieport 0000:00:1c.0: AER: aer_layer=Transaction Layer, aer_agent=Receiver ID",
        "pcieport 0000:00:1c.0: AER: aer_status: 0x00004000",
        "tmpfs: 0000:00:1c.0: AER: aer_status: 0x00004000, aer_mask: 0x00000000 x",
    ):
        assert aerrecord.record(5.0, other) is None


def test_the_paths_counters_rising_blame_an_xid_79(host: Host, make: Any) -> None:
    """Issue 30's promise, tried (issue 39): where the kernel prints no AER record (the
    firmware handles PCIe errors first), the counters of a bridge on the path rose: an Xid 79
    read then is blamed on that bridge as its records would blame it."""
    gpu = host.slots[0]
    links = nested_with_counters(host, gpu)
    journal = make("kernel: nothing of the driver's\n", start=time.time() - 60)
    host.make_agent(journal_directory=journal)
    host.tick()
    fatal = sample("fatal").replace("Surprise Down Error 0", "Surprise Down Error 1")
    with open(os.path.join(links, BRIDGE, "aer_dev_fatal"), "w", encoding="ascii") as f:
        f.write(fatal)
    host.tick()
    fell = f"NVRM: Xid (PCI:{gpu[:-2]}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off"
    xid = make(f"kernel: {fell} the bus.\n", "x", start=time.time())
    test_kernlog.append(journal, test_kernlog.export(xid))
    for _ in range(3):
        snap = host.tick().state
    (entry,) = [g for g in snap["gpus"] if g["pci_slot"] == gpu]
    (xid,) = [p for p in entry["problems"] if p["kind"] == "xid"]
    assert xid["action"] == "check_host"
    assert f"PCIe fatal errors at {BRIDGE}, a bridge on its path" in xid["message"]


def test_fallen_off_takes_the_counters_rise_seen_up_to_a_minute_after() -> None:
    path = (ROOT, BRIDGE, "0000:18:00.0")
    at = 10_000.0
    late = {BRIDGE: (at + aerrecord.SEEN_AFTER + 1, "fatal")}
    assert aerrecord.fallen_off(INFO, path, [], at, late) is None
    own = {"0000:18:00.0": (at, "fatal")}
    assert aerrecord.fallen_off(INFO, path, [], at, own) is None  # the GPU's own: the board
    blamed = aerrecord.fallen_off(INFO, path, [], at, {BRIDGE: (at + 10, "nonfatal")})
    assert blamed is not None and blamed.action == "check_host"
    assert blamed.advice.startswith(
        f"its path logged PCIe non-fatal errors at {BRIDGE}, a bridge on its path (PCIe switch "
        "or riser), about when it fell: "
    )
