"""``gpuagent rma``: ``nvidia-smi -q`` parsed and NVIDIA's gates judged on real captures (the
corpus's ``-q`` texts of an H100 on drivers 535 and 590 and an L40S on 595, none with a gate
met), each gate met in a case derived in the test by altering a capture's text (never the
file), and the command end to end on the fake host: ``gpus.json``, ``wear.json`` and the
state written by a real agent's ticks, a real journal (make-test-journal) with the board's
Xid in another slot in an earlier boot, the fake nvidia-smi answering ``-q -i SLOT``."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent import state as state_file
from gpuagent.commands.cli import main
from gpuagent.logs import Event
from gpuagent.rma import gates, packet, smiq
from tests import replay
from tests.conftest import Host
from tests.fakehost import H200_LOAD, write_config
from tests.journalfeed import this_boot
from tests.test_kernel import FELL_OFF
from tests.test_kernel import UUID as FELL_OFF_UUID
from tests.test_kernlog import append, make
from tests.test_timeline import EARLIER, agent_line
from tests.test_wear import wear_boards_record

__all__ = ["make"]  # the fixture

NVLINK = os.path.join(replay.CORPUS, "nvlink")
H100 = "query-q-h100-80gb-hbm3-driver590.48.01-fabric-completed-clique0.txt"
H100_535 = "query-q-h100-80gb-hbm3-x8-driver535.161.08-gpu0-fabric-state-status-only-TRIMMED.txt"
L40S = "query-q-l40s-driver595.80-fabric-na-partition-assigned.txt"
SERIAL = "1320221034567"
# After the Xid record of the capture (April 2024) that make-test-journal writes.
AFTER = 1_712_400_000


def capture(name: str) -> str:
    with open(os.path.join(NVLINK, name), encoding="utf-8") as f:
        return f.read()


def altered(text: str, old: str, new: str) -> str:
    """``text`` with the line holding ``old`` given ``new`` instead (the key's column kept)."""
    assert old in text, old
    return text.replace(old, new, 1)


def valued(text: str, key: str, value: str) -> str:
    """``text`` with the first ``key : ...`` line's value ``value`` (the colon's column kept)."""
    line = re.compile(rf"^(\s*{re.escape(key)}\s*: ).*$", re.M)
    assert line.search(text), key
    return line.sub(lambda m: m[1] + value, text, count=1)


def judged(text: str) -> dict[str, gates.Gate]:
    return {g.gate: g for g in gates.judge(smiq.parse(text))}


@pytest.mark.parametrize(
    ("name", "slot", "serial", "vbios", "banks"),
    [
        (H100, "0000:00:09.0", "0000000000000", "96.00.A5.00.01", 2560),
        (H100_535, "0000:19:00.0", "1650124031592", "96.00.74.00.0D", 2560),
        (L40S, "0000:01:00.0", "0000000000000", "95.02.66.00.02", 192),
    ],
)
def test_real_captures_parse_and_meet_no_gate(
    name: str, slot: str, serial: str, vbios: str, banks: int
) -> None:
    board = smiq.parse(capture(name))
    assert board.slot == slot
    assert board.identity["serial"] == serial and board.identity["vbios"] == vbios
    assert board.identity["uuid"].startswith("GPU-")
    assert board.identity["board_part_number"] in ("692-2G520-0200-000", "900-2G133-0080-000")
    assert (board.remaps_correctable, board.remaps_uncorrectable) == (0, 0)
    assert (board.remap_pending, board.remap_failure) == (False, False)
    assert board.banks == {"Max": banks, "High": 0, "Partial": 0, "Low": 0, "None": 0}
    # Row-remapping GPUs print N/A for retired pages: not reported, never "none".
    assert (board.pages_sbe, board.pages_dbe, board.pages_pending) == (None, None, None)
    assert board.sram_threshold_exceeded is False
    found = judged(capture(name))
    assert [g.met for g in found.values()] == [False, False, None]
    assert found["row_remap_failure"].reading.startswith(
        "remapping failure No; 0 of 512 rows remapped (0 correctable, 0 uncorrectable)"
    )
    assert found["retired_pages"].reading.startswith("not reported")


def test_the_row_remap_failure_flag_is_the_gate() -> None:
    # Derived: the H100 capture with the driver's failure flag set and a bank out of spares.
    text = valued(capture(H100), "Remapping Failure Occurred", "Yes")
    text = valued(valued(text, "Uncorrectable Error", "9"), "None", "1 bank(s)")
    gate = judged(text)["row_remap_failure"]
    assert gate.met is True
    assert gate.reading == (
        "remapping failure Yes; 9 of 512 rows remapped (0 correctable, 9 uncorrectable); "
        "banks by spare rows left: max 2560, high 0, partial 0, low 0, none 1"
    )
    assert gate.source == gates.ROW_REMAP_POLICY


def test_512_remaps_in_all_meet_the_gate_without_the_flag() -> None:
    # Derived: 511 remaps are below NVIDIA's 512; 512 are the frame buffer's last.
    base = capture(L40S)
    for correctable, met in (("500", False), ("501", True)):
        text = valued(valued(base, "Correctable Error", correctable), "Uncorrectable Error", "11")
        assert judged(text)["row_remap_failure"].met is met


def test_a_pending_remap_is_said_and_is_no_gate() -> None:
    # The first "Pending : No" is the row remapper's (MIG's and ECC mode's say Disabled,
    # Enabled).
    text = altered(capture(H100_535), "Pending                           : No", "Pending : Yes")
    gate = judged(text)["row_remap_failure"]
    assert gate.met is False and "a remap pending until the GPU is reset" in gate.reading


def test_the_sram_threshold_flag() -> None:
    # Derived: the driver's flag set; and a driver without the key (before 535): not reported.
    gate = judged(valued(capture(H100), "SRAM Threshold Exceeded", "Yes"))["sram_threshold"]
    assert (gate.met, gate.reading) == (True, "SRAM threshold exceeded Yes")
    assert gate.source == gates.SRAM_POLICY
    line = "            SRAM Threshold Exceeded                    : No\n"
    gate = judged(altered(capture(H100), line, ""))["sram_threshold"]
    assert (gate.met, gate.reading) == (None, "not reported")


@pytest.mark.parametrize(
    ("sbe", "dbe", "met"),
    [("0", "0", False), ("60", "3", False), ("60", "4", True), ("2", "70", True)],
)
def test_retired_pages_against_64(sbe: str, dbe: str, met: bool) -> None:
    # Derived: a GPU that retires pages (before Ampere) prints counts where the H100 prints
    # N/A; the corpus has no pre-Ampere -q text.
    text = valued(valued(capture(H100), "Single Bit ECC", sbe), "Double Bit ECC", dbe)
    text = valued(text, "Pending Page Blacklist", "Yes")
    gate = judged(text)["retired_pages"]
    assert gate.met is met
    assert gate.reading == (
        f"{int(sbe) + int(dbe)} of 64 pages retired ({sbe} single-bit, {dbe} double-bit); a "
        "page pending until the GPU is reset"
    )
    assert gate.source == gates.PAGE_RETIREMENT


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("Timestamp : now\n", "no GPU in the answer"),
        (
            altered(
                capture(H100),
                "Pending                                        : No",
                "Pending                                        : maybe",
            ),
            "Remapped Rows / Pending: not Yes or No: 'maybe'",
        ),
        (
            valued(capture(H100), "Correctable Error", "-1"),
            "Remapped Rows / Correctable Error: not a count: '-1'",
        ),
    ],
)
def test_an_answer_that_is_not_nvidia_smis_says_where(text: str, said: str) -> None:
    with pytest.raises(ValueError, match="^" + said.replace("(", r"\(").replace(")", r"\)")):
        smiq.parse(text)


