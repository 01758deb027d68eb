"""Health rules: every kind from the values nvidia-smi and sysfs give, on a real capture's row."""

from __future__ import annotations

import pytest

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.probe import rules
from gpuagent.sources.probe.smi import FIELDS, parse
from gpuagent.views import Finding, PciGpu, Row
from tests import replay
from tests.fakehost import H200_LOAD


def h200(**values: object) -> Row:
    """The captured H200 row (healthy) with ``values`` put in, as nvidia-smi would print them."""
    stdout, _ = replay.answer(replay.load(H200_LOAD), list(FIELDS), "csv,noheader,nounits")
    (row,) = parse(stdout, FIELDS)
    row.update({k.replace("__", "."): v for k, v in values.items()})  # type: ignore[misc]
    return row


def kinds(row: Row, reset: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    return [(f.kind, f.severity, f.action) for f in rules.row_findings(row, reset)]


def test_the_captured_rows_are_healthy() -> None:
    for name in (
        H200_LOAD,
        "h200-linux-driver590.48.01-idle-query-gpu-all-fields.csv",
        "h100-80gb-hbm3-mig-linux-driver590.48.01-load-query-gpu-all-fields.csv",
        "l40s-linux-driver595.80-idle-query-gpu-all-fields.csv",
        "rtx2080super-linux-driver595.71.05-idle-query-gpu-all-fields.csv",
    ):
        cap = replay.load(name)
        fields = tuple(f for f in FIELDS if replay.canonical(f) in cap.fields)
        stdout, _ = replay.answer(cap, list(fields), "csv,noheader,nounits")
        for row in parse(stdout, fields):
            assert rules.row_findings(row) == [], name


ROWS = [
    ("requires reset", h200(), ("pstate",), ("requires_reset", CRITICAL, "reset_gpu")),
    (
        "recovery Reset",
        h200(gpu_recovery_action="Reset"),
        (),
        ("recovery_action", CRITICAL, "reset_gpu"),
    ),
    (
        "recovery Reboot",
        h200(gpu_recovery_action="Reboot"),
        (),
        ("recovery_action", CRITICAL, "reboot"),
    ),
    (
        "recovery Drain P2P",
        h200(gpu_recovery_action="Drain P2P"),
        (),
        ("recovery_action", WARNING, "drain_p2p"),
    ),
    (
        "recovery Drain and Reset",
        h200(gpu_recovery_action="Drain and Reset"),
        (),
        ("recovery_action", CRITICAL, "drain_and_reset"),
    ),
    (
        "remap pending",
        h200(remapped_rows__pending="Yes"),
        (),
        ("row_remap_pending", WARNING, "reset_gpu"),
    ),
    (
        "remap failed",
        h200(remapped_rows__failure="Yes"),
        (),
        ("row_remap_failed", CRITICAL, "drain_and_rma"),
    ),
    (
        "retired pending",
        h200(retired_pages__pending="Yes"),
        (),
        ("retired_pages_pending", WARNING, "reset_gpu"),
    ),
    (
        "inforom",
        h200(inforom__checksum_validation="invalid"),
        (),
        ("inforom", WARNING, "drain_and_rma"),
    ),
    (
        "hw slowdown",
        h200(clocks_event_reasons__active="0x0000000000000008"),
        (),
        ("throttled", WARNING, "check_host"),
    ),
    (
        "hw thermal",
        h200(clocks_event_reasons__active="0x0000000000000040"),
        (),
        ("throttled", WARNING, "check_host"),
    ),
    (
        "power brake",
        h200(clocks_event_reasons__active="0x0000000000000080"),
        (),
        ("throttled", WARNING, "check_host"),
    ),
    (
        "link x8",
        h200(pcie__link__width__current=8),
        (),
        ("pcie_link_degraded", WARNING, "check_host"),
    ),
    (
        "fabric in progress",
        h200(fabric__state="In Progress"),
        (),
        ("fabric", CRITICAL, "check_host"),
    ),
    (
        "fabric failed",
        h200(fabric__status="Insufficient Resources"),
        (),
        ("fabric", CRITICAL, "check_host"),
    ),
    (
        "ecc",
        h200(ecc__errors__uncorrected__volatile__total=3),
        (),
        ("ecc_uncorrected", WARNING, "reset_gpu"),
    ),
]


@pytest.mark.parametrize(("name", "row", "reset", "want"), ROWS, ids=[r[0] for r in ROWS])
def test_row_rule(name: str, row: Row, reset: tuple[str, ...], want: tuple[str, str, str]) -> None:
    assert kinds(row, reset) == [want]


@pytest.mark.parametrize(
    "active",
    [
        "0x0000000000000001",
        "0x0000000000000002",
        "0x0000000000000004",
        "0x0000000000000110",
        # Bits NVML does not document (a newer driver's): nothing known, nothing judged.
        "0x0000000000000200",
        "junk",
    ],
)
def test_driver_clock_reasons_are_not_problems(active: str) -> None:
    assert kinds(h200(clocks_event_reasons__active=active)) == []


@pytest.mark.parametrize(
    ("bit", "name", "cause"),
    [
        (0x1, None, None),
        (0x2, None, None),
        (0x4, None, None),
        (0x8, "hardware slowdown", f"{rules.COOLING}; {rules.POWER}"),
        (0x10, None, None),
        (0x20, "software thermal slowdown", "a cooling problem"),
        (0x40, "hardware thermal slowdown", "a cooling problem"),
        (0x80, "hardware power brake", "a power delivery problem"),
        (0x100, None, None),
    ],
)
def test_every_clocks_event_reason_bit_by_what_it_means(
    bit: int, name: str | None, cause: str | None
) -> None:
    """NVML's documented bits: a cooling problem, a power delivery problem, or normal
    operation (issue 39)."""
    assert (bit in rules.THROTTLE_BITS) != (bit in rules.NORMAL_BITS)
    row = h200(clocks_event_reasons__active=f"0x{bit:016x}")
    found = rules.row_findings(row)
    if name is None:
        assert found == []
        return
    (f,) = found
    assert (f.kind, f.severity, f.action) == ("throttled", WARNING, "check_host")
    assert f.message.startswith(f"clocks held down: {name}; {cause}")


def test_old_drivers_throttle_field_counts_too() -> None:
    row = h200(clocks_event_reasons__active=None, clocks_throttle_reasons__active="0x48")
    (f,) = rules.row_findings(row)
    assert f.message == (
        f"clocks held down: hardware slowdown, hardware thermal slowdown; {rules.COOLING}; "
        f"{rules.POWER}"
    )


def test_missing_values_are_never_problems() -> None:
    row: Row = dict.fromkeys(FIELDS)
    assert rules.row_findings(row) == []


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("Unknown Error", "reboot"),
        ("GPU is lost.  Reboot the system to recover this GPU", "reboot"),
        ("GPU requires reset", "reset_gpu"),
    ],
)
def test_error_line_is_lost(text: str, action: str) -> None:
    f = rules.error_finding(text)
    assert (f.kind, f.severity, f.action) == ("lost", CRITICAL, action)
    assert text in f.message


