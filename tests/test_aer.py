"""The PCIe path's AER: counter files, kernel records and the problem they make (pure), from
the captures in data/corpus/pcie; and the PCIe source on a sysfs tree of real counter files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuagent.config import Config
from gpuagent.logs import Event, EventLog
from gpuagent.sources.bus import pciaddr
from gpuagent.sources.kernel import aerrecord
from gpuagent.sources.pcie import aer
from gpuagent.sources.pcie.source import PcieSource
from gpuagent.views import AerHeard, AerRecord, BusView, Clear, KernelView, PciGpu, Tick
from tests import xidcorpus

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus", "pcie")
SAMPLE = "sysfs-aer_dev_{}-abi-doc-sample-root-port-1c.0"

# Every kernel capture's AER records: (port, source, kind).
RECORDS = {
    "aer-fatal-surprise-down-root-port-then-xid79-id-format": [
        ("0000:00:02.0", "0000:00:02.0", "correctable"),
        ("0000:00:02.0", "0000:00:02.0", "fatal"),
    ],
    "aer-fatal-sdes-switch-downstream-port-message-received-from-rhel9": [
        ("0000:00:1b.2", "0000:03:04.0", "correctable"),
        ("0000:00:1b.2", "0000:03:04.0", "fatal"),
    ],
    "aer-nonfatal-cmpltto-root-port-received-colon-bdf": [
        ("0000:00:00.0", "0000:00:00.0", "nonfatal"),
        ("0000:00:00.0", "0000:00:00.0", "nonfatal"),
    ],
    "aer-correctable-multiple-root-port-and-gpu-geforce-pop-os": [
        ("0000:00:03.1", "0000:00:00.0", "correctable"),
    ],
}


def sample(kind: str) -> str:
    with open(os.path.join(CORPUS, SAMPLE.format(kind) + ".txt"), encoding="ascii") as f:
        return f.read()


def test_every_kernel_capture_is_listed() -> None:
    names = sorted(
        f[:-4]
        for f in os.listdir(CORPUS)
        if f.startswith("aer-") and f.endswith(".txt") and ".source" not in f
    )
    assert names == sorted(RECORDS)


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_records_of_each_capture(name: str) -> None:
    found = [aerrecord.record(float(i), m) for i, m in enumerate(xidcorpus.messages(name, CORPUS))]
    assert [(r.port, r.source, r.kind) for r in found if r is not None] == RECORDS[name]


def test_requester_id_is_read_in_the_ports_domain() -> None:
    r = aerrecord.record(
        0.0, "pcieport 0002:80:02.0: AER: Multiple Corrected error received: id=ae00"
    )
    assert r == AerRecord(0.0, "0002:80:02.0", "0002:ae:00.0", "correctable")
    r = aerrecord.record(1.0, "pcieport 0000:00:01.0: AER: Corrected error received: id=0009")
    assert r is not None and r.source == "0000:00:01.1"


@pytest.mark.parametrize(
    "message",
    [
        "",
        "pcieport 0000:00:02.0: AER: device recovery failed",
        "pcieport 0000:00:02.0: AER: Downstream Port link has been reset (0)",
        "pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction",
        "pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=zz",
        "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
        "pcieport AER: Corrected error received: 0000:00:00.0",
    ],
)
def test_other_lines_are_no_record(message: str) -> None:
    assert aerrecord.record(0.0, message) is None


@pytest.mark.parametrize("kind", ["correctable", "fatal", "nonfatal"])
def test_counter_files_of_the_abi_sample(kind: str) -> None:
    counts = aer.counters(sample(kind))
    assert not any(name.startswith("TOTAL_ERR_") for name in counts)
    if kind == "correctable":
        assert counts["Receiver Error"] == 2 and counts["RELAY_NUM Rollover"] == 0
        assert len(counts) == 8
    else:
        assert len(counts) == 17 and set(counts.values()) == {0}
        assert "Surprise Down Error" in counts


def test_short_names_of_later_kernels() -> None:
    assert aer.counters("RxErr 0\nBadTLP 3\nTOTAL_ERR_COR 3\n") == {"RxErr": 0, "BadTLP": 3}


@pytest.mark.parametrize("text", ["SDES\n", "SDES x\n", "garbage 1 2 three\n", " \n"])
def test_a_bad_counter_line_says_which(text: str) -> None:
    with pytest.raises(ValueError, match="line 1 is not 'NAME COUNT'"):
        aer.counters(text)


@pytest.mark.parametrize(
    ("resolved", "expected"),
    [
        (
            "/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:00.0",
            ("0000:00:02.0", "0000:01:00.0", "0000:02:00.0"),
        ),
        ("/sys/devices/pci0000:00/0000:00:05.0", ("0000:00:05.0",)),
        (
            "/sys/devices/pci0004:00/0004:00:00.0/0004:01:00.0",
            ("0004:00:00.0", "0004:01:00.0"),
        ),
        ("/sys/bus/pci/devices/0000:18:00.0", ("0000:18:00.0",)),
        ("/sys/devices/platform/foo", ()),
    ],
)
def test_path_up_to_the_root_port(resolved: str, expected: tuple[str, ...]) -> None:
    assert pciaddr.path(resolved) == expected


def test_roles_on_a_path() -> None:
    assert [pciaddr.path_role(i, 3) for i in range(3)] == [
        "its root port",
        "a bridge on its path (PCIe switch or riser)",
        "the GPU itself",
    ]
    assert pciaddr.path_role(0, 1) == "the GPU itself"


def test_finding_severity_by_kind() -> None:
    none = aer.Errors({})
    assert aer.finding("0000:00:02.0", "its root port", {"fatal": none, "nonfatal": none}) is None
    warn = aer.finding(
        "0000:00:02.0", "its root port", {"nonfatal": aer.Errors({"CmpltTO": 2, "ECRC": 0})}
    )
    assert warn is not None and (warn.severity, warn.action) == ("warning", "check_host")
    assert warn.message.startswith(
        "PCIe uncorrectable errors at 0000:00:02.0, its root port: 2 non-fatal (2 CmpltTO); "
    )
    assert warn.extra == (("pcie_device", "0000:00:02.0"),) and warn.kind == "pcie_error"
    both = aer.finding(
        "0000:01:00.0",
        "a bridge",
        {"fatal": aer.Errors({}, records=1, last=5.0), "nonfatal": aer.Errors({"ECRC": 1})},
    )
    assert both is not None and both.severity == "critical"
    assert ": 1 fatal, 1 non-fatal (1 ECRC); " in both.message


def test_heard_counts_and_keeps_the_latest() -> None:
    heard = aerrecord.Heard()
    assert heard.view == AerHeard()
    line = "pcieport 0000:00:03.1: AER: Multiple Correctable error message received from {}"
    for i in range(aerrecord.RECENT + 10):
        heard.add(float(i), line.format("0000:07:00.0"))
    heard.add(9999.0, "nothing of AER")
    view = heard.view
    assert view is heard.view  # made once while nothing changes
    assert view.counts == {
        ("0000:07:00.0", "correctable"): (aerrecord.RECENT + 10, aerrecord.RECENT + 9.0)
    }
    assert len(view.recent) == aerrecord.RECENT and view.recent[0].time == 10.0


def test_heard_counts_at_most_so_many_devices() -> None:
    heard = aerrecord.Heard()
    line = "pcieport 0000:00:03.1: AER: Corrected error received: 0000:{:02x}:{:02x}.0"
    for i in range(300):
        heard.add(0.0, line.format(i // 32, i % 32))
    assert len(heard.view.counts) == 256
    heard.add(1.0, line.format(0, 0))  # one counted already goes on counting
    assert heard.view.counts[("0000:00:00.0", "correctable")] == (2, 1.0)


# The source on a tree as sysfs lays it out: each function a directory under its bridge, and
# /sys/bus/pci/devices/<slot> a link to it.
GPU, BRIDGE, ROOT = "0000:02:00.0", "0000:01:00.0", "0000:00:02.0"


def tree(root: str, chain: tuple[str, ...] = (ROOT, BRIDGE, GPU), aer_files: bool = True) -> None:
    where = os.path.join(root, "devices", "pci0000:00")
    links = os.path.join(root, "bus", "pci", "devices")
    os.makedirs(links, exist_ok=True)
    for slot in chain:
        where = os.path.join(where, slot)
        os.makedirs(where, exist_ok=True)
        link = os.path.join(links, slot)
        if not os.path.lexists(link):
            os.symlink(where, link)
        if aer_files:
            for kind in ("correctable", "fatal", "nonfatal"):
                with open(os.path.join(where, f"aer_dev_{kind}"), "w", encoding="ascii") as f:
                    f.write(sample(kind))


def bump(root: str, slot: str, kind: str, name: str, by: int = 1) -> None:
    path = os.path.join(root, "bus", "pci", "devices", slot, f"aer_dev_{kind}")
    with open(path, encoding="ascii") as f:
        lines = f.read().splitlines()
    out = []
    for line in lines:
        label, _, count = line.rpartition(" ")
        out.append(
            f"{label} {int(count) + by}" if label in (name, f"TOTAL_ERR_{kind.upper()}") else line
        )
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(out) + "\n")


class Log(EventLog):
    """Keeps each line's event and message."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[Event | None, str]] = []

    def __call__(self, level: int, event: Event | None, message: str, **fields: Any) -> None:
        self.lines.append((event, message))


