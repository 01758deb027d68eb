"""Health rules: every kind from the values nvidia-smi and sysfs give, on a real capture's row."""

from __future__ import annotations

import pytest

from gpuagent import rules
from gpuagent.health import CRITICAL, WARNING
from gpuagent.pci import PciGpu
from gpuagent.smi import FIELDS, Row, parse
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
        "0x0000000000000020",
        "0x0000000000000110",
        "junk",
    ],
)
def test_driver_clock_reasons_are_not_problems(active: str) -> None:
    assert kinds(h200(clocks_event_reasons__active=active)) == []


def test_old_drivers_throttle_field_counts_too() -> None:
    row = h200(clocks_event_reasons__active=None, clocks_throttle_reasons__active="0x48")
    (f,) = rules.row_findings(row)
    assert f.message == "clocks held down: hardware slowdown, hardware thermal slowdown"


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
    # Without the module an unbound GPU is the driver gate's business, not a GPU problem.
    assert "0000:2a:00.0" not in rules.bus_findings(on_bus, seen, module_loaded=False)


def test_gpu_count() -> None:
    assert rules.count_findings(7, None) == []
    assert rules.count_findings(8, 8) == []
    (f,) = rules.count_findings(7, 8)
    assert (f.kind, f.severity, f.action) == ("gpu_count", CRITICAL, "check_host")


def test_every_kind_has_an_event() -> None:
    from gpuagent.logs import Event  # noqa: PLC0415

    for kind in rules.KINDS:
        assert Event.problem(kind).name == f"PROBLEM_{kind.upper()}"
