"""A board's wear across boots: the counters from real captures (pure), the trend (pure,
exhaustively), the boot's records remembered across restarts, and on a fake host whose
nvidia-smi answers from the capture, with earlier boots in a real journal file."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent.commands.cli import main
from gpuagent.config import Config
from gpuagent.edges.runner import Outcome, Runner, RunResult
from gpuagent.logs import Event, EventLog
from gpuagent.schema import ProbeState
from gpuagent.sources.kernel import timeline
from gpuagent.sources.wear import boards, counters, trend
from gpuagent.sources.wear.boards import Board
from gpuagent.sources.wear.counters import Counters
from gpuagent.sources.wear.recorded import Recorded
from gpuagent.sources.wear.source import MISSES, WearSource
from gpuagent.views import BusView, KernelView, PciGpu, ProbeView, SamplesView, Tick
from tests import replay
from tests.conftest import Answers, Host
from tests.test_earlier import A, B, agent_line
from tests.test_kernlog import append, make
from tests.test_linksup import recorder

__all__ = ["make"]  # the fixture

H200 = "h200-linux-driver590.48.01-load-query-gpu-all-fields.csv"
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def asked(capture: str, fields: tuple[str, ...] = tuple(counters.FIELDS)) -> tuple[str, int]:
    """The capture's answer to the wear read, as nvidia-smi prints it."""
    query = ["pci.bus_id", *fields]
    return replay.answer(replay.load(capture), query, "csv,noheader,nounits")


def test_the_counters_of_real_captures() -> None:
    text, code = asked(H200)
    assert code == 0
    # Ampere and later remap rows; the retired pages are [N/A] there and left out.
    assert counters.parse(text, tuple(counters.FIELDS)) == {
        "0000:83:00.0": {
            "remapped_rows_correctable": 0,
            "remapped_rows_uncorrectable": 0,
            "ecc_uncorrected_aggregate": 0,
        }
    }
    # A GeForce offers none of them.
    text, _ = asked("rtx2080super-linux-driver610.57.04-idle-query-gpu-all-fields.csv")
    assert counters.parse(text, tuple(counters.FIELDS)) == {"0000:0c:00.0": {}}
    # Driver 465 knows no remapped_rows: it rejects the read, which is asked without them.
    text, code = asked("rtx2080super-linux-driver465.27-query-gpu-115fields.csv")
    assert (code, text) == (
        2,
        'Field "remapped_rows.correctable" is not a valid field to query.\n\n',
    )
    rest = tuple(counters.FIELDS)[2:]
    text, code = asked("rtx2080super-linux-driver465.27-query-gpu-115fields.csv", rest)
    assert code == 0 and counters.parse(text, rest) == {"0000:0c:00.0": {}}


def test_the_forms_of_a_cell() -> None:
    fields = ("remapped_rows.correctable", "retired_pages.single_bit_ecc.count")
    text = (
        "00000000:18:00.0, 12, [N/A]\n"
        "00000000:2A:00.0, ERR!, 3\n"
        "WARNING: infoROM is corrupted at gpu 0000:00:1E.0\n"
        "00000000:3a:00.0, , N/A\n"
    )
    assert counters.parse(text, fields) == {
        "0000:18:00.0": {"remapped_rows_correctable": 12},
        "0000:2a:00.0": {"retired_pages_sbe": 3},
        "0000:3a:00.0": {},
    }


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "no GPU's row in the answer"),
        ("Unknown Error\n", "line 1 is not 'BUS_ID, remapped_rows.correctable, "),
        ("00000000:18:00.0, 1\n", "line 1 is not 'BUS_ID, "),
        (
            "00000000:18:00.0, 1, -2\n",
            "line 1 (00000000:18:00.0): retired_pages.single_bit_ecc.count is not a count",
        ),
        (
            "00000000:18:00.0, 1.5, 2\n",
            "line 1 (00000000:18:00.0): remapped_rows.correctable is not a count: '1.5'",
        ),
        # Not ASCII digits, or more than a 64-bit counter's.
        ("00000000:18:00.0, \u00b2, 2\n", "remapped_rows.correctable is not a count"),
        ("00000000:18:00.0, 1, " + "9" * 21 + "\n", "retired_pages.single_bit_ecc.count is not"),
    ],
)
def test_an_answer_that_is_not_counts_says_where(text: str, said: str) -> None:
    fields = ("remapped_rows.correctable", "retired_pages.single_bit_ecc.count")
    with pytest.raises(ValueError, match=re.escape(said)):
        counters.parse(text, fields)