def test_bus_rules() -> None:
    on_bus = [
        PciGpu("0000:18:00.0", "0x2335", "0x030200", "nvidia"),
        PciGpu("0000:2a:00.0", "0x2335", "0x030200", None),
        PciGpu("0000:3a:00.0", "0x2335", "0x030200", "vfio-pci"),
    ]
    seen = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]
    got = rules.bus_findings(on_bus, seen, module_loaded=True)
    assert {s: [f.kind for f in fs] for s, fs in got.items()} == {
        "0000:5d:00.0": ["gone_from_bus"],
        "0000:2a:00.0": ["no_driver"],
    }
    (back,) = rules.bus_findings(on_bus, seen, module_loaded=True, not_back=["0000:5d:00.0"])[
        "0000:5d:00.0"
    ]
    assert back.message == "the GPU did not come back on the PCI bus after the reboot"
    # Without the module an unbound GPU is the driver gate's business, not a GPU problem.
    assert "0000:2a:00.0" not in rules.bus_findings(on_bus, seen, module_loaded=False)


def test_gpu_count() -> None:
    assert rules.count_findings(7, None) == []
    assert rules.count_findings(8, 8) == []
    (f,) = rules.count_findings(7, 8)
    assert (f.kind, f.severity, f.action) == ("gpu_count", CRITICAL, "check_host")
    assert f.message == "7 NVIDIA GPUs on the PCI bus where expected_gpus is 8"
    (f,) = rules.count_findings(6, 8, ["0000:db:00.0", "0000:18:00.0"])
    assert f.message == (
        "6 NVIDIA GPUs on the PCI bus where expected_gpus is 8; missing: 0000:18:00.0, 0000:db:00.0"
    )


