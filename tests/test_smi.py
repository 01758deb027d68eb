"""nvidia-smi parsing and failure classification against the real captures."""

from __future__ import annotations

import os

import pytest

from gpuagent.sources.bus.pciaddr import sysfs_slot
from gpuagent.sources.probe import smi
from gpuagent.sources.probe.smi import (
    FIELDS,
    ParseError,
    classify,
    invalid_field,
    parse,
    parse_output,
)
from gpuagent.views import Failure
from tests import replay
from tests.replay import CORPUS

QUERY_CAPTURES = sorted(
    n
    for n in os.listdir(os.path.join(CORPUS, "csv"))
    if n.endswith(".csv")
    and "compute-apps" not in n
    and "retired-pages" not in n
    # Its field list was never published: no query can be projected onto it.
    and "FIELDS-UNKNOWN" not in n
)
MISSING_TEXTS = {
    "",
    "N/A",
    "[N/A]",
    "[Not Supported]",
    "[Unknown Error]",
    "[Requested functionality has been deprecated]",
    "[Function Not Found]",
}


def test_the_query_covers_the_required_fields() -> None:
    required = {
        "index",
        "uuid",
        "name",
        "pci.bus_id",
        "driver_version",
        "pstate",
        "temperature.gpu",
        "utilization.gpu",
        "utilization.memory",
        "memory.total",
        "memory.used",
        "power.draw",
        "power.limit",
        "clocks.sm",
        "clocks.mem",
        "fan.speed",
        "ecc.errors.uncorrected.volatile.total",
        "mig.mode.current",
        "clocks_event_reasons.active",
    }
    assert required <= set(FIELDS)
    assert smi.command("nvidia-smi", FIELDS) == [
        "nvidia-smi",
        "--query-gpu=" + ",".join(FIELDS),
        "--format=csv,noheader,nounits",
    ]


def test_only_other_queries_and_the_unknown_field_list_are_left_out() -> None:
    every = [n for n in os.listdir(os.path.join(CORPUS, "csv")) if n.endswith(".csv")]
    left_out = sorted(set(every) - set(QUERY_CAPTURES))
    assert all(
        "compute-apps" in n or "retired-pages" in n or "FIELDS-UNKNOWN" in n for n in left_out
    )
    assert len(QUERY_CAPTURES) == 30


@pytest.mark.parametrize("name", QUERY_CAPTURES)
def test_every_capture_parses_with_the_expected_nulls(name: str) -> None:
    cap = replay.load(name)
    fields = tuple(f for f in FIELDS if replay.canonical(f) in cap.fields)
    stdout, code = replay.answer(cap, list(fields), "csv,noheader,nounits")
    assert code == 0
    rows = parse(stdout, fields)
    assert len(rows) == len(cap.rows)
    for row, raw in zip(rows, cap.rows, strict=True):
        for field in fields:
            cell = replay.nounits(raw[cap.fields.index(replay.canonical(field))])
            value = row[field]
            if cell in MISSING_TEXTS:
                assert value is None, (field, cell)
            elif isinstance(value, str):
                assert value == cell
            else:
                assert value == float(cell), (field, cell)


def test_h200_load_values() -> None:
    cap = replay.load("h200-linux-driver590.48.01-load-query-gpu-all-fields.csv")
    stdout, _ = replay.answer(cap, list(FIELDS), "csv,noheader,nounits")
    (row,) = parse(stdout, FIELDS)
    assert row["name"] == "NVIDIA H200"
    assert row["pci.bus_id"] == "00000000:83:00.0"  # the captured machine's slot
    assert row["memory.total"] == 143771
    assert row["power.draw"] == 627.4
    assert row["fan.speed"] is None  # [N/A] on a passively cooled card
    assert row["mig.mode.current"] == "Disabled"
    assert row["index"] == 0


def test_mig_capture_has_null_utilization() -> None:
    cap = replay.load("h200-mig-linux-driver590.48.01-load-query-gpu-all-fields.csv")
    stdout, _ = replay.answer(cap, list(FIELDS), "csv,noheader,nounits")
    (row,) = parse(stdout, FIELDS)
    assert row["mig.mode.current"] == "Enabled"
    assert row["utilization.gpu"] is None
    assert row["utilization.memory"] is None


