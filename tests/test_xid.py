"""Xid parsing, assessment and per-boot counting over the real kernel-log corpus."""

from __future__ import annotations

import pytest

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.kernel.xid import GpuUuid, InitFailure, SXid, Xid, assess, parse
from gpuagent.sources.kernel.xidcatalog import CATALOG, RECOVERY_ACTIONS, lookup
from gpuagent.sources.kernel.xidcount import XidCounter
from gpuagent.views import Finding
from tests import xidcorpus


def count(name: str, slots: list[str] | None = None) -> XidCounter:
    counter = XidCounter()
    for i, message in enumerate(xidcorpus.messages(name)):
        counter.add(1000.0 + i, message)
    return counter


def summary(counter: XidCounter, slots: list[str] | None = None) -> dict[object, object]:
    return {
        key: (c.count, c.info.severity, c.info.action)
        for key, c in counter.counts(slots or []).items()
    }


def test_the_corpus_is_all_listed() -> None:
    assert xidcorpus.names() == sorted(xidcorpus.XIDS)


@pytest.mark.parametrize("name", xidcorpus.names())
def test_every_corpus_file_counts_as_expected(name: str) -> None:
    counter = count(name)
    assert summary(counter) == xidcorpus.XIDS[name]
    details = {slot: c.detail for slot, c in counter.init_failures([]).items()}
    assert details == xidcorpus.INIT.get(name, {})
    sxids = {k: (c.count, c.fatal) for k, c in counter.sxid_counts().items()}
    assert sxids == xidcorpus.SXIDS.get(name, {})
    assert counter.unattributed == xidcorpus.UNATTRIBUTED.get(name, {})


@pytest.mark.parametrize("name", [n for n in xidcorpus.names() if n.startswith("not-xid")])
def test_not_xid_files_give_no_event(name: str) -> None:
    assert [parse(m) for m in xidcorpus.messages(name)] == [[]] * len(xidcorpus.messages(name))


def test_mentions_of_an_xid_are_not_xids() -> None:
    # "caused by previous Xid 149" and "critical error 79" sit inside other lines.
    (xid,) = parse(xidcorpus.messages("xid-45-driver590-caused-by-previous-kernel-prefix")[0])
    assert isinstance(xid, Xid)
    assert (xid.code, xid.device) == (45, "0000:dc:00")
    assert xid.text == "pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"
    rc = "NVRM: kgspRcAndNotifyAllChannels_IMPL: RC all channels for critical error 79."
    assert parse(rc) == []
    assert parse("foo: NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.") == []
    assert parse("user said Xid 149 and SXid 22013") == []


def test_the_probe_time_record_is_one_xid_79() -> None:
    records = xidcorpus.messages("xid-79-driver570-open-multiline-no-xid")
    assert "\n" in records[0]
    assert parse(records[0]) == [Xid("0000:b3:00", 79, "GPU has fallen off the bus", "probe", 0)]
    assert [parse(m) for m in records[1:]] == [[], []]


def test_a_fall_off_the_bus_counts_once_however_told() -> None:
    counter = count("xid-79-driver535-pid-unknown-crashdump")
    (c,) = counter.counts([]).values()
    assert (c.code, c.count) == (79, 1)
    # The probe-time record, its companion and the Xid line of one fall-off.
    counter = XidCounter()
    counter.add(1.0, "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.")
    counter.add(1.0, "NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.")
    counter.add(2.0, xidcorpus.messages("xid-79-driver570-open-multiline-no-xid")[0])
    counter.add(
        2.0,
        "NVRM: The NVIDIA GPU 0000:06:00.0 (PCI ID: 10de:2b85) installed in "
        "this system has fallen off the bus and is not responding to commands.",
    )
    assert {k: c.count for k, c in counter.counts([]).items()} == {
        ("0000:06:00.0", 79): 1,
        ("0000:b3:00.0", 79): 1,
    }


def test_identical_records_each_count() -> None:
    # Bumblebee's two byte-identical Xid 32 lines are two kernel records.
    assert count("xid-32-31-bumblebee-2015-no-pid").counts([])["0000:01:00.0", 32].count == 2


def test_one_record_counts_once_per_gpu_and_code() -> None:
    counter = XidCounter()
    counter.add(1.0, "NVRM: Xid (PCI:0000:01:00): 13, a\nNVRM: Xid (PCI:0000:01:00): 13, b")
    assert counter.counts([])["0000:01:00.0", 13].count == 1