def test_said_for_a_person() -> None:
    counts = {"ecc_uncorrected_aggregate": 2, "remapped_rows_correctable": 12}
    assert counters.said(counts) == (
        "rows remapped (correctable) 12, uncorrected ECC errors (lifetime) 2"
    )
    assert counters.args(("remapped_rows.correctable",)) == (
        "--query-gpu=pci.bus_id,remapped_rows.correctable",
        "--format=csv,noheader,nounits",
    )


def rows(values: list[int], name: str = "remapped_rows_correctable") -> list[dict[str, int]]:
    return [{name: v} for v in values]


@pytest.mark.parametrize(
    ("boots", "grew"),
    [
        # Fewer than three records: no trend yet.
        (rows([0, 100]), None),
        # More than 8 rows remapped in each of the last two boots.
        (rows([0, 9, 18]), "rows remapped (correctable) 0 -> 9 -> 18"),
        (rows([0, 8, 18]), None),
        (rows([0, 9, 17]), None),
        # Only the last three count: an old burst and a quiet boot are no trend.
        (rows([0, 50, 100, 100]), None),
        (rows([0, 0, 9, 18]), "rows remapped (correctable) 0 -> 9 -> 18"),
        # Any growth of what reached an application, boot after boot.
        (
            rows([0, 1, 2], "remapped_rows_uncorrectable"),
            "rows remapped (uncorrectable) 0 -> 1 -> 2",
        ),
        (rows([0, 1, 1], "remapped_rows_uncorrectable"), None),
        (
            rows([5, 6, 7], "ecc_uncorrected_aggregate"),
            "uncorrected ECC errors (lifetime) 5 -> 6 -> 7",
        ),
        # Retired pages count together: a single-bit one, then a double-bit one.
        (
            [
                {"retired_pages_sbe": 0, "retired_pages_dbe": 0},
                {"retired_pages_sbe": 1, "retired_pages_dbe": 0},
                {"retired_pages_sbe": 1, "retired_pages_dbe": 1},
            ],
            "pages retired 0 -> 1 -> 2",
        ),
        # A counter a record lacks (the driver did not offer it then) makes no trend.
        ([{"retired_pages_sbe": 0}, {}, {"retired_pages_sbe": 2}], None),
        # A count that dropped (another board's records) is no growth.
        (rows([30, 2, 11]), None),
    ],
)
def test_the_trend(boots: list[dict[str, int]], grew: str | None) -> None:
    found = trend.rising(boots)
    if grew is None:
        assert found is None
        return
    assert found is not None
    assert (found.kind, found.severity, found.action) == ("wear_rising", "warning", "drain_and_rma")
    assert found.message == (
        f"wear grew in each of the last two boots it was recorded in: {grew}: its memory is "
        "wearing out, plan to replace the GPU before the hard limits fire"
    )


def test_two_series_in_one_message() -> None:
    boots = [
        {"remapped_rows_correctable": 0, "remapped_rows_uncorrectable": 0},
        {"remapped_rows_correctable": 10, "remapped_rows_uncorrectable": 1},
        {"remapped_rows_correctable": 20, "remapped_rows_uncorrectable": 2},
    ]
    found = trend.rising(boots)
    assert found is not None
    assert (
        "(correctable) 0 -> 10 -> 20; rows remapped (uncorrectable) 0 -> 1 -> 2:" in found.message
    )


