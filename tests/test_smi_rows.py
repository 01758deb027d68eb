"""nvidia-smi rows that mislead: a bus id in two spellings, a row that names no GPU, one
``ERR!`` cell, an impossible value.  Each is one cell or one row of a real capture altered
here (the capture itself is never edited); the other GPUs of the answer stay as they are."""

from __future__ import annotations

import logging

import pytest

from gpuagent.logs import EventLog
from gpuagent.sources.probe import rules, smi
from gpuagent.sources.probe.probe import Prober, ProbeResult
from gpuagent.sources.probe.samples import Samples
from gpuagent.sources.probe.smi import FIELDS, ParseError, parse_output
from gpuagent.views import Failure, PciGpu
from tests import replay
from tests.conftest import Answers

H200 = "h200-linux-driver590.48.01-load-query-gpu-all-fields.csv"
# The one real 8-GPU capture (7 fields: index, uuid, name, temperature, utilization, memory).
TITAN_X8 = "gtx-titan-x-x8-driverUNKNOWN-noheader-nounits-7fields.csv"
SLOTS = [f"0000:{bus:02x}:00.0" for bus in (0x18, 0x2A, 0x3A, 0x3B, 0x9A, 0xAB, 0xBA, 0xDB)]


def h200_host(overrides: dict[str, dict[str, str]] | None = None) -> str:
    """An 8-GPU H200 host's answer to the agent's query, ``overrides`` put into one row."""
    cap = replay.load(H200)
    return replay.answer(cap, list(FIELDS), "csv,noheader,nounits", SLOTS, overrides)[0]


def titan_x8() -> tuple[tuple[str, ...], list[str]]:
    cap = replay.load(TITAN_X8)
    fields = tuple(cap.fields)
    return fields, replay.answer(cap, list(fields), "csv,noheader,nounits")[0].splitlines()


def probe(stdout: str) -> ProbeResult:
    return Prober(Answers(stdout)).probe("nvidia-smi")


def take(result: ProbeResult) -> tuple[Samples, dict[str, list[str]]]:
    """The kinds of problem each slot has once the 8-GPU host's answer is taken."""
    samples = Samples(
        EventLog(logging.getLogger("test.smi_rows")), monotonic=lambda: 0.0, wall=lambda: 0.0
    )
    gpus = tuple(PciGpu(s, "0x2335", "0x030200", "nvidia") for s in SLOTS)
    found = samples.take(result, gpus)
    return samples, {slot: [f.kind for f in fs] for slot, fs in found.items() if fs}


def test_the_unaltered_host_is_eight_gpus_and_no_problem() -> None:
    result = probe(h200_host())
    assert result.rows is not None
    assert len(result.rows) == 8
    samples, found = take(result)
    assert found == {}
    assert samples.named == frozenset(SLOTS)


# One bus id in two spellings -----------------------------------------------------------


@pytest.mark.parametrize("spelling", ["0000:3a:00.0", "3A:00.0", "0:3a:00.0", "00000000:3a:00.0"])
def test_one_bus_id_in_two_spellings_is_one_gpu_not_another_missing(spelling: str) -> None:
    # GPU 3B's row names GPU 3A's slot in another spelling: a contradiction, not 3B missing.
    stdout = h200_host({"0000:3b:00.0": {"pci.bus_id": spelling}})
    with pytest.raises(ParseError, match=r"the same pci\.bus_id on two rows"):
        parse_output(stdout, FIELDS)
    result = probe(stdout)
    assert (result.rows, result.failure) == (None, Failure.UNPARSEABLE)


def test_a_bus_id_without_its_domain_is_the_gpu_in_domain_0() -> None:
    result = probe(h200_host({"0000:3b:00.0": {"pci.bus_id": "3B:00.0"}}))
    samples, found = take(result)
    assert found == {}
    assert samples.named == frozenset(SLOTS)


# A row that names no GPU ------------------------------------------------------------------


def test_an_all_na_row_is_no_phantom_gpu() -> None:
    stdout = h200_host() + ", ".join(["[N/A]"] * len(FIELDS)) + "\n"
    result = probe(stdout)
    assert result.rows is not None
    assert len(result.rows) == 8
    assert result.warnings == ("row 9: neither pci.bus_id nor uuid, no GPU's; left out",)
    samples, found = take(result)
    assert found == {}
    assert samples.named == frozenset(SLOTS)


def test_an_all_na_row_among_the_8_captured_gpus_is_left_out() -> None:
    fields, lines = titan_x8()
    lines[4] = ", ".join(["[N/A]"] * len(fields))
    out = parse_output("\n".join(lines) + "\n", fields)
    assert [r["index"] for r in out.rows] == [0, 1, 2, 3, 5, 6, 7]
    assert out.malformed == ("row 5: neither pci.bus_id nor uuid, no GPU's; left out",)
    assert len(out.reasons) == len(out.rows)


def test_an_answer_of_one_all_na_row_is_unparseable() -> None:
    result = probe(", ".join(["[N/A]"] * len(FIELDS)) + "\n")
    assert (result.rows, result.failure) == (None, Failure.UNPARSEABLE)
    assert "neither pci.bus_id nor uuid" in result.error


