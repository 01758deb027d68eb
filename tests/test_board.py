"""The board in each slot: serials from nvidia-smi (pure, from real captures), remembered in
gpus.json, a replacement told once and its slot's recurrence started afresh; on a fake host
whose nvidia-smi answers the serials query from the capture."""

from __future__ import annotations

import csv
import json
import logging
import os
import time
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent.commands.cli import main
from gpuagent.edges import bootid
from gpuagent.logs import Event, EventLog
from gpuagent.sources.board import serials
from gpuagent.sources.bus.known import DEPARTED, KnownGpus, boards_with
from gpuagent.sources.kernel.recurrence import Hit, Recurrence
from gpuagent.views import Finding
from tests import fakesysfs
from tests.conftest import Host
from tests.test_earlier import A, B, agent_line, agent_problem
from tests.test_kernlog import append, make

__all__ = ["make"]  # the fixture

CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus", "csv")
OLD = "GPU-11111111-2222-3333-4444-555555555555"
NEW = "GPU-99999999-8888-7777-6666-555555555555"


def captured(name: str) -> str:
    """The capture's bus ids and serials as ``--query-gpu=pci.bus_id,serial`` prints them."""
    with open(os.path.join(CSV, name), encoding="utf-8") as f:
        rows = list(csv.reader(f, skipinitialspace=True))
    head = [h.strip() for h in rows[0]]
    bus, serial = head.index("pci.bus_id"), head.index("serial")
    return "".join(f"{r[bus]}, {r[serial]}\n" for r in rows[1:])


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # A collector masked the H200's serial with zeros; a GeForce has none.
        ("h200-linux-driver590.48.01-load-query-gpu-all-fields.csv", {"0000:83:00.0": None}),
        ("rtx2080super-linux-driver465.27-query-gpu-115fields.csv", {"0000:0c:00.0": None}),
    ],
)
def test_serials_of_real_captures(name: str, expected: dict[str, str | None]) -> None:
    assert serials.parse(captured(name)) == expected


def test_a_serial_and_the_forms_that_are_none() -> None:
    text = (
        "00000000:18:00.0, 1320221034567\n"
        "00000000:2A:00.0, [N/A]\n"
        "00000000:3a:00.0, 0000000000000\n"
        "\n"
        "00000000:5d:00.0, \n"
        "WARNING: infoROM is corrupted at gpu 0000:00:1E.0\n"
        "Unable to determine the device handle for GPU0000:07:00.0: Unknown Error\n"
    )
    assert serials.parse(text) == {
        "0000:18:00.0": "1320221034567",
        "0000:2a:00.0": None,
        "0000:3a:00.0": None,
        "0000:5d:00.0": None,
    }