def test_the_boots_records_survive_a_restart_not_a_reboot(tmp_path: str) -> None:
    recorded = Recorded(str(tmp_path), EventLog(), boot="b1")
    assert recorded.enabled and recorded.boards == {}
    recorded.add({UUID: ("0000:18:00.0", {"remapped_rows_correctable": 3})})
    again = Recorded(str(tmp_path), EventLog(), boot="b1")
    assert again.boards == {UUID.lower(): ("0000:18:00.0", {"remapped_rows_correctable": 3})}
    assert Recorded(str(tmp_path), EventLog(), boot="b2").boards == {}
    # A hand run, or a boot not known: nothing is recorded.
    assert not Recorded(None, EventLog(), boot="b1").enabled
    assert not Recorded(str(tmp_path), EventLog(), boot="").enabled


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"boot_id": "b1"},
        {"boot_id": "b1", "boards": {UUID: {"slot": "0000:18:00.0", "counters": {"x": 1}}}},
        {"boot_id": "b1", "boards": {UUID: {"slot": 1, "counters": {}}}},
        {"boot_id": "b1", "boards": {UUID: {"slot": "s", "counters": {"retired_pages_sbe": -1}}}},
    ],
)
def test_a_bad_file_is_one_warning(tmp_path: str, data: object) -> None:
    path = os.path.join(str(tmp_path), "wear.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    log, records = recorder()
    recorded = Recorded(str(tmp_path), log, boot="b1")
    assert recorded.boards == {}
    assert recorded.error is not None and recorded.error.startswith(
        f"{path}: cannot read the boards' wear recorded this boot: "
    )
    assert [r.levelno for r in records] == [logging.WARNING]


def wear_record(boot: str, at: float, slot: str, uuid: str, **counts: int) -> bytes:
    """An agent's wear record before 0.9.0 (one a board) as the journal stores it."""
    fields = {"PCI_SLOT": slot, "GPU_UUID": uuid, **{k.upper(): str(v) for k, v in counts.items()}}
    message = {"MESSAGE": "wear at its first answer this boot"}
    return agent_line(boot, at, Event.WEAR_RECORDED, {**fields, **message})


def wear_boards_record(boot: str, at: float, wore: Mapping[str, tuple[str, Counters]]) -> bytes:
    """The agent's wear record of a read (boards by slot: UUID, counters) as the journal
    stores it."""
    (said, value), *_ = boards.records([Board(s, u, None, c) for s, (u, c) in wore.items()])
    fields = {"MESSAGE": said, boards.FIELD: value}
    return agent_line(boot, at, Event.WEAR_RECORDED, fields)


def boards_of(record: logging.LogRecord) -> dict[str, dict[str, Any]]:
    """The boards a wear record names, by slot, as its WEAR_BOARDS says."""
    return {b["pci_slot"]: b for b in json.loads(getattr(record, boards.FIELD))}


def test_recorded_once_a_boot_in_one_record(host: Host) -> None:
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    slot = host.slots[0]
    host.healthy(override={slot: {"remapped_rows.correctable": "12", "serial": "1320221034567"}})
    host.make_agent(state_directory=state)
    host.tick(3)
    assert host.wear_spawns == 1
    (line,) = host.events(Event.WEAR_RECORDED)
    assert line.getMessage() == (
        f"wear of {len(host.slots)} GPUs recorded: {slot} rows remapped (correctable) 12"
    )
    assert not hasattr(line, "PCI_SLOT") and not hasattr(line, "REMAPPED_ROWS_CORRECTABLE")
    wore = boards_of(line)
    assert sorted(wore) == sorted(host.slots)
    assert wore[slot] == {
        "pci_slot": slot,
        "gpu_uuid": replay.gpu_uuid(slot),
        "serial": "1320221034567",
        "remapped_rows_correctable": 12,
        "remapped_rows_uncorrectable": 0,
        "ecc_uncorrected_aggregate": 0,  # no retired_pages_*: [N/A] on an H200
    }
    # Short of journalctl -o json's 4096 bytes, above which it shows null without --all.
    assert len(getattr(line, boards.FIELD)) < 4096
    # A restart in the same boot neither reads nor records again.
    host.make_agent(state_directory=state)
    host.tick(3)
    assert host.wear_spawns == 1 and len(host.events(Event.WEAR_RECORDED)) == 1


def test_a_hand_run_records_nothing(host: Host) -> None:
    host.healthy()
    host.make_agent()
    host.tick(3)
    assert host.wear_spawns == 0 and host.events(Event.WEAR_RECORDED) == []


def test_a_field_the_driver_rejects_is_asked_without(host: Host) -> None:
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    host.healthy(reject=["remapped_rows.correctable"])
    host.make_agent(state_directory=state)
    host.tick(3)
    assert host.wear_spawns == 2 and host.events(Event.WEAR_READ_FAILED) == []
    (line,) = host.events(Event.WEAR_RECORDED)
    board = boards_of(line)[host.slots[0]]
    assert "remapped_rows_correctable" not in board
    assert board["remapped_rows_uncorrectable"] == 0


def test_a_cell_nvidia_smi_could_not_read_leaves_that_counter_out(host: Host) -> None:
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    host.healthy(override={host.slots[0]: {"remapped_rows.correctable": "[Unknown Error]"}})
    host.make_agent(state_directory=state)
    host.tick(3)
    assert host.events(Event.WEAR_READ_FAILED) == []
    (line,) = host.events(Event.WEAR_RECORDED)
    wore = boards_of(line)
    assert len(wore) == len(host.slots)  # the others' counters are whole
    assert "remapped_rows_correctable" not in wore[host.slots[0]]
    assert wore[host.slots[1]]["remapped_rows_correctable"] == 0


def test_a_failing_read_is_one_warning_and_sampling_goes_on(host: Host) -> None:
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    host.healthy(override={host.slots[0]: {"remapped_rows.correctable": "lots"}})
    host.make_agent(state_directory=state)
    snap = host.tick(8).state
    assert all(g["health"] == "ok" for g in snap["gpus"])
    (line,) = host.events(Event.WEAR_READ_FAILED)
    assert line.getMessage().startswith(
        "boards' wear not read: nvidia-smi --query-gpu=pci.bus_id,remapped_rows.correctable,"
    )
    assert line.getMessage().endswith(
        f"line 1 ({replay.bus_id(host.slots[0])}): remapped_rows.correctable is not a count: 'lots'"
    )
    assert 3 <= host.wear_spawns < 8  # the probe's backoff, not every tick
    host.healthy()
    host.tick(20)
    (back,) = host.events(Event.WEAR_READ_RECOVERED)
    assert back.getMessage() == "boards' wear read again"
    (line,) = host.events(Event.WEAR_RECORDED)
    assert len(boards_of(line)) == len(host.slots)


def test_no_record_where_no_board_offers_a_counter(host: Host) -> None:
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    none = dict.fromkeys(counters.FIELDS, "[N/A]")
    host.healthy(override=dict.fromkeys(host.slots, none))
    host.make_agent(state_directory=state)
    host.tick(3)
    assert host.wear_spawns == 1 and host.events(Event.WEAR_RECORDED) == []


def test_wear_grown_in_each_of_the_last_two_boots(host: Host, make: Any) -> None:
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    slot, other = host.slots[0], host.slots[1]
    sick, well = replay.gpu_uuid(slot), replay.gpu_uuid(other)
    journal = make(f"kernel: boot A\n#@boot {B}\nkernel: boot B\n", boot=A)
    # Boot A's agent (0.8.0) wrote a record a board.
    append(
        journal,
        wear_record(A, 1_700_000_100, slot, sick, remapped_rows_correctable=2)
        + wear_record(A, 1_700_000_101, other, well, remapped_rows_correctable=2)
        # A second record in a boot (an older agent's restart) is not another boot.
        + wear_record(A, 1_700_000_200, slot, sick, remapped_rows_correctable=5),
    )
    # Boot B's agent (0.9.0) wrote one record naming both boards.
    wore = {slot: (sick, {"remapped_rows_correctable": 14})}
    wore[other] = (well, {"remapped_rows_correctable": 3})
    append(journal, wear_boards_record(B, 1_700_086_500, wore))
    cells = {"remapped_rows.correctable": "27"}
    host.healthy(override={slot: cells, other: {"remapped_rows.correctable": "30"}})
    host.make_agent(state_directory=state, journal_directory=journal, history_days=3650)
    for _ in range(4):
        st = host.tick().state
    gpus = {g["pci_slot"]: g for g in st["gpus"]}
    (p,) = gpus[slot]["problems"]
    assert (p["kind"], p["severity"], p["action"]) == ("wear_rising", "warning", "drain_and_rma")
    assert "rows remapped (correctable) 2 -> 14 -> 27" in p["message"]
    # The other board grew by 27 this boot, but not in the boot before: no trend.
    assert gpus[other]["problems"] == []
    (start,) = host.events(Event.PROBLEM_WEAR_RISING)
    assert start.levelno == logging.WARNING
    # A restart holds it (restated, no new start, no end while the earlier boots are read).
    host.make_agent(state_directory=state, journal_directory=journal, history_days=3650)
    for _ in range(4):
        st = host.tick().state
    assert len(host.events(Event.PROBLEM_WEAR_RISING)) == 1
    ended = [
        r for r in host.events(Event.PROBLEM_CLEARED) if getattr(r, "PROBLEM", "") == "wear_rising"
    ]
    assert ended == []
    (p,) = next(g for g in st["gpus"] if g["pci_slot"] == slot)["problems"]
    assert p["kind"] == "wear_rising"
    conf = os.path.join(host.dir, "h.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(f'journal_directory = "{journal}"\n')
    res = CliRunner(mix_stderr=False).invoke(
        main, ["--config", conf, "history", slot, "--days", "100000"]
    )
    assert res.exit_code == 0, res.stderr
    wear = [ln for ln in res.stdout.splitlines() if " wear " in ln]
    assert [ln.split(" wear ", 1)[1].strip() for ln in wear] == [
        "rows remapped (correctable) 2",
        "rows remapped (correctable) 5 (+3)",
        "rows remapped (correctable) 14 (+9)",
    ]
    res = CliRunner(mix_stderr=False).invoke(
        main, ["--config", conf, "history", slot, "--days", "100000", "--json"]
    )
    steps = [s for s in json.loads(res.stdout) if s["event"] == "wear"]
    assert [(s["boot"], s["uuid"], s["wear"]) for s in steps] == [
        (A, sick, {"remapped_rows_correctable": 2}),
        (A, sick, {"remapped_rows_correctable": 5}),
        (B, sick, {"remapped_rows_correctable": 14}),
    ]


def test_the_timeline_reads_a_record() -> None:
    entry = {
        "_SYSTEMD_UNIT": b"gpuagent.service",
        "MESSAGE_ID": Event.WEAR_RECORDED.value.encode(),
        "PCI_SLOT": b"0000:18:00.0",
        "GPU_UUID": UUID.encode(),
        "RETIRED_PAGES_SBE": b"4",
        "RETIRED_PAGES_DBE": b"x",
    }
    (step,) = timeline.steps("b1", 1.0, entry, {}, set())
    assert (step.event, step.uuid, step.wear) == ("wear", UUID, {"retired_pages_sbe": 4})
    assert all(name.upper() in timeline.FIELDS for name in counters.FIELDS.values())


def test_the_timeline_reads_a_record_of_boards() -> None:
    other = "GPU-99999999-2222-3333-4444-555555555555"
    wore = [
        Board("0000:18:00.0", UUID, "1320221034567", {"remapped_rows_correctable": 3}),
        # A board named by its slot only: the driver's UUID line of its boot names it.
        Board("0000:2a:00.0", "", None, {"retired_pages_sbe": 0}),
    ]
    ((_, value),) = boards.records(wore)
    entry = {
        "_SYSTEMD_UNIT": b"gpuagent.service",
        "MESSAGE_ID": Event.WEAR_RECORDED.value.encode(),
        boards.FIELD: value.encode(),
    }
    got = timeline.steps("b1", 1.0, entry, {"0000:2a:00": other}, set())
    assert [(s.event, s.pci_slot, s.uuid, s.wear) for s in got] == [
        ("wear", "0000:18:00.0", UUID, {"remapped_rows_correctable": 3}),
        ("wear", "0000:2a:00.0", other, {"retired_pages_sbe": 0}),
    ]
    assert boards.FIELD in timeline.FIELDS
    # Another unit's record of the same shape is no step.
    assert timeline.steps("b1", 1.0, {**entry, "_SYSTEMD_UNIT": b"x.service"}, {}, set()) == []


def board(n: int, **counts: int) -> Board:
    return Board(f"0000:{n:02x}:00.0", f"GPU-{n:08x}-2222-3333-4444-555555555555", None, counts)


@pytest.mark.parametrize(
    ("wore", "said"),
    [
        ([board(1, remapped_rows_correctable=0)], "wear of 1 GPU recorded: every counter 0"),
        (
            [board(1, retired_pages_sbe=0), board(2, retired_pages_sbe=4, retired_pages_dbe=0)],
            "wear of 2 GPUs recorded: 0000:02:00.0 pages retired (single-bit) 4",
        ),
        (
            [board(n, remapped_rows_correctable=n) for n in range(1, 9)],
            "wear of 8 GPUs recorded: 0000:01:00.0 rows remapped (correctable) 1; "
            "0000:02:00.0 rows remapped (correctable) 2; "
            "0000:03:00.0 rows remapped (correctable) 3; 5 more above 0",
        ),
    ],
)
def test_the_records_message(wore: list[Board], said: str) -> None:
    assert boards.message(wore) == said
    ((message, _),) = boards.records(wore)
    assert message == said


def test_a_record_round_trips_and_larger_hosts_take_a_few() -> None:
    assert boards.records([]) == []
    wore = [board(n, remapped_rows_correctable=n, ecc_uncorrected_aggregate=0) for n in range(40)]
    got = boards.records(wore)
    assert len(got) == 3  # 16, 16 and 8 boards
    assert [b for _, value in got for b in boards.read(value)] == wore
    assert got[2][0].startswith("wear of 8 GPUs recorded: ")
    # The longest a record can be is read back whole.
    big = 10**20 - 1
    long = "x" * 100
    worst = [
        Board(long, long, long, dict.fromkeys(counters.FIELDS.values(), big))
        for _ in range(boards.BOARDS_MAX)
    ]
    ((_, value),) = boards.records(worst)
    assert len(value) <= boards.FIELD_MAX
    cut = "x" * boards.TEXT_MAX
    assert boards.read(value) == [Board(cut, cut, cut, worst[0].counts)] * boards.BOARDS_MAX


GOOD = {"pci_slot": "0000:18:00.0", "gpu_uuid": UUID, "remapped_rows_correctable": 3}


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("", 0),
        ("not json", 0),
        ("[" * 100_000, 0),  # past FIELD_MAX
        ("[" * 5000 + "]" * 5000, 0),  # deeper than the parser goes
        (json.dumps(GOOD), 0),  # not a list
        ("[" + "1" * 5000 + "]", 0),  # more digits than int() takes
        (json.dumps([GOOD, 3, "x", None, []]), 1),
        (json.dumps([GOOD] * (boards.BOARDS_MAX + 5)), boards.BOARDS_MAX),
        (json.dumps([{**GOOD, "pci_slot": 7}]), 0),
        (json.dumps([{**GOOD, "pci_slot": ""}]), 0),
        (json.dumps([{**GOOD, "pci_slot": "0" * 65}]), 0),
        (json.dumps([{**GOOD, "gpu_uuid": None}]), 0),
        (json.dumps([{**GOOD, "gpu_uuid": "G" * 65}]), 0),
        (json.dumps([{**GOOD, "remapped_rows_correctable": True}]), 0),
        (json.dumps([{**GOOD, "remapped_rows_correctable": -1}]), 0),
        (json.dumps([{**GOOD, "remapped_rows_correctable": 10**20}]), 0),
        (json.dumps([{**GOOD, "remapped_rows_correctable": "3"}]), 0),
        (json.dumps([{**GOOD, "remapped_rows_correctable": 1.5}]), 0),
    ],
)
def test_what_a_record_of_boards_holds_is_bounded(value: str, kept: int) -> None:
    assert len(boards.read(value)) == kept