@pytest.mark.parametrize(
    ("line", "device", "gi", "ci"),
    [
        # The three formats of krcReportXid (open-gpu-kernel-modules kernel_rc.c).
        ("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, m", "0000:3b:00", None, None),
        ("NVRM: Xid (PCI:0000:3b:00 GPU-I:01): 13, pid=1, name=x, m", "0000:3b:00", 1, None),
        ("NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:03): 13, pid=1, m", "0000:3b:00", 2, 3),
        # NVIDIA's old documentation example: no "PCI:".
        ("NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00", None, None),
        # Domains printed with more digits (VMD, nvidia-smi style) and in upper case.
        ("NVRM: Xid (PCI:10000:E1:00): 48, DBE", "10000:e1:00", None, None),
        ("NVRM: Xid (PCI:00000000:3B:00): 31, fault", "0000:3b:00", None, None),
        ("NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal", None, None, None),
        ("  NVRM: Xid (PCI:0000:3b:00): 62", "0000:3b:00", None, None),
    ],
)
def test_xid_line_variants(line: str, device: str | None, gi: int | None, ci: int | None) -> None:
    (xid,) = parse(line)
    assert isinstance(xid, Xid)
    assert (xid.device, xid.gpu_instance, xid.compute_instance) == (device, gi, ci)


def test_sxid_names_the_nvswitch_with_its_function() -> None:
    events = [e for m in xidcorpus.messages("sxid-22013-driver570-open-nvswitch") for e in parse(m)]
    assert [type(e) for e in events] == [SXid] * 3
    assert {(e.slot, e.switch, e.code) for e in events if isinstance(e, SXid)} == {
        ("0000:04:00.0", 3, 22013)
    }
    assert [e.fatal for e in events if isinstance(e, SXid)] == [None, False, None]
    (fatal,) = parse("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Fatal, Link 4")
    assert isinstance(fatal, SXid)
    assert fatal.fatal is True


def test_init_failure_and_uuid_lines() -> None:
    assert parse("NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)") == [
        InitFailure("0000:98:00.0", "0x62:0x65:1792")
    ]
    assert parse("NVRM: GPU 0000:98:00.0: rm_init_adapter failed, device minor number 0") == []
    uuid = "NVRM: GPU at PCI:0000:9b:00: GPU-11111111-2222-3333-4444-555555555555"
    upper = "NVRM: GPU at PCI:0000:9b:00: GPU-AAAAAAAA-2222-3333-4444-555555555555"
    assert parse(upper) == [GpuUuid("0000:9b:00", "GPU-aaaaaaaa-2222-3333-4444-555555555555")]
    assert parse(uuid) == [GpuUuid("0000:9b:00", "GPU-11111111-2222-3333-4444-555555555555")]
    counter = count("xid-43-31-94-driver535-ctime")
    assert counter.uuids([]) == {
        "0000:00:05.0": "GPU-11111111-2222-3333-4444-555555555555",
        "0000:00:07.0": "GPU-66666666-7777-8888-9999-000000000000",
        "0000:00:08.0": "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
    }


CONTAINED = "Contained: SM (0x1). RST: No, D-RST: No"


def xid(code: int, text: str) -> Xid:
    return Xid("0000:01:00", code, text)