def test_every_kind_has_an_event() -> None:
    from gpuagent.logs import Event  # noqa: PLC0415

    for kind in rules.KINDS:
        if kind == "missing":  # the event it had before it was a problem
            assert Event.GPU_MISSING
            continue
        assert Event.problem(kind).name == f"PROBLEM_{kind.upper()}"


def capture_rows(name: str) -> list[Row]:
    cap = replay.load(name)
    fields = tuple(f for f in FIELDS if replay.canonical(f) in cap.fields)
    stdout, _ = replay.answer(cap, list(fields), "csv,noheader,nounits")
    return parse(stdout, fields)


def test_three_v100s_held_by_nouveau_are_wrong_driver() -> None:
    # mattshma/bigdata#133: "NVRM: The NVIDIA probe routine was not called for 3 device(s)."
    # and lspci's three "3D controller: NVIDIA Corporation Device 1db6" (Tesla V100 32GB) at
    # 0000:5a:00.0, 0000:5e:00.0 and 0000:62:00.0, the nvidia module not loaded.
    slots = ["0000:5a:00.0", "0000:5e:00.0", "0000:62:00.0"]
    on_bus = [PciGpu(s, "0x1db6", "0x030200", "nouveau") for s in slots]
    got = rules.wrong_driver_findings(on_bus)
    assert sorted(got) == slots
    for (f,) in got.values():
        assert (f.kind, f.severity, f.action) == ("wrong_driver", CRITICAL, "check_host")
        assert f.message.startswith("bound to nouveau, not nvidia: blacklist nouveau")
    assert not any(rules.deliberate(g) for g in on_bus)
    from gpuagent.logs import Event  # noqa: PLC0415

    assert Event.problem("wrong_driver").name == "PROBLEM_WRONG_DRIVER"


@pytest.mark.parametrize(
    ("driver", "wrong", "deliberate"),
    [
        ("nouveau", True, False),
        ("nvidiafb", True, False),
        ("rivafb", True, False),
        ("rivatv", True, False),
        ("vfio-pci", False, True),
        ("pci-stub", False, True),
        ("nvidia", False, False),
        (None, False, False),
    ],
)
def test_which_drivers_are_wrong(driver: str | None, wrong: bool, deliberate: bool) -> None:
    gpu = PciGpu("0000:3b:00.0", "0x2335", "0x030200", driver)
    assert bool(rules.wrong_driver_findings([gpu])) == wrong
    assert rules.deliberate(gpu) == deliberate


def test_mig_mode_pending_is_a_warning_until_a_reset() -> None:
    # NVIDIA/gpu-operator#1845 (A100, driver 580.65.06): "Warning: MIG mode is in pending
    # enable state for GPU 00000001:00:00.0:In use by another client" - enabled, not yet on.
    (f,) = rules.row_findings(h200(mig__mode__current="Disabled", mig__mode__pending="Enabled"))
    assert (f.kind, f.severity, f.action) == ("mig_pending", WARNING, "reset_gpu")
    assert f.message == "MIG mode is Disabled, Enabled only after a GPU reset (mig.mode.pending)"
    assert (
        rules.row_findings(h200(mig__mode__current="Enabled", mig__mode__pending="Enabled")) == []
    )
    assert rules.row_findings(h200(mig__mode__current=None, mig__mode__pending="Enabled")) == []
    for name in (
        "h200-mig-linux-driver590.48.01-load-query-gpu-all-fields.csv",
        "h100-80gb-hbm3-mig-linux-driver590.48.01-idle-query-gpu-all-fields.csv",
    ):
        (row,) = capture_rows(name)
        assert (row["mig.mode.current"], row["mig.mode.pending"]) == ("Enabled", "Enabled")
        assert rules.row_findings(row) == []