def test_blank_lines_and_infoROM_warnings_are_skipped() -> None:
    fields = ("index", "temperature.gpu")
    with open(os.path.join(CORPUS, "errors", "inforom-corrupted-warning-exit14.txt")) as f:
        warning = f.read()
    rows = parse(f"{warning}\n0, 41\n\n1, 40\n", fields)
    assert rows == [{"index": 0, "temperature.gpu": 41}, {"index": 1, "temperature.gpu": 40}]


@pytest.mark.parametrize(
    ("stdout", "reason"),
    [
        ("0, 41, 3\n", "3 columns where 2 were asked for"),
        ("0\n", "1 columns where 2 were asked for"),
        ("0, hot\n", "temperature.gpu: not a number: 'hot'"),
        ("0, 41 C\n", "temperature.gpu: not a number"),
        ("", "no rows"),
        ("\n\n", "no rows"),
        ("0, 4\ufffd1\n", "not a number"),
    ],
)
def test_garbage_is_a_parse_error_naming_the_line(stdout: str, reason: str) -> None:
    with pytest.raises(ParseError, match=reason) as err:
        parse(stdout, ("index", "temperature.gpu"))
    assert err.value.line == stdout.strip("\n").split("\n")[0] or reason == "no rows"


def test_a_wrong_column_count_says_whether_the_line_is_csv() -> None:
    fields = ("index", "temperature.gpu")
    with pytest.raises(ParseError) as err:
        parse("0, [GPU requires reset], 3\n", fields)
    assert (err.value.columns, err.value.csv) == (3, True)
    with pytest.raises(ParseError) as err:
        parse("Unable to determine the device handle for GPU0000:CF:00.0: Unknown Error\n", fields)
    assert (err.value.columns, err.value.csv) == (1, False)
    with pytest.raises(ParseError) as err:
        parse("0, hot\n", fields)
    assert (err.value.columns, err.value.csv) == (None, False)


def test_text_fields_keep_odd_values() -> None:
    (row,) = parse(
        "GPU-1, 0x0000000000000004, P8\n", ("uuid", "clocks_event_reasons.active", "pstate")
    )
    assert row == {
        "uuid": "GPU-1",
        "clocks_event_reasons.active": "0x0000000000000004",
        "pstate": "P8",
    }


ERRORS = {
    "device-handle-unknown-error-no-space-synology.txt": (255, Failure.GPU_LOST),
    "device-handle-unknown-error.txt": (255, Failure.GPU_LOST),
    "driver-library-version-mismatch-exit18-nvml535.161.txt": (18, Failure.VERSION_MISMATCH),
    "driver-library-version-mismatch-exit18-nvml550.144.txt": (18, Failure.VERSION_MISMATCH),
    "driver-library-version-mismatch-single-line-older-driver.txt": (255, Failure.VERSION_MISMATCH),
    "driver-not-loaded-exit9.txt": (9, Failure.DRIVER_NOT_LOADED),
    "gpu-is-lost-linux.txt": (15, Failure.GPU_LOST),
    "gpu-is-lost-windows-driver369.30-console-wrapped.txt": (15, Failure.GPU_LOST),
    "inforom-corrupted-warning-after-table-8xV100-azure-driver460.32.03.txt": (14, Failure.OTHER),
    "inforom-corrupted-warning-exit14.txt": (14, Failure.OTHER),
    "invalid-field-clocks_throttle_reasons.unknown.txt": (2, Failure.OTHER),
    "invalid-field-device_minor-exit2.txt": (2, Failure.OTHER),
    "invalid-field-encoder.stats-windows-driver376.33.txt": (2, Failure.OTHER),
    "no-devices-were-found.txt": (6, Failure.NO_DEVICES),
    "nvlink-all-links-inactive-exit0.txt": (0, Failure.OTHER),
    "nvlink-not-supported-in-MIG-mode-exit0.txt": (0, Failure.OTHER),
    "nvml-library-not-found-exit12.txt": (12, Failure.LIBRARY_MISSING),
    "nvml-unknown-error-exit255.txt": (255, Failure.OTHER),
    "option-noheader-not-recognized-DUBIOUS.txt": (2, Failure.OTHER),
    "topo-m-unsupported-windows-driver591.86-exit255.txt": (255, Failure.OTHER),
}