def test_a_record_of_boards_keeps_what_it_knows() -> None:
    item = {**GOOD, "serial": 12, "later": [1], "retired_pages_sbe": 10**20 - 1}
    (got,) = boards.read(json.dumps([item]))
    assert got == Board(
        "0000:18:00.0",
        UUID,
        None,
        {"remapped_rows_correctable": 3, "retired_pages_sbe": 10**20 - 1},
    )


def answered(slots: list[str]) -> Tick:
    """A tick on which nvidia-smi answered for the GPUs in ``slots`` (the driver's UUIDs)."""
    probe = ProbeView(
        state=ProbeState.OK,
        binary="/usr/bin/nvidia-smi",
        samples=SamplesView(fresh=frozenset(slots)),
    )
    uuids = {s: replay.gpu_uuid(s) for s in slots}
    bus = BusView(tuple(PciGpu(s, "0x2335", "0x030200", "nvidia") for s in slots))
    return Tick(0.0, 0.0, Config(), bus=bus, probe=probe, kernel=KernelView(uuids=uuids))


def test_a_board_whose_row_the_answers_lack_is_asked_for_a_few_times(tmp_path: str) -> None:
    slots = ["0000:18:00.0", "0000:2a:00.0"]
    # One GPU's error instead of the second board's row, read after read.
    runner = Answers(
        "00000000:18:00.0, 3, 0, [N/A], [N/A], 0\n"
        "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error\n"
    )
    source = WearSource(Config(), runner, EventLog(), state_directory=str(tmp_path), boot="b1")
    tick = answered(slots)
    for _ in range(MISSES + 5):
        source.step(tick)
    assert runner.runs == MISSES
    assert set(source.recorded.boards) == {replay.gpu_uuid(slots[0]).lower()}


class Rejects(Runner):
    """A driver that knows none of the wear fields: each read is rejected, exit 2, naming the
    first field it asks for."""

    def __init__(self) -> None:
        super().__init__(timeout=10.0)
        self.runs = 0

    def run(self, argv: list[str], env: Mapping[str, str] | None = None) -> RunResult:
        self.runs += 1
        first = argv[1].split("=", 1)[1].split(",")[1]
        return RunResult(Outcome.EXITED, 2, f'Field "{first}" is not a valid field to query.\n\n')


def test_a_driver_that_rejects_every_field_says_so_once(tmp_path: str) -> None:
    slots = ["0000:18:00.0"]
    runner = Rejects()
    log, records = recorder()
    source = WearSource(Config(), runner, log, state_directory=str(tmp_path), boot="b1")
    tick = answered(slots)
    for _ in range(len(counters.FIELDS) + 5):
        source.step(tick)
    assert runner.runs == len(counters.FIELDS)
    assert [r.getMessage() for r in records] == [
        "boards' wear not read: this driver rejects every wear field, the last "
        "ecc.errors.uncorrected.aggregate.total"
    ]
    assert source.recorded.boards == {}