def test_only_the_first_gpu_is_read() -> None:
    one = capture(H100)
    other = valued(one, "Remapping Failure Occurred", "Yes")
    other = other.replace("GPU 00000000:00:09.0", "GPU 00000000:18:00.0")
    board = smiq.parse(one + other.split("Attached GPUs", 1)[1].split("\n", 1)[1])
    assert board.slot == "0000:00:09.0" and board.remap_failure is False


def config(host: Host, tmp_path: str, journal: str) -> str:
    path = os.path.join(str(tmp_path), "rma.toml")
    write_config(
        path,
        {
            "journal_directory": journal,
            "state_file": os.path.join(host.dir, "state.json"),
            "nvidia_smi": host.smi,
            "probe_timeout": 5.0,
        },
    )
    return path


def bare(make: Any, tmp_path: str, host: Host) -> tuple[str, str]:
    """A config whose journal holds the capture's Xid 79 (its board in no gpus.json), and an
    empty state directory."""
    journal = make(FELL_OFF)
    state = os.path.join(str(tmp_path), "empty")
    os.makedirs(state)
    return config(host, tmp_path, journal), state


def rma(conf: str, state: str, *args: str) -> Any:
    return CliRunner(mix_stderr=False).invoke(
        main,
        ["--config", conf, "rma", *args, "--days", "100000"],
        env={"STATE_DIRECTORY": state},
    )