def read_error(name: str) -> str:
    with open(os.path.join(CORPUS, "errors", name), encoding="utf-8") as f:
        return f.read()


def test_every_error_capture_has_a_row() -> None:
    names = {n for n in os.listdir(os.path.join(CORPUS, "errors")) if not n.endswith(".source.txt")}
    assert names == set(ERRORS)


@pytest.mark.parametrize(("name", "case"), sorted(ERRORS.items()))
def test_error_captures_classify(name: str, case: tuple[int, Failure]) -> None:
    code, expected = case
    assert classify(code, read_error(name)) is expected


# NVML_ERROR_OPERATING_SYSTEM as nvidia-smi prints it in public reports (microsoft/WSL#9938,
# google/gvisor#11069, seflerZ/oneclick-gpu-pv#8); none shows the exit status, which
# nvidia-smi takes from NVML's return code (17).
BLOCKED = (
    "Failed to initialize NVML: GPU access blocked by the operating system\n"
    "Failed to properly shut down NVML: GPU access blocked by the operating system\n"
)


@pytest.mark.parametrize("code", [17, 255, 1])
def test_access_blocked_by_the_os_is_its_own_class(code: int) -> None:
    assert classify(code, BLOCKED) is Failure.BLOCKED_BY_OS


def test_the_blocked_hint_names_the_sandbox() -> None:
    hint = smi.HINTS[Failure.BLOCKED_BY_OS]
    assert all(s in hint for s in ("gpuagent.service", "ProcSubset=", "PrivateDevices="))


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (4, Failure.PERMISSION_DENIED),
        (6, Failure.NO_DEVICES),
        (9, Failure.DRIVER_NOT_LOADED),
        (12, Failure.LIBRARY_MISSING),
        (15, Failure.GPU_LOST),
        (17, Failure.BLOCKED_BY_OS),
        (18, Failure.VERSION_MISMATCH),
        (1, Failure.OTHER),
        (255, Failure.OTHER),
    ],
)
def test_exit_codes_classify_without_text(code: int, expected: Failure) -> None:
    assert classify(code, "") is expected


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("invalid-field-clocks_throttle_reasons.unknown.txt", "clocks_throttle_reasons.unknown"),
        ("invalid-field-device_minor-exit2.txt", "device_minor"),
        ("invalid-field-encoder.stats-windows-driver376.33.txt", "encoder.stats.sessionCount"),
    ],
)
def test_invalid_field_is_recognised(name: str, field: str) -> None:
    assert invalid_field(read_error(name)) == field


def test_invalid_field_absent() -> None:
    assert invalid_field(read_error("no-devices-were-found.txt")) is None


@pytest.mark.parametrize(
    ("bus_id", "slot"),
    [
        ("00000000:41:00.0", "0000:41:00.0"),
        ("00000000:1A:00.0", "0000:1a:00.0"),
        ("00000008:01:00.0", "0008:01:00.0"),
        ("0000:41:00.0", "0000:41:00.0"),
        ("00000001:00:00.0", "0001:00:00.0"),
        ("41:00.0", "0000:41:00.0"),
        ("0:3B:00.0", "0000:3b:00.0"),
    ],
)
def test_bus_id_to_sysfs_slot(bus_id: str, slot: str) -> None:
    assert sysfs_slot(bus_id) == slot


@pytest.mark.parametrize(
    ("cell", "field", "reason"),
    [
        ("9" * 400, "temperature.gpu", "temperature.gpu: not a number"),
        ("9" * 400, "index", "index: not a number"),
        ("1.5", "index", "index: not a number"),
        ("-1", "index", "index: not a number"),
        ("g:18:00.0", "pci.bus_id", "pci.bus_id: not a PCI bus id"),
        ("00000000:18:00", "pci.bus_id", "pci.bus_id: not a PCI bus id"),
        ("inf", "power.draw", "power.draw: not a number"),
        ("nan", "power.draw", "power.draw: not a number"),
        ("1e5", "power.draw", "power.draw: not a number"),
    ],
)
def test_hostile_values_are_parse_errors(cell: str, field: str, reason: str) -> None:
    with pytest.raises(ParseError, match=reason):
        parse(f"{cell}\n", (field,))