@pytest.mark.parametrize("line", ["Unknown Error", "00000000:18:00.0, 1, 2", "x, 1"])
def test_a_line_that_is_no_answer_says_which(line: str) -> None:
    with pytest.raises(ValueError, match="line 1 is not 'BUS_ID, SERIAL'"):
        serials.parse(line + "\n")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "no answer"),
        (
            "Unable to determine the device handle for GPU0000:07:00.0: Unknown Error\n",
            "no GPU's row",
        ),
    ],
)
def test_an_answer_without_a_row_is_none(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        serials.parse(text)


def test_the_file_keeps_the_serial_and_a_new_uuid_is_a_swap(tmp_path: str) -> None:
    known = KnownGpus(str(tmp_path), EventLog(), "b1")
    slot = "0000:18:00.0"
    assert known.update({slot: {"uuid": OLD, "name": "H200", "serial": "1320221034567"}}) == []
    # The serial not read yet on a tick: the one remembered stays.
    assert known.update({slot: {"uuid": OLD, "name": "H200", "serial": None}}) == []
    assert known.gpus[slot]["serial"] == "1320221034567"
    # Another UUID while the slot never left the bus: inconsistent input, no swap.
    (odd,) = known.update({slot: {"uuid": NEW, "name": "H200", "serial": None}})
    assert (odd.real, known.gpus[slot]["uuid"], known.departed) == (False, OLD, [])
    # A reboot later (the board last seen in boot b1): a swap.
    known = KnownGpus(str(tmp_path), EventLog(), "b2")
    (swap,) = known.update({slot: {"uuid": NEW, "name": "H200", "serial": None}})
    assert swap.real
    assert (swap.slot, swap.old["uuid"], swap.old["serial"], swap.new["uuid"]) == (
        slot,
        OLD,
        "1320221034567",
        NEW,
    )
    # The new board does not inherit the old one's serial; said once.
    assert known.gpus[slot]["serial"] is None and known.gpus[slot]["uuid"] == NEW
    assert known.update({slot: {"uuid": NEW, "name": "H200", "serial": "1320221099999"}}) == []
    again = KnownGpus(str(tmp_path), EventLog(), "b3")
    assert again.gpus[slot]["serial"] == "1320221099999"
    path = os.path.join(str(tmp_path), "gpus.json")
    assert boards_with(path, "1320221099999") == {NEW}
    # The board replaced out of the slot is remembered with its serial.
    assert boards_with(path, "1320221034567") == {OLD}
    assert known.departed == [
        {"pci_slot": slot, "uuid": OLD, "serial": "1320221034567", "at": None, "boot": "b2"}
    ]


def test_an_older_agents_file_without_serials_is_read(tmp_path: str) -> None:
    with open(os.path.join(str(tmp_path), "gpus.json"), "w", encoding="utf-8") as f:
        json.dump({"gpus": [{"pci_slot": "0000:18:00.0", "uuid": OLD, "name": "H200"}]}, f)
    known = KnownGpus(str(tmp_path), EventLog(), "b1")
    assert known.gpus["0000:18:00.0"]["serial"] is None and known.error is None


XID79 = Finding("xid", "critical", "reboot", "Xid 79: reboot", (("xid", 79),))


def test_a_swap_ends_the_slots_past_not_the_boards() -> None:
    r = Recurrence(needed=2)
    slot = "0000:18:00.0"
    r.add(Hit("b1", 100.0, slot, None, "xid", 79))  # a board without a UUID line
    r.add(Hit("b2", 200.0, slot, OLD, "xid", 79))
    assert len(r.boots(slot, None, "xid", 79)) == 2
    r.swap(300.0, slot)
    assert r.boots(slot, None, "xid", 79) == []
    assert r.escalate(slot, NEW, XID79) == XID79
    # The new board's own past elsewhere (its UUID) still counts.
    r.add(Hit("b3", 150.0, "0000:2a:00.0", NEW, "xid", 79))
    r.add(Hit("b4", 250.0, "0000:2a:00.0", NEW, "xid", 79))
    assert r.escalate(slot, NEW, XID79).action == "drain_and_rma"
    # Hits after the swap count as any.
    r.add(Hit("b5", 400.0, slot, None, "xid", 79))
    assert len(r.boots(slot, None, "xid", 79)) == 1


def old_board(host: Host) -> tuple[str, str]:
    """The first slot's board (OLD, its serial) seen for 3 ticks by an agent remembering in
    a state directory; the slot and the directory."""
    slot = host.slots[0]
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    host.healthy(override={slot: {"uuid": OLD, "serial": "1320221034567"}})
    host.make_agent(state_directory=state)
    host.tick(3)
    return slot, state


def test_a_replaced_board_on_the_host(host: Host) -> None:
    slot, state = old_board(host)
    assert host.serials_spawns == 1  # once, not each tick
    with open(os.path.join(state, "gpus.json"), encoding="utf-8") as f:
        kept = {g["pci_slot"]: g for g in json.load(f)["gpus"]}
    assert (kept[slot]["uuid"], kept[slot]["serial"]) == (OLD, "1320221034567")
    assert kept[host.slots[1]]["serial"] is None  # the capture's masked zeros
    assert host.events(Event.BOARD_REPLACED) == []
    # The board is replaced (a reboot later: a new agent, the file remembered).
    host.healthy(override={slot: {"uuid": NEW, "serial": "1320221099999"}})
    host.make_agent(state_directory=state, boot=lambda: "b" * 32)
    host.tick(3)
    (line,) = host.events(Event.BOARD_REPLACED)
    assert line.getMessage() == (
        f"GPU {slot}: board replaced: {OLD} (serial 1320221034567) -> {NEW} (serial "
        "1320221099999); its slot's recurrence starts afresh"
    )
    names = ("PCI_SLOT", "GPU_UUID", "OLD_UUID", "OLD_SERIAL", "NEW_SERIAL")
    assert {k: getattr(line, k, None) for k in names} == {
        "PCI_SLOT": slot,
        "GPU_UUID": NEW,
        "OLD_UUID": OLD,
        "OLD_SERIAL": "1320221034567",
        "NEW_SERIAL": "1320221099999",
    }
    with open(os.path.join(state, "gpus.json"), encoding="utf-8") as f:
        kept = {g["pci_slot"]: g for g in json.load(f)["gpus"]}
    assert (kept[slot]["uuid"], kept[slot]["serial"]) == (NEW, "1320221099999")
    # Said once: a restart reads the file with the new board.
    host.make_agent(state_directory=state, boot=lambda: "b" * 32)
    host.tick(2)
    assert len(host.events(Event.BOARD_REPLACED)) == 1


def test_a_failing_serials_read_is_one_warning_and_sampling_goes_on(host: Host) -> None:
    host.healthy(reject=["serial"])
    host.make_agent()
    snap = host.tick(8).state
    assert all(g["health"] == "ok" for g in snap["gpus"])
    (line,) = host.events(Event.BOARD_READ_FAILED)
    assert line.getMessage().startswith(
        "boards' serial numbers not read: nvidia-smi --query-gpu=pci.bus_id,serial "
    )
    # Retried with the probe's backoff, not every tick.
    assert 3 <= host.serials_spawns < 8
    host.healthy()
    host.tick(20)
    (back,) = host.events(Event.BOARD_READ_RECOVERED)
    assert back.getMessage() == "boards' serial numbers read again"


@pytest.mark.parametrize("replaced", [True, False])
def test_a_replaced_board_does_not_inherit_its_slots_recurrence(
    host: Host, make: Any, replaced: bool
) -> None:
    """Earlier boots' problem lines of the slot name no UUID (an older agent's): only the
    replacement says they were another board's, from the first tick on."""
    slot = host.slots[0]
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    with open(os.path.join(state, "gpus.json"), "w", encoding="utf-8") as f:
        json.dump({"gpus": [{"pci_slot": slot, "uuid": OLD, "name": "H200"}]}, f)
    journal = make(f"kernel: boot A\n#@boot {B}\nkernel: boot B\n", boot=A)
    append(journal, agent_problem(A, 1_700_000_100, slot) + agent_problem(B, 1_700_086_500, slot))
    board = NEW if replaced else OLD
    host.healthy(override={slot: {"uuid": board, "gpu_recovery_action": "Reset"}})
    host.make_agent(state_directory=state, journal_directory=journal, history_days=3650)
    actions = set()
    for _ in range(4):
        st = host.tick().state
        (p,) = next(g for g in st["gpus"] if g["pci_slot"] == slot)["problems"]
        actions.add(p["action"])
    assert st["history"] == "2 earlier boots"
    assert actions == ({"reset_gpu"} if replaced else {"drain_and_rma"})
    assert len(host.events(Event.BOARD_REPLACED)) == (1 if replaced else 0)


def test_a_replacement_in_an_earlier_boot_ends_the_slots_past_there(host: Host, make: Any) -> None:
    slot = host.slots[0]
    journal = make(f"kernel: boot A\n#@boot {B}\nkernel: boot B\n", boot=A)
    boards = {"GPU_UUID": NEW, "OLD_UUID": OLD, "OLD_SERIAL": "1320221034567"}
    fields = {"PCI_SLOT": slot, **boards, "MESSAGE": "GPU: board replaced"}
    swap = agent_line(B, 1_700_086_400, Event.BOARD_REPLACED, fields, mono=4_000_000)
    append(journal, agent_problem(A, 1_700_000_100, slot) + swap)
    append(journal, agent_problem(B, 1_700_086_500, slot))
    host.healthy(override={slot: {"gpu_recovery_action": "Reset"}})
    host.make_agent(journal_directory=journal, history_days=3650)
    host.tick()
    st = host.tick().state
    (p,) = next(g for g in st["gpus"] if g["pci_slot"] == slot)["problems"]
    # Boot A's hit was the old board's: one earlier boot is not recurrence.
    assert p["action"] == "reset_gpu"
    conf = os.path.join(host.dir, "h.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(f'journal_directory = "{journal}"\n')
    res = CliRunner(mix_stderr=False).invoke(
        main, ["--config", conf, "history", slot, "--days", "100000"]
    )
    assert f"{slot}  board_replaced {OLD} (serial 1320221034567) -> {NEW}\n" in res.stdout
    res = CliRunner(mix_stderr=False).invoke(
        main, ["--config", conf, "history", "1320221034567", "--days", "100000", "--json"]
    )
    assert res.exit_code == 0, res.stderr
    events = [(s["event"], s["boot"][:4]) for s in json.loads(res.stdout)]
    assert ("board_replaced", B[:4]) in events
    res = CliRunner(mix_stderr=False).invoke(
        main, ["--config", conf, "history", "9999999999999", "--days", "100000"]
    )
    assert res.exit_code == 1
    assert "no board with serial 9999999999999 in " in res.stderr


@pytest.mark.parametrize(
    "uuid",
    # The same board, or the same board (its serial) after a repair that gave it another GPU.
    [OLD, "GPU-77777777-8888-9999-aaaa-bbbbbbbbbbbb"],
)
def test_a_board_back_from_rma_that_fails_again_says_so(host: Host, uuid: str) -> None:
    slot, other = host.slots[0], host.slots[1]
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    host.healthy(override={slot: {"uuid": OLD, "serial": "1320221034567"}})
    host.make_agent(state_directory=state)
    host.tick(3)
    # Sent for RMA: another board in its slot, after a reboot.
    host.healthy(override={slot: {"uuid": NEW, "serial": "1320221099999"}})
    host.make_agent(state_directory=state, boot=lambda: "b" * 32)
    host.tick(3)
    assert len(host.events(Event.BOARD_REPLACED)) == 1
    # Back from the RMA, in another slot, and failing: its problem says it was here before.
    back = {"uuid": uuid, "serial": "1320221034567", "gpu_recovery_action": "Reset"}
    host.healthy(override={slot: {"uuid": NEW}, other: back})
    host.make_agent(state_directory=state, boot=lambda: "c" * 32)
    st = host.tick(3).state
    (p,) = next(g for g in st["gpus"] if g["pci_slot"] == other)["problems"]
    assert p["kind"] == "recovery_action"
    assert p["message"].endswith(
        f"; this board (serial 1320221034567) is back: it was replaced in {slot} on "
        + time.strftime("%Y-%m-%d")
    )
    (start,) = host.events(Event.PROBLEM_RECOVERY_ACTION)
    assert f": {p['message']}; action: reset_gpu" in start.getMessage()
    # The board that stayed says nothing of the kind.
    assert next(g for g in st["gpus"] if g["pci_slot"] == slot)["problems"] == []


def test_a_full_memory_of_departed_boards_still_tells_the_newest(host: Host) -> None:
    """One agent throughout, the file already holding as many departed boards as it keeps:
    the newest departure is known when its board comes back, the oldest is forgotten."""
    slot, other = host.slots[0], host.slots[1]
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    departed = [
        {
            "pci_slot": slot,
            "uuid": f"GPU-{n:08x}-0000-0000-0000-000000000000",
            "serial": f"9{n}",
            "at": 1.7e9,
        }
        for n in range(DEPARTED)
    ]
    with open(os.path.join(state, "gpus.json"), "w", encoding="utf-8") as f:
        json.dump({"gpus": [], "departed": departed}, f)
    host.healthy(override={slot: {"uuid": OLD, "serial": "1320221034567"}})
    host.make_agent(state_directory=state)
    host.tick(3)
    # Hot-plugged out and another board in: the slot left the bus, so a swap.
    fakesysfs.remove_device(host.root, slot)
    host.healthy(slots=host.slots[1:])
    host.tick()
    fakesysfs.add_device(
        host.root, slot, fakesysfs.NVIDIA, fakesysfs.H200, fakesysfs.CLASS_3D, "nvidia"
    )
    host.healthy(override={slot: {"uuid": NEW, "serial": "1320221099999"}})
    host.tick(3)
    assert len(host.events(Event.BOARD_REPLACED)) == 1
    back = {"uuid": OLD, "serial": "1320221034567", "gpu_recovery_action": "Reset"}
    oldest = {"uuid": departed[0]["uuid"], "serial": "90", "gpu_recovery_action": "Reset"}
    host.healthy(override={slot: {"uuid": NEW}, other: back, host.slots[2]: oldest})
    st = host.tick(3).state
    messages = {g["pci_slot"]: [p["message"] for p in g["problems"]] for g in st["gpus"]}
    (said,) = messages[other]
    assert said.endswith(
        f"; this board (serial 1320221034567) is back: it was replaced in {slot} on "
        + time.strftime("%Y-%m-%d")
    )
    (said,) = messages[host.slots[2]]
    assert "is back" not in said


def test_another_uuid_in_a_slot_that_never_left_the_bus_is_no_swap(host: Host) -> None:
    """The sick demo's story (issue 39): one slot, two UUIDs within one boot, the slot on the
    bus throughout.  No board can have been swapped: one warning, no swap, no "back"."""
    slot, state = old_board(host)
    host.healthy(override={slot: {"uuid": NEW, "gpu_recovery_action": "Reset"}})
    st = host.tick(3).state
    assert host.events(Event.BOARD_REPLACED) == []
    (odd,) = host.events(Event.BOARD_UUID_INCONSISTENT)
    assert odd.levelno == logging.WARNING
    assert odd.getMessage().startswith(f"GPU {slot}: reads UUID {NEW} where its board had {OLD}")
    (p,) = next(g for g in st["gpus"] if g["pci_slot"] == slot)["problems"]
    assert "is back" not in p["message"]
    with open(os.path.join(state, "gpus.json"), encoding="utf-8") as f:
        kept = json.load(f)
    assert kept["departed"] == []
    assert next(g for g in kept["gpus"] if g["pci_slot"] == slot)["uuid"] == OLD
    # A restart in the same boot: still no swap, and said once more (a new agent's line).
    host.make_agent(state_directory=state)
    host.tick(3)
    assert host.events(Event.BOARD_REPLACED) == []


def test_boards_that_only_moved_slots_are_not_back(host: Host) -> None:
    """Two boards swapped between slots (to see whether a fault follows the board), or the
    buses renumbered: each slot has another board, and neither board left the host."""
    slot, other = host.slots[0], host.slots[1]
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    a = {"uuid": OLD, "serial": "111"}
    b = {"uuid": NEW, "serial": "222"}
    host.healthy(override={slot: a, other: b})
    host.make_agent(state_directory=state)
    host.tick(3)
    host.healthy(override={slot: b, other: {**a, "gpu_recovery_action": "Reset"}})
    st = host.tick(3).state
    (p,) = next(g for g in st["gpus"] if g["pci_slot"] == other)["problems"]
    assert "is back" not in p["message"]
    with open(os.path.join(state, "gpus.json"), encoding="utf-8") as f:
        assert json.load(f)["departed"] == []


def test_a_departure_time_no_date_can_be_made_of_is_a_bad_file(tmp_path: str) -> None:
    for at in (1e20, -1.0, True):
        with open(os.path.join(str(tmp_path), "gpus.json"), "w", encoding="utf-8") as f:
            json.dump({"gpus": [], "departed": [{"pci_slot": "0000:18:00.0", "at": at}]}, f)
        known = KnownGpus(str(tmp_path), EventLog(), "b1")
        assert known.departed == [] and known.error is not None
        assert known.error.endswith("departed[0]: at must be a number or null"), known.error


FELL_OFF_AT_PROBE = (
    "NVRM: The NVIDIA GPU 0000:18:00.0\n"
    " NVRM: (PCI ID: 10de:2335) installed in this system has\n"
    " NVRM: fallen off the bus and is not responding to commands.\n"
)


@pytest.mark.parametrize("replaced", [True, False])
def test_a_swap_survives_a_restart_in_its_boot_and_no_tick_judges_before_it(
    host: Host, make: Any, replaced: bool
) -> None:
    """Issue 30's promise, tried (issue 39): two earlier boots' probe-time "fallen off the bus"
    records (xid-79-driver570-open-multiline-no-xid's shape, moved to the slot) name only the
    slot, and so does this boot's.  A board replaced at this boot's start is judged as the
    new board from the first tick on, and after a restart in the same boot too; the board
    that stayed asks for its RMA."""
    slot = host.slots[0]
    state = os.path.join(host.dir, "state")
    os.makedirs(state)
    with open(os.path.join(state, "gpus.json"), "w", encoding="utf-8") as f:
        json.dump({"gpus": [{"pci_slot": slot, "uuid": OLD, "name": "H200", "boot": A}]}, f)
    now = bootid.current()
    journal = make(
        f"{FELL_OFF_AT_PROBE}#@boot {B}\n{FELL_OFF_AT_PROBE}#@boot {now}\n{FELL_OFF_AT_PROBE}",
        boot=A,
        start=time.time() - 3 * 86400,
    )
    host.healthy(override={slot: {"uuid": NEW if replaced else OLD}})
    actions: set[str] = set()
    for _ in range(2):  # an agent, then a restart in the same boot
        host.make_agent(state_directory=state, journal_directory=journal, history_days=3650)
        for _ in range(3):
            st = host.tick().state
            xid = [p for g in st["gpus"] if g["pci_slot"] == slot for p in g["problems"]]
            actions.update(p["action"] for p in xid if p["kind"] == "xid")
    told = {r.ACTION for r in host.events(Event.XID_PROBLEM)}  # type: ignore[attr-defined]
    if replaced:
        assert actions == told == {"reboot"}
        assert len(host.events(Event.BOARD_REPLACED)) == 1
    else:
        assert "drain_and_rma" in actions