def test_the_packet_end_to_end(host: Host, make: Any, tmp_path: str) -> None:
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    slot, earlier_slot = host.slots[0], "0000:2a:00.0"
    uuid = replay.gpu_uuid(slot)
    cells = {"serial": SERIAL, "remapped_rows.correctable": "12"}
    host.healthy(override={slot: cells})
    host.make_agent(state_directory=state)
    host.tick(3)  # a real agent writes gpus.json, wear.json and the state
    assert {"gpus.json", "wear.json"} <= set(os.listdir(state))
    # The tick's state as the daemon publishes it, with a PCIe error on the board's path now
    # (added here: the fake host's sysfs has no AER counts).
    st: Any = json.loads(json.dumps(host.state))
    (entry,) = [g for g in st["gpus"] if g["pci_slot"] == slot]
    entry["problems"].append(
        {
            "kind": "pcie_error",
            "severity": "warning",
            "action": "drain_and_reset",
            "message": "non-fatal PCIe error",
            "since": AFTER + 2,
            "pcie_device": "0000:17:00.0",
        }
    )
    state_file.write(os.path.join(host.dir, "state.json"), st)
    # In an earlier boot the board sat in another slot and fell off the bus there.
    kernel = FELL_OFF.replace("0000:18:00", "0000:2a:00").replace(FELL_OFF_UUID, uuid)
    journal = make(kernel, boot=EARLIER)
    fields = {"PCI_SLOT": slot, "GPU_UUID": uuid, "PROBLEM": "pcie_error"}
    fields |= {"SEVERITY": "critical", "ACTION": "drain_and_reset"}
    append(journal, agent_line(AFTER, Event.PROBLEM_PCIE_ERROR, **fields))
    wore = {slot: (uuid, {"remapped_rows_correctable": 12})}
    append(journal, wear_boards_record(this_boot(), AFTER + 1, wore))
    # Derived from the H100 capture: this board's slot, UUID and serial, its failure flag set.
    query = capture(H100).replace("GPU 00000000:00:09.0", f"GPU 0000{slot}")
    query = query.replace("GPU-00000000-0000-0000-0000-000000000000", uuid)
    query = altered(query, ": 0000000000000", f": {SERIAL}")
    query = altered(
        query, "Occurred                     : No", "Occurred                     : Yes"
    )
    host.scenario(capture=H200_LOAD, slots=host.slots, override={slot: cells}, query=query)
    evidence = os.path.join(state, "evidence")
    os.makedirs(evidence)
    for name in (f"{slot}-20261207T120000.tar.gz", "0000:5d:00.0-20261207T120000.tar.gz"):
        open(os.path.join(evidence, name), "w").close()
    conf = config(host, tmp_path, journal)
    res = rma(conf, state, slot, "--json")
    assert res.exit_code == 0, res.stderr
    assert ["-q", "-i", slot] in host.calls()
    out = json.loads(res.stdout)
    assert set(out) == {
        "uuid",
        "serial",
        "name",
        "vbios",
        "board_part_number",
        "pci_slot",
        "slots",
        "driver",
        "gates",
        "gate_met",
        "faults",
        "wear",
        "pcie_errors",
        "evidence",
        "notes",
        "next_step",
    }
    assert (out["uuid"], out["serial"], out["pci_slot"]) == (uuid, SERIAL, slot)
    assert (out["vbios"], out["board_part_number"]) == ("96.00.A5.00.01", "692-2G520-0200-000")
    assert [s["pci_slot"] for s in out["slots"]] == [earlier_slot, slot], out["slots"]
    assert out["driver"]["read"] and out["driver"]["remapped_rows"]["failure"] is True
    assert [(g["gate"], g["met"]) for g in out["gates"]] == [
        ("row_remap_failure", True),
        ("sram_threshold", False),
        ("retired_pages", None),
    ]
    assert out["gate_met"] is True
    assert [(f["pci_slot"], f["event"], f["xid"] or f["kind"]) for f in out["faults"]] == [
        (earlier_slot, "xid", 79),
        (slot, "problem_start", "pcie_error"),
    ]
    assert out["wear"][0]["counters"]["remapped_rows_correctable"] == 12
    assert [(p["pci_slot"], p["severity"], p["pcie_device"]) for p in out["pcie_errors"]] == [
        (slot, "critical", None),  # the journal's, of this boot
        (slot, "warning", "0000:17:00.0"),  # the state's, now
    ]
    assert out["evidence"] == {
        "directory": evidence,
        "files": [f"{slot}-20261207T120000.tar.gz"],
        "more": 0,
    }
    assert out["notes"] == []
    assert out["next_step"]["source"] == gates.RMA_PROCESS
    # The same board by its serial and by its UUID; the text for a person.
    for by in (SERIAL, uuid.lower()):
        again = rma(conf, state, by, "--json")
        assert again.exit_code == 0, again.stderr
        assert json.loads(again.stdout)["uuid"].lower() == uuid.lower()
    text = rma(conf, state, slot)
    assert text.exit_code == 0, text.stderr
    assert "  row_remap_failure  MET: remapping failure Yes;" in text.stdout
    assert "Xid 79 (action: " in text.stdout and earlier_slot in text.stdout
    assert text.stdout.rstrip().endswith(f"({gates.RMA_PROCESS})")