def tick(root: str, slots: tuple[str, ...] = (GPU,), kernel: KernelView | None = None) -> Tick:
    bus = BusView(tuple(PciGpu(s, "0x2335", "0x030200", "nvidia") for s in slots))
    return Tick(0.0, 0.0, Config(sysfs_root=root), bus=bus, kernel=kernel or KernelView())


def found(source: PcieSource, t: Tick) -> dict[str, list[tuple[str, str, str]]]:
    out = source.step(t).findings["pcie"]
    return {
        s: [(f.severity, str(dict(f.extra)["pcie_device"]), f.message) for f in fs]
        for s, fs in out.items()
    }


def test_counters_rising_on_the_path(tmp_path: str) -> None:
    root = str(tmp_path)
    tree(root)
    source = PcieSource(root, Log())
    assert found(source, tick(root)) == {}
    bump(root, BRIDGE, "nonfatal", "Completion Timeout", 2)
    (warn,) = found(source, tick(root))[GPU]
    assert warn[:2] == ("warning", BRIDGE)
    assert (
        "a bridge on its path (PCIe switch or riser): 2 non-fatal (2 Completion Timeout)" in warn[2]
    )
    bump(root, ROOT, "fatal", "Surprise Down Error")
    # Nearest the GPU first.
    still, fatal = found(source, tick(root))[GPU]
    assert (fatal[:2], still[:2]) == (("critical", ROOT), ("warning", BRIDGE))
    assert "its root port: 1 fatal (1 Surprise Down Error)" in fatal[2]
    # It latches: nothing rises further, the problems hold.
    assert len(found(source, tick(root))[GPU]) == 2