def test_a_huge_field_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="not CSV"):
        parse("x" * 200_000 + ", 1\n", ("name", "index"))


def test_nul_bytes_are_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse("0, 4\x001\n", ("index", "temperature.gpu"))


def test_two_rows_with_one_bus_id_are_a_parse_error() -> None:
    with pytest.raises(ParseError, match=r"the same pci\.bus_id on two rows"):
        parse("0, 00000000:18:00.0\n1, 00000000:18:00.0\n", ("index", "pci.bus_id"))


def test_negative_and_fractional_numbers() -> None:
    (row,) = parse("-5, 2.50\n", ("temperature.gpu", "power.draw"))
    assert row == {"temperature.gpu": -5, "power.draw": 2.5}


def test_whole_numbers_are_what_a_float_makes_of_them_at_every_length() -> None:
    # Up to 15 digits a whole number is read as an int at once; beyond, through a float,
    # as any number is: the same value either way, whatever digits the driver prints.
    cells = ["123456789012345", "1234567890123456789", "\u0663\u0660"]
    (row,) = parse(", ".join(cells) + "\n", ("memory.used", "memory.total", "clocks.sm"))
    assert row == {
        "memory.used": 123456789012345,
        "memory.total": 1234567890123456768,
        "clocks.sm": 30,
    }
    assert all(type(v) is int for v in row.values())


# Per-GPU errors beside the rows of the others ---------------------------------------------


def _h200_rows(slots: list[str]) -> str:
    return replay.answer(
        replay.load("h200-linux-driver590.48.01-load-query-gpu-all-fields.csv"),
        list(FIELDS),
        "csv,noheader,nounits",
        slots,
    )[0]


@pytest.mark.parametrize(
    ("capture", "slot", "reason"),
    [
        ("device-handle-unknown-error.txt", "0000:0b:00.0", "Unknown Error"),
        ("device-handle-unknown-error-no-space-synology.txt", "0000:07:00.0", "Unknown Error"),
        (
            "gpu-is-lost-linux.txt",
            "0000:03:00.0",
            "GPU is lost.  Reboot the system to recover this GPU",
        ),
        (
            "gpu-is-lost-windows-driver369.30-console-wrapped.txt",
            "0000:03:00.0",
            "GPU is lost.  Reboot the system to recover this GPU",
        ),
    ],
)
def test_error_line_beside_rows_names_its_gpu(capture: str, slot: str, reason: str) -> None:
    with open(os.path.join(replay.CORPUS, "errors", capture)) as f:
        error = f.read()
    out = parse_output(error + _h200_rows(["0000:18:00.0", "0000:2a:00.0"]), FIELDS)
    assert [r["pci.bus_id"] for r in out.rows] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert out.gpu_errors == {slot: reason}
    # Alone, it still says which GPU is sick.
    alone = parse_output(error, FIELDS)
    assert (alone.rows, alone.gpu_errors) == ([], {slot: reason})


def test_requires_reset_values_and_inforom_warning() -> None:
    rows = _h200_rows(["0000:18:00.0", "0000:2a:00.0"]).splitlines()
    cells = rows[1].split(", ")
    for field in ("pstate", "temperature.gpu", "utilization.gpu"):
        cells[FIELDS.index(field)] = "[GPU requires reset]"
    with open(os.path.join(replay.CORPUS, "errors", "inforom-corrupted-warning-exit14.txt")) as f:
        warning = f.read()
    out = parse_output(warning + rows[0] + "\n" + ", ".join(cells) + "\n", FIELDS)
    assert out.requires_reset == {"0000:2a:00.0": ("pstate", "temperature.gpu", "utilization.gpu")}
    assert out.rows[1]["temperature.gpu"] is None
    assert out.inforom == ("0000:00:1e.0",)
    assert out.gpu_errors == {}