@pytest.mark.parametrize(
    ("code", "text", "severity", "action"),
    [
        (94, "Contained: SM (0x1). RST: No, D-RST: No", "none", "restart_app"),
        # The format in the driver source's comment (no real posted line was found).
        (
            95,
            "pid=7062, Uncontained: LTC TAG (0x2,0x1). RST: Yes, D-RST: No",
            CRITICAL,
            "reset_gpu",
        ),
        (94, "Contained: SM (0x1). RST: Yes, D-RST: No", CRITICAL, "reset_gpu"),
        (94, "Contained: SM (0x1). RST: No, D-RST: Yes", CRITICAL, "drain_and_reset"),
        (95, "Contained: SM (0x1). RST: No, D-RST: No", "none", "restart_app"),
        (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)", WARNING, "restart_app"),
        # The severity words are the driver's, never a command name a job chose (issue 39).
        (94, f"pid=4242, name=Uncontained, {CONTAINED}", "none", "restart_app"),
        (94, f"pid=4242, name=a, Uncontained:, {CONTAINED}", "none", "restart_app"),
        (94, f"pid=4242, name=RST: Yes, {CONTAINED}", "none", "restart_app"),
        (95, f"pid='<unknown>', name=<unknown>, Un{CONTAINED[2:]}", CRITICAL, "reset_gpu"),
        (145, "pid=4242, name=Nonfatal, RLW_RXPIPE Fatal XC0 i0 Link 11", CRITICAL, "reset_gpu"),
        (145, "pid=4242, name=x, Fatal, RLW_RXPIPE Nonfatal XC0", WARNING, "restart_app"),
        (144, "pid=4242, name=Fatal, SAW_MVB event", WARNING, "reset_gpu"),
        (149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 3", WARNING, "none"),
        (144, "SAW_MVB Fatal XC0 i0 Link 2 (0x1)", CRITICAL, "reset_gpu"),
        (147, "TREX event", WARNING, "none"),
        (150, "MSE watchdog timeout", CRITICAL, "reset_gpu"),
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            CRITICAL,
            "reset_gpu",
        ),
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            CRITICAL,
            "reboot",
        ),
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)",
            CRITICAL,
            "drain_p2p",
        ),
        (
            154,
            "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x4 (Drain and Reset)",
            CRITICAL,
            "drain_and_reset",
        ),
        (
            154,
            "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
            "none",
            "none",
        ),
        (154, "GPU recovery action changed to something new", CRITICAL, "reset_gpu"),
        (154, "GPU recovery action changed from 0x0 (None) to 0x9 (Future)", CRITICAL, "reset_gpu"),
        (79, "GPU has fallen off the bus.", CRITICAL, "reboot"),
        (64, "Row Remapper: failure", CRITICAL, "drain_and_rma"),
        (999, "something new", WARNING, "none"),
    ],
)
def test_assess_reads_severity_and_action_from_the_line(
    code: int, text: str, severity: str, action: str
) -> None:
    info = assess(xid(code, text))
    assert (info.severity, info.action) == (severity, action)


def test_catalog_is_consistent() -> None:
    for code, info in CATALOG.items():
        Finding("xid", WARNING, info.action, "checks the action")
        assert info.severity in ("none", WARNING, CRITICAL), code
        assert info.name and info.advice and "\n" not in info.advice
    for code in (13, 31, 43, 45, 68):
        assert CATALOG[code].severity == "none", code
    for action in RECOVERY_ACTIONS.values():
        Finding("xid", WARNING, action, "checks the action")
    unknown = lookup(4242)
    assert unknown.severity == WARNING
    assert "4242" in unknown.advice


def test_findings_only_for_codes_that_make_a_gpu_unhealthy() -> None:
    counter = count("xid-48-63-94-driver550-dbe-rowremap")
    assert counter.findings(["0000:52:00.0"]) == {
        "0000:52:00.0": [
            Finding(
                "xid",
                CRITICAL,
                "reset_gpu",
                "Xid 48 (Double-bit ECC error): uncorrectable memory error; the GPU needs a "
                "reset (nvidia-smi -r -i 0000:52:00.0, or reboot the host)",
                (("xid", 48),),
            ),
            Finding(
                "xid",
                WARNING,
                "none",
                "Xid 63 (Row remapping pending): a bad memory row was recorded; the repair "
                "takes effect at the next GPU reset",
                (("xid", 63),),
            ),
        ]
    }
    assert count("xid-13-31-32-driver418-no-pid").findings([]) == {}
    unknown = XidCounter()
    unknown.add(1.0, "NVRM: Xid (PCI:0000:01:00): 4242, something new")
    (finding,) = unknown.findings([])["0000:01:00.0"]
    assert (finding.severity, finding.extra) == (WARNING, (("xid", 4242),))
    assert "4242" in finding.message


def test_init_failure_is_a_critical_problem() -> None:
    counter = count("rminitadapter-failed-gsp-driver550")
    (finding,) = counter.findings([])["0000:98:00.0"]
    assert (finding.kind, finding.severity, finding.action) == ("init_failed", CRITICAL, "reboot")
    assert "0x62:0x65:1792" in finding.message


def test_slots_come_from_the_scanned_bus() -> None:
    counter = XidCounter()
    counter.add(1.0, "NVRM: Xid (PCI:0000:3b:00): 48, DBE")
    counter.add(2.0, "NVRM: Xid (PCI:0000:5e:00): 48, DBE")
    scanned = ["0000:3b:00.1", "0000:86:00.0"]
    assert set(counter.counts(scanned)) == {("0000:3b:00.1", 48), ("0000:5e:00.0", 48)}
    # A GPU gone from the bus keeps the function a record named.
    counter.add(3.0, "NVRM: GPU 0000:af:00.2: RmInitAdapter failed! (0x1:0x2:3)")
    counter.add(4.0, "NVRM: Xid (PCI:0000:af:00): 79, GPU has fallen off the bus.")
    assert ("0000:af:00.2", 79) in counter.counts([])


