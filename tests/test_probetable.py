"""``gpuagent probe``'s table and ``--json`` (:mod:`gpuagent.commands.probetable`), from one
nvidia-smi answer as the prober returns it."""

from __future__ import annotations

import json

from gpuagent.commands.probetable import HEADER, findings, full, table
from gpuagent.sources.probe import rules
from gpuagent.sources.probe.probe import ProbeResult
from gpuagent.views import PciGpu, Row

A, B, C = "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"


def row(slot: str, name: str = "NVIDIA H200", values: Row | None = None) -> Row:
    """A row as the parse gives it: nvidia-smi's bus id spelling, the fields that matter."""
    return {"pci.bus_id": "0000" + slot.upper(), "name": name, **(values or {})}


def gpu(slot: str, driver: str | None = "nvidia") -> PciGpu:
    return PciGpu(slot, "0x2335", "0x030200", driver)


def test_a_healthy_host_is_one_ok_line_a_gpu_in_slot_order() -> None:
    answer = ProbeResult(rows=[row(B), row(A)])
    lines = table(answer, [gpu(A), gpu(B)])
    assert [ln.split() for ln in lines] == [
        list(HEADER),
        [A, "NVIDIA", "H200", "-", "ok"],
        [B, "NVIDIA", "H200", "-", "ok"],
    ]


def test_each_finding_is_a_line_worst_first_with_its_action() -> None:
    sick = row(
        A, values={"ecc.errors.uncorrected.volatile.total": 2, "gpu_recovery_action": "Reboot"}
    )
    lines = table(ProbeResult(rows=[sick, row(B)]), [gpu(A), gpu(B)])
    assert lines[1].split(None, 4)[3:] == [
        "reboot",
        "critical recovery_action: the driver asks for recovery: Reboot",
    ]
    # The second finding of a GPU leaves its slot and name blank.
    assert lines[2].startswith(" " * len(A))
    assert lines[2].split(None, 1) == [
        "reset_gpu",
        "warning ecc_uncorrected: 2 uncorrected ECC errors since the driver loaded",
    ]
    assert lines[3].split()[0] == B
    # The columns line up: each line's finding starts where the header's does.
    at = lines[0].index("FINDING")
    assert all(ln[at - 2 : at] == "  " and ln[at] != " " for ln in lines)


def test_a_gpu_nvidia_smi_cannot_reach_or_does_not_report() -> None:
    answer = ProbeResult(rows=[row(B)], gpu_errors={A: "Unknown Error"})
    # C is bound to nvidia and missing from the answer; vfio-pci's and an unbound GPU are not
    # nvidia-smi's to report (an unbound one is the bus's no_driver, which probe does not read).
    bus = [gpu(A), gpu(B), gpu(C), gpu("0000:4a:00.0", "vfio-pci"), gpu("0000:5a:00.0", None)]
    lines = table(answer, bus)
    assert [ln.split()[0] for ln in lines[1:]] == [A, B, C]
    assert lines[1].endswith("critical lost: nvidia-smi cannot reach the GPU: Unknown Error")
    assert "critical missing: missing from nvidia-smi" in lines[3]
    assert lines[3].split()[1:3] == ["-", "reboot"]


def test_one_sample_judges_throttling_on_its_own() -> None:
    # The agent waits for a window of samples; a hand check has one, and says what it shows.
    answer = ProbeResult(
        rows=[row(A, values={"clocks_event_reasons.active": "0x0000000000000048"})]
    )
    (line,) = table(answer, [gpu(A)])[1:]
    assert line.split(None, 4)[3:] == [
        "check_host",
        "warning throttled: clocks held down: hardware slowdown, hardware thermal slowdown; "
        f"{rules.COOLING}; {rules.POWER}",
    ]


def test_what_nvidia_smi_prints_is_cleaned_of_control_characters() -> None:
    answer = ProbeResult(rows=[row(A, name="evil\x1b]0;pwned\x07")], gpu_errors={B: "bad\x1b[31m"})
    text = "\n".join(table(answer, [gpu(A), gpu(B)]))
    assert "\x1b" not in text and "\x07" not in text
    assert "evil?]0;pwned?" in text


def test_json_is_the_whole_answer_with_the_findings() -> None:
    answer = ProbeResult(
        rows=[row(A, values={"temperature.gpu": None}), row(B)],
        reasons=({"temperature.gpu": "[GPU requires reset]"}, {}),
        requires_reset={A: ("temperature.gpu",)},
    )
    out = json.loads(json.dumps(full(answer, [gpu(A), gpu(B)])))
    assert set(out) == {"fields", "rows", "reasons", "gpu_errors", "findings"}
    assert out["rows"][0]["temperature.gpu"] is None
    assert out["reasons"] == [{"temperature.gpu": "[GPU requires reset]"}, {}]
    (reset,) = out["findings"][A]
    assert (reset["kind"], reset["severity"], reset["action"]) == (
        "requires_reset",
        "critical",
        "reset_gpu",
    )
    assert reset["ends"] == "when nvidia-smi reads its values again (after the reset)"
    assert out["findings"][B] == []


def test_findings_cover_every_gpu_of_the_answer_and_the_bus() -> None:
    found = findings(ProbeResult(rows=[row(A)]), [gpu(A), gpu(B)])
    assert list(found) == [A, B]
    assert found[A] == [] and [f.kind for f in found[B]] == ["missing"]


def test_a_terminals_width_cuts_each_line() -> None:
    sick = row(A, values={"gpu_recovery_action": "Reboot"})
    answer = ProbeResult(rows=[sick, row(B)])
    whole = table(answer, [gpu(A), gpu(B)])
    cut = table(answer, [gpu(A), gpu(B)], 40)
    assert max(len(line) for line in whole) > 40
    assert all(len(line) <= 40 for line in cut)
    assert cut[1].endswith("…") and whole[1].startswith(cut[1][:-1])
    assert cut[2] == whole[2]  # one that fits is left whole