def test_a_board_gone_from_this_host_is_a_packet_without_the_driver(
    make: Any, tmp_path: str, host: Host
) -> None:
    conf, state = bare(make, tmp_path, host)
    res = rma(conf, state, FELL_OFF_UUID, "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["pci_slot"] is None and out["gates"] == [] and out["gate_met"] is False
    assert out["driver"] == {"read": False, "error": "the board is not on this host's bus now"}
    assert [f["xid"] for f in out["faults"]] == [79]
    assert out["evidence"]["directory"] is None
    assert not any(argv[:1] == ["-q"] for argv in host.calls())


def test_exit_1_for_a_board_not_known_and_2_for_no_board(
    make: Any, tmp_path: str, host: Host
) -> None:
    conf, state = bare(make, tmp_path, host)
    for unknown in ("9999999999999", "GPU-99999999-0000-0000-0000-000000000000", "0000:99:00.0"):
        res = rma(conf, state, unknown)
        assert res.exit_code == 1
        assert res.stderr.startswith(f"gpuagent: no board {unknown} known to the agent")
    for bad in ("x!", ""):
        assert rma(conf, state, bad).exit_code == 2
    assert rma(conf, state).exit_code == 2


def test_render_disarms_what_the_journal_holds() -> None:
    out = packet.build(
        "GPU-1",
        remembered=[],
        steps=[],
        wear_now=None,
        problems={},
        read="nvidia-smi -q -i x: exit 3: \x1b[2Kbad",
        evidence=None,
    )
    text = packet.render(out)
    assert "\x1b" not in text and "not read: nvidia-smi -q -i x: exit 3: ?[2Kbad" in text