def test_a_row_that_requires_a_reset_is_kept_without_its_ids() -> None:
    reset = ", ".join([smi.REQUIRES_RESET] * len(FIELDS))
    out = parse_output(h200_host() + reset + "\n", FIELDS)
    assert len(out.rows) == 9
    assert out.requires_reset == {"index:None": FIELDS}
    assert out.malformed == ()


# One ERR! cell ----------------------------------------------------------------------------


def test_one_err_cell_blanks_that_field_of_that_gpu_only() -> None:
    fields, lines = titan_x8()
    before = parse_output("\n".join(lines) + "\n", fields).rows
    cells = lines[3].split(", ")
    cells[fields.index("temperature.gpu")] = "ERR!"
    lines[3] = ", ".join(cells)
    out = parse_output("\n".join(lines) + "\n", fields)
    assert out.rows == [*before[:3], {**before[3], "temperature.gpu": None}, *before[4:]]
    assert out.reasons[3] == {"temperature.gpu": "ERR!"}
    assert out.malformed == ()


@pytest.mark.parametrize(
    "field", ["power.draw", "pcie.link.width.current", "gpu_recovery_action", "mig.mode.pending"]
)
def test_err_in_one_cell_of_8_gpus_is_no_outage_and_no_fault(field: str) -> None:
    result = probe(h200_host({"0000:3b:00.0": {field: "ERR!"}}))
    assert result.rows is not None
    assert len(result.rows) == 8
    assert result.rows[3][field] is None
    assert all(r[field] is not None for i, r in enumerate(result.rows) if i != 3)
    samples, found = take(result)
    assert found == {}
    assert samples.named == frozenset(SLOTS)


# Impossible values --------------------------------------------------------------------------


def test_a_negative_link_width_is_no_degraded_link() -> None:
    result = probe(h200_host({"0000:3b:00.0": {"pcie.link.width.current": "-16"}}))
    assert result.rows is not None
    assert result.rows[3]["pcie.link.width.current"] is None
    assert result.warnings == (
        "GPU 0000:3b:00.0: pcie.link.width.current: not a possible value: '-16'; left blank",
    )
    _, found = take(result)
    assert found == {}


@pytest.mark.parametrize(
    ("field", "cell"),
    [
        ("pcie.link.width.max", "64"),
        ("pcie.link.width.max", "-1"),
        ("pcie.link.gen.current", "-3"),
        ("pcie.link.gen.max", "-1"),
        ("memory.used", "-1"),
        ("memory.total", "-143771"),
        ("temperature.gpu", "-300"),
        ("temperature.gpu", "4294967295"),
        ("utilization.gpu", "101"),
        ("utilization.gpu", "-5"),
        ("power.draw", "-627.40"),
        ("clocks.sm", "-1980"),
        ("ecc.errors.uncorrected.volatile.total", "-2"),
    ],
)
def test_an_impossible_value_is_blank_and_noted_not_a_fault(field: str, cell: str) -> None:
    out = parse_output(h200_host({"0000:3b:00.0": {field: cell}}), FIELDS)
    assert len(out.rows) == 8
    assert out.rows[3][field] is None
    assert all(r[field] is not None for i, r in enumerate(out.rows) if i != 3)
    assert out.malformed == (
        f"GPU 0000:3b:00.0: {field}: not a possible value: {cell!r}; left blank",
    )
    assert rules.row_findings(out.rows[3]) == []


@pytest.mark.parametrize(
    ("field", "cell"),
    [
        ("temperature.gpu", "-40"),
        ("temperature.gpu", "105"),
        ("utilization.gpu", "0"),
        ("utilization.gpu", "100"),
        ("pcie.link.width.current", "1"),
        ("pcie.link.width.max", "32"),
        ("memory.used", "0"),
        ("power.draw", "0.00"),
    ],
)
def test_a_possible_value_is_kept(field: str, cell: str) -> None:
    out = parse_output(h200_host({"0000:3b:00.0": {field: cell}}), FIELDS)
    assert out.rows[3][field] == float(cell)
    assert out.malformed == ()


def test_forget_ends_what_the_last_answer_said_missing_too() -> None:
    # A 7-row answer leaves one GPU missing; once a gate holds (nvidia-smi removed) that
    # answer no longer holds: no GPU is missing from it, none reported, throttling forgotten.
    lines = h200_host().splitlines()
    result = probe("\n".join(lines[:7]) + "\n")
    samples, found = take(result)
    assert found == {SLOTS[7]: ["missing"]}
    gpus = tuple(PciGpu(s, "0x2335", "0x030200", "nvidia") for s in SLOTS)
    assert samples.mark_stale(gpus, 10.0).missing == (SLOTS[7],)
    samples.forget()
    view = samples.mark_stale(gpus, 10.0)
    assert view.missing == ()
    assert view.fresh == frozenset()
    assert samples.throttle.findings(0.0) == {}