def test_counts_there_at_the_first_read_are_no_rise(tmp_path: str) -> None:
    root = str(tmp_path)
    tree(root)
    bump(root, GPU, "fatal", "Poisoned TLP", 5)
    source = PcieSource(root, Log())
    assert found(source, tick(root)) == {}


def test_a_device_enumerated_again_counts_from_zero(tmp_path: str) -> None:
    root = str(tmp_path)
    tree(root)
    bump(root, GPU, "nonfatal", "ECRC", 3)
    source = PcieSource(root, Log())
    found(source, tick(root))
    bump(root, GPU, "nonfatal", "ECRC", -3)
    assert found(source, tick(root)) == {}
    bump(root, GPU, "nonfatal", "ECRC", 1)
    (warn,) = found(source, tick(root))[GPU]
    assert "the GPU itself: 1 non-fatal (1 ECRC)" in warn[2]


def test_kernel_records_name_the_source_not_the_port(tmp_path: str) -> None:
    root = str(tmp_path)
    tree(root)
    heard = aerrecord.Heard()
    for m in xidcorpus.messages("aer-fatal-surprise-down-root-port-then-xid79-id-format", CORPUS):
        heard.add(100.0, m)
    source = PcieSource(root, Log())
    (fatal,) = found(source, tick(root, kernel=KernelView(aer=heard.view)))[GPU]
    assert fatal[:2] == ("critical", ROOT)
    assert "its root port: 1 fatal;" in fatal[2]