def test_a_gen1_link_under_load_is_degraded() -> None:
    # janhq/jan#183 (an RTX 4090 on a riser): "LnkCap: Port #0, Speed 16GT/s, Width x16" and
    # "LnkSta: Speed 2.5GT/s (downgraded), Width x16 (ok)" - Gen1 of Gen4 at full width.
    row = h200(
        pcie__link__gen__current=1,
        pcie__link__gen__max=4,
        pcie__link__width__current=16,
        pcie__link__width__max=16,
        utilization__gpu=100,
    )
    (f,) = rules.row_findings(row)
    assert (f.kind, f.severity, f.action) == ("pcie_link_degraded", WARNING, "check_host")
    assert f.message == "PCIe link at Gen1 of Gen4 while the GPU is busy"
    assert rules.row_findings({**row, "utilization.gpu": rules.BUSY_UTILIZATION - 1}) == []
    assert rules.row_findings({**row, "utilization.gpu": None}) == []
    assert rules.row_findings({**row, "pcie.link.gen.max": None}) == []
    narrow = {**row, "pcie.link.width.current": 8}
    (both,) = rules.row_findings(narrow)
    assert both.message == "PCIe link at x8 of x16 and Gen1 of Gen4 while the GPU is busy"
    fallback = {**row, "pcie.link.gen.current": None, "pcie.link.gen.gpucurrent": 2}
    assert rules.row_findings(fallback)[0].message.startswith("PCIe link at Gen2 of Gen4")


@pytest.mark.parametrize(
    ("name", "gen", "gen_max"),
    [
        # Idle at P8, 0 %: the link downshifts to save power - not a problem.
        ("rtx2080super-linux-driver595.71.05-idle-query-gpu-all-fields.csv", 1, 3),
        ("rtx4080super-linux-driver595.71.05-idle-query-gpu-all-fields.csv", 1, 4),
        ("rtx2080super-linux-driver465.27-query-gpu-115fields.csv", 1, 3),
        # Under load the same boards run at their highest generation.
        ("rtx2080super-linux-driver595.71.05-load-query-gpu-all-fields.csv", 3, 3),
        ("rtx4080super-linux-driver595.71.05-load-query-gpu-all-fields.csv", 4, 4),
        ("l40s-linux-driver595.80-idle-query-gpu-all-fields.csv", 4, 4),
    ],
)
def test_the_captured_links_are_not_degraded(name: str, gen: int, gen_max: int) -> None:
    (row,) = capture_rows(name)
    assert (row["pcie.link.gen.current"], row["pcie.link.gen.max"]) == (gen, gen_max)
    assert [f for f in rules.row_findings(row) if f.kind == "pcie_link_degraded"] == []


def test_the_throttle_rule_can_be_left_to_the_window() -> None:
    row = h200(clocks_event_reasons__active="0x0000000000000008")
    assert kinds(row) == [("throttled", WARNING, "check_host")]
    assert rules.row_findings(row, throttle=False) == []
    assert rules.throttle_reasons(row) == ["hardware slowdown"]
    slot = "0000:18:00.0"
    one = rules.smi_findings({slot: row}, {}, {}, [])
    assert [f.kind for f in one[slot]] == ["throttled"]
    window = rules.smi_findings({slot: row}, {}, {}, [], throttled={})
    assert window == {slot: []}
    verdict = Finding("throttled", WARNING, "check_host", "clocks held down in 7 of 60")
    got = rules.smi_findings({slot: h200()}, {}, {}, [], throttled={slot: [verdict]})
    assert got == {slot: [verdict]}