def test_the_answers_are_worked_out_once_until_a_record_comes() -> None:
    counter = XidCounter()
    counter.add(1.0, "NVRM: Xid (PCI:0000:3b:00): 48, DBE")
    scanned = ["0000:3b:00.0", "0000:5e:00.0"]
    counts, uuids = counter.counts(scanned), counter.uuids(scanned)
    # Asked again the same tick (the view, the known GPUs, the earlier boots): the same answer.
    assert counter.counts(list(scanned)) is counts
    assert (counter.uuids(scanned), counter.init_failures(scanned)) == ({}, {})
    assert counter.uuids(scanned) is uuids
    counter.add(2.0, "NVRM: GPU at PCI:0000:5e:00: GPU-11111111-2222-3333-4444-555555555555")
    assert counter.uuids(scanned) == {"0000:5e:00.0": "GPU-11111111-2222-3333-4444-555555555555"}
    counter.add(3.0, "NVRM: Xid (PCI:0000:3b:00): 48, DBE")
    assert counter.counts(scanned)["0000:3b:00.0", 48].count == 2
    assert set(counter.counts(["0000:3b:00.1"])) == {("0000:3b:00.1", 48)}  # other slots
    # A reload's [xid] table: tests/test_kernel.py::test_the_sites_xid_table_has_the_last_word.


def test_worst_severity_stays_but_154_follows_the_driver() -> None:
    counter = XidCounter()
    counter.add(1.0, "NVRM: Xid (PCI:0000:01:00): 145, RLW Nonfatal XC0")
    assert counter.findings([])["0000:01:00.0"][0].severity == WARNING
    counter.add(2.0, "NVRM: Xid (PCI:0000:01:00): 145, RLW Fatal XC0")
    counter.add(3.0, "NVRM: Xid (PCI:0000:01:00): 145, RLW Nonfatal XC0")
    c = counter.counts([])["0000:01:00.0", 145]
    assert (c.count, c.first, c.last, c.info.severity) == (3, 1.0, 3.0, CRITICAL)
    counter.add(
        4.0,
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 "
        "(None) to 0x2 (Node Reboot Required)",
    )
    assert counter.findings([])["0000:01:00.0"][1].action == "reboot"
    counter.add(
        5.0,
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x2 "
        "(Node Reboot Required) to 0x0 (None)",
    )
    assert [f.extra for f in counter.findings([])["0000:01:00.0"]] == [(("xid", 145),)]


def test_take_new_reports_each_pair_once() -> None:
    counter = count("xid-13-109-driver5xx-dmesg-ctime")
    first = counter.take_new(["0000:cb:00.0"])
    assert [(f.slot, f.kind, f.code) for f in first] == [
        ("0000:cb:00.0", "xid", 13),
        ("0000:cb:00.0", "xid", 109),
    ]
    assert first[0].finding is None
    assert first[1].finding == counter.findings([])["0000:cb:00.0"][0]
    assert first[1].message == (
        "Xid 109 on GPU 0000:cb:00.0: Context switch timeout; the GPU failed to switch "
        "contexts; the GPU needs a reset (nvidia-smi -r -i 0000:cb:00.0, or reboot the host) "
        "(action: reset_gpu)"
    )
    assert first[1].time == 1004.0
    assert counter.take_new([]) == []
    counter.add(9.0, "NVRM: Xid (PCI:0000:cb:00): 13, again")
    assert counter.take_new([]) == []
    for message in xidcorpus.messages("sxid-22013-driver570-open-nvswitch"):
        counter.add(10.0, message)
    counter.add(11.0, "NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)")
    sxid, init = counter.take_new([])
    assert (sxid.slot, sxid.kind, sxid.code, sxid.finding) == ("0000:04:00.0", "sxid", 22013, None)
    assert (init.slot, init.kind, init.finding is not None) == ("0000:98:00.0", "init_failed", True)


def test_odd_messages_do_not_raise() -> None:
    counter = XidCounter()
    for message in [
        "",
        "NVRM",
        "NVRM: Xid (",
        "NVRM: Xid (PCI:0000:01:00): ",
        "\x00NVRM\ufffd",
        "NVRM: Xid (PCI:0000:01:00): 9999999, x",
        "nvidia-nvswitch1: SXid (): 1, x",
    ]:
        counter.add(1.0, message)
    assert counter.counts([]) == {}
    assert counter.sxid_counts() == {("nvswitch1", 1): counter.sxid_counts()["nvswitch1", 1]}