def test_a_shared_port_is_read_once_and_each_gpu_has_its_problem(tmp_path: str) -> None:
    root = str(tmp_path)
    other = "0000:03:00.0"
    tree(root)
    tree(root, (ROOT, "0000:01:01.0", other))
    reads: list[str] = []

    def read(path: str) -> str | None:
        reads.append(path)
        with open(path, encoding="ascii") as f:
            return f.read()

    source = PcieSource(root, Log(), read=read)
    found(source, tick(root, (GPU, other)))
    assert len(reads) == len(set(reads)) == 2 * 5  # two files of five functions
    bump(root, ROOT, "fatal", "Surprise Down Error")
    assert {s: [f[1] for f in fs] for s, fs in found(source, tick(root, (GPU, other))).items()} == {
        GPU: [ROOT],
        other: [ROOT],
    }


def test_no_aer_files_say_nothing_and_are_not_asked_again(tmp_path: str) -> None:
    root = str(tmp_path)
    tree(root, aer_files=False)
    asked: list[str] = []

    def read(path: str) -> str | None:
        asked.append(path)
        return None

    source = PcieSource(root, Log(), read=read)
    for _ in range(3):
        assert found(source, tick(root)) == {}
    assert len(asked) == 3  # one try of each function


def test_a_gpu_in_a_flat_tree_is_its_own_path(tmp_path: str) -> None:
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "bus", "pci", "devices", GPU))
    source = PcieSource(root, Log())
    assert found(source, tick(root)) == {}


def test_a_bad_counter_file_is_one_line_naming_it(tmp_path: str) -> None:
    root = str(tmp_path)
    tree(root)
    bad = os.path.join(root, "bus", "pci", "devices", BRIDGE, "aer_dev_fatal")
    with open(bad, "w", encoding="ascii") as f:
        f.write("SDES one\n")
    log = Log()
    source = PcieSource(root, log)
    for _ in range(3):
        assert found(source, tick(root)) == {}
    assert log.lines == [
        (
            Event.SYSFS_PROBLEM,
            f"{bad}: line 1 is not 'NAME COUNT': 'SDES one'; this device's PCIe errors are "
            "not counted",
        )
    ]
    bump(root, BRIDGE, "nonfatal", "ECRC")  # the other file still counts
    assert found(source, tick(root))[GPU][0][1] == BRIDGE


def test_a_clear_starts_the_counts_afresh(tmp_path: str) -> None:
    root = str(tmp_path)
    tree(root)
    heard = aerrecord.Heard()
    heard.add(
        50.0, "pcieport 0000:00:02.0: AER: Uncorrected (Non-Fatal) error received: 0000:02:00.0"
    )
    source = PcieSource(root, Log())
    bump(root, ROOT, "fatal", "Surprise Down Error")
    found(source, tick(root))
    kernel = KernelView(aer=heard.view)
    assert [f[1] for f in found(source, tick(root, kernel=kernel))[GPU]] == [GPU]
    bump(root, ROOT, "fatal", "Surprise Down Error")
    assert len(found(source, tick(root, kernel=kernel))[GPU]) == 2
    cleared = {GPU: Clear(GPU, "pcie_error", "alice", 60.0)}
    assert found(source, tick(root, kernel=KernelView(aer=heard.view, cleared=cleared))) == {}
    heard.add(
        70.0, "pcieport 0000:00:02.0: AER: Uncorrected (Non-Fatal) error received: 0000:02:00.0"
    )
    again = found(source, tick(root, kernel=KernelView(aer=heard.view, cleared=cleared)))[GPU]
    assert [(f[0], f[1]) for f in again] == [("warning", GPU)]
    # A record logged after a clear but read with it still counts.
    source2 = PcieSource(root, Log())
    found(source2, tick(root))
    late = aerrecord.Heard()
    late.add(
        50.0, "pcieport 0000:00:02.0: AER: Uncorrected (Non-Fatal) error received: 0000:02:00.0"
    )
    late.add(
        65.0, "pcieport 0000:00:02.0: AER: Uncorrected (Non-Fatal) error received: 0000:02:00.0"
    )
    at60 = {GPU: Clear(GPU, "pcie_error", "alice", 60.0)}
    (one,) = found(source2, tick(root, kernel=KernelView(aer=late.view, cleared=at60)))[GPU]
    assert one[1] == GPU and "1 non-fatal" in one[2]
    # A clear of another kind ends nothing here.
    other = {GPU: Clear(GPU, "xid", "alice", 80.0)}
    assert found(source, tick(root, kernel=KernelView(aer=heard.view, cleared=other)))[GPU]


def test_a_reload_onto_another_root_starts_afresh(tmp_path: Path) -> None:
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    tree(first)
    tree(second)
    source = PcieSource(first, Log())
    found(source, tick(first))
    bump(first, GPU, "fatal", "ECRC")
    source.reset(Config(sysfs_root=first), Config(sysfs_root=second))
    assert found(source, tick(second)) == {}
    source.reset(Config(sysfs_root=second), Config(sysfs_root=second, interval=5.0))
    bump(second, GPU, "fatal", "ECRC")
    assert found(source, tick(second))[GPU]


# The kernel's word on its recovery (drivers/pci/pcie/err.c, pcie_do_recovery; aerdrv_core.c
# before 4.19 said "Device recovery ..."), as the port that ran it prints it.
RECOVERED = "pcieport 0000:01:00.0: AER: device recovery successful"
FAILED = "pcieport 0000:01:00.0: AER: device recovery failed"


@pytest.mark.parametrize(
    ("message", "said"),
    [
        (RECOVERED, ("0000:01:00.0", True)),
        (FAILED, ("0000:01:00.0", False)),
        ("pcieport 0000:00:1C.0: AER: Device recovery successful", ("0000:00:1c.0", True)),
        ("pcieport 0000:00:1c.0: AER: Device recovery failed\n", ("0000:00:1c.0", False)),
        # Another's words, or a line that only mentions it, are none.
        ("tmpfs: Bad value for 'size': AER: device recovery failed", None),
        ("pcieport 0000:01:00.0: AER: device recovery failed, then more", None),
        ("pcieport 0000:01:00.0: AER: can't recover (no error_detected callback)", None),
    ],
)
def test_the_kernels_word_on_a_recovery(message: str, said: tuple[str, bool] | None) -> None:
    assert aerrecord.recovery(message) == said


def test_the_recovery_decides_severity_and_action() -> None:
    """Issue 39: the kernel's own words on a PCIe error's recovery, not the error's class."""
    fatal = {"fatal": aer.Errors({}, records=1, last=5.0)}
    recovered = aer.finding(BRIDGE, "a bridge", fatal, (BRIDGE, True))
    assert recovered is not None and (recovered.severity, recovered.action) == (
        "warning",
        "check_host",
    )
    assert f"the kernel recovered the link (at {BRIDGE})" in recovered.message
    nonfatal = {"nonfatal": aer.Errors({"CmpltTO": 1}, records=1, last=5.0)}
    failed = aer.finding(BRIDGE, "a bridge", nonfatal, (BRIDGE, False))
    assert failed is not None and (failed.severity, failed.action) == ("critical", "reboot")
    assert f"the kernel's recovery failed (at {BRIDGE}): the GPU is unreachable" in failed.message


def test_a_recovery_that_failed_on_the_path_is_a_reboot(tmp_path: str) -> None:
    """The RHEL 9 capture: a switch's downstream port's fatal SDES, the link reset, and the
    kernel's "device recovery failed" from that port, above a GPU."""
    root = str(tmp_path)
    port = "0000:03:04.0"
    tree(root, ("0000:00:1b.2", port, GPU))
    heard = aerrecord.Heard()
    name = "aer-fatal-sdes-switch-downstream-port-message-received-from-rhel9"
    for n, m in enumerate(xidcorpus.messages(name, CORPUS)):
        heard.add(100.0 + n, m)
    assert heard.view.recoveries == {port: (110.0, False)}
    source = PcieSource(root, Log())
    t = tick(root, kernel=KernelView(aer=heard.view))
    (f,) = source.step(t).findings["pcie"][GPU]
    assert (f.severity, f.action, dict(f.extra)["pcie_device"]) == ("critical", "reboot", port)
    # A recovery before the errors says nothing of them.
    early = aerrecord.Heard()
    early.add(50.0, f"pcieport {port}: AER: device recovery successful")
    for m in xidcorpus.messages(name, CORPUS)[:-1]:
        early.add(100.0, m)
    (f,) = (
        PcieSource(root, Log())
        .step(tick(root, kernel=KernelView(aer=early.view)))
        .findings["pcie"][GPU]
    )
    assert (f.severity, f.action) == ("critical", "check_host")
