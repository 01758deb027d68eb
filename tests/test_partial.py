"""One GPU missing from nvidia-smi stops only its own reads (issue 28): NVLink and the
processes go on for the GPUs that answer, and what was last read of the missing one is stale
in the state and in ``gpuagent status``, never shown as current.  The fake host replays the
H200 captures (8 GPUs) with one GPU left out of every answer, as a GPU that fell off the
driver is (:mod:`gpuagent.sources.partial`, and its pure helpers below)."""

from __future__ import annotations

from typing import Any

from gpuagent.commands import statusrows, statustext
from gpuagent.schema import GpuEntry, State
from gpuagent.sources import partial
from gpuagent.views import BusView, PciGpu
from tests import fakesysfs
from tests.conftest import Host

STATUS = "nvlink-status-h200-driver590.48.01-18-links.txt"
COUNTERS = "nvlink-errorcounters-h100-80gb-hbm3-driverUNKNOWN-placeholder-uuid-TRIMMED.txt"
STALE = "STALE, read before nvidia-smi stopped reporting the GPU"


def entry(state: State, slot: str) -> GpuEntry:
    return next(g for g in state["gpus"] if g["pci_slot"] == slot)


def answer(host: Host, slots: list[str], apps: list[dict[str, Any]]) -> None:
    nvlink = {"status": STATUS, "errorcounters": COUNTERS}
    host.healthy(slots=slots, nvlink=nvlink, apps=apps)


def test_the_other_gpus_are_read_on_and_the_missing_ones_reads_are_stale(host: Host) -> None:
    gone, other = host.slots[0], host.slots[1]
    answer(
        host,
        host.slots,
        [
            {"slot": gone, "pid": 4242, "name": "python3", "mib": 40960},
            {"slot": other, "pid": 5151, "name": "python3", "mib": 2048},
        ],
    )
    host.make_agent(nvlink_interval=10.0)
    before = host.tick(2).state
    assert "stale" not in entry(before, gone)["nvlink"]
    assert [p["pid"] for p in entry(before, gone)["processes"]] == [4242]

    # The first GPU falls off nvidia-smi; a new job starts on the second.
    answer(host, host.slots[1:], [{"slot": other, "pid": 6262, "name": "trainer", "mib": 8192}])
    spawns = (host.nvlink_spawns, host.apps_spawns)
    state = host.tick(2).state
    assert state["missing"] == [gone]
    # Both reads went on, every tick, for the seven GPUs that answer.
    assert (host.nvlink_spawns - spawns[0], host.apps_spawns - spawns[1]) == (4, 2)
    assert [p["pid"] for p in entry(state, other)["processes"]] == [6262]
    assert "processes_stale" not in entry(state, other)
    assert all("stale" not in entry(state, s)["nvlink"] for s in host.slots[1:])
    # What was last read of the missing GPU is kept, and said to be stale.
    missing = entry(state, gone)
    assert missing["nvlink"]["stale"] is True and missing["nvlink"]["active"] == 18
    assert missing["processes_stale"] is True
    assert [p["pid"] for p in missing["processes"]] == [4242]
    assert [p["kind"] for p in missing["problems"]] == ["missing"]

    text = statustext.render(state, state["updated_at"], 0, "", width=200)
    assert f"      NVLink 18/18 ({STALE})" in text
    assert f"      processes {STALE}:\n        no unit 40.0 GiB (pid 4242 python3)" in text
    assert "      no unit 8.0 GiB (pid 6262 trainer)" in text
    assert text.count(STALE) == 2  # the GPUs that answer show theirs as current

    # Back in nvidia-smi: its next reads are current again.
    answer(host, host.slots, [])
    back = entry(host.tick(1).state, gone)
    assert "stale" not in back["nvlink"] and "processes_stale" not in back
    assert back["processes"] == []


def test_a_gpu_gone_from_the_bus_keeps_no_current_process_list(host: Host) -> None:
    """Gone from the bus as well as from nvidia-smi (an Xid 79): not ``missing`` (that is a
    GPU still on the bus), but its processes are no more current for that (issue 39)."""
    gone = host.slots[0]
    answer(host, host.slots, [{"slot": gone, "pid": 4242, "name": "python3", "mib": 40960}])
    host.make_agent()
    host.tick(2)
    fakesysfs.remove_device(host.root, gone)
    answer(host, host.slots[1:], [])
    state = host.tick(2).state
    assert state["missing"] == []
    left = entry(state, gone)
    assert [p["kind"] for p in left["problems"]] == ["gone_from_bus"]
    assert left["processes_stale"] is True
    assert [p["pid"] for p in left["processes"]] == [4242]


def test_links_read_before_a_gpu_left_are_stale_until_the_next_read(host: Host) -> None:
    gone = host.slots[0]
    answer(host, host.slots, [])
    host.make_agent(nvlink_interval=60.0)
    host.tick(1)
    answer(host, host.slots[1:], [])
    state = host.tick(1).state  # no NVLink read due: the last one named the GPU
    assert entry(state, gone)["nvlink"]["stale"] is True
    assert "stale" not in entry(state, host.slots[1])["nvlink"]


def test_a_whole_answer_marks_nothing_stale(host: Host) -> None:
    answer(host, host.slots, [])
    host.make_agent(nvlink_interval=10.0)
    state = host.tick(3).state
    assert not any("stale" in g["nvlink"] or "processes_stale" in g for g in state["gpus"])
    text = statustext.render(state, state["updated_at"], 0, "", width=200)
    assert "STALE" not in text


def _gpu(slot: str, driver: str | None = "nvidia") -> PciGpu:
    return PciGpu(slot, "0x2335", "0x030200", driver)


def test_answering_is_the_probeable_gpus_less_the_missing_in_bus_order() -> None:
    bus = BusView(gpus=(_gpu("a"), _gpu("b", "vfio-pci"), _gpu("c"), _gpu("d", None)))
    assert partial.answering(bus, ["c"]) == ["a", "d"]
    assert partial.answering(bus, []) == ["a", "c", "d"]


def test_carry_keeps_the_last_entry_of_a_missing_gpu_only() -> None:
    last = {"a": 1, "b": 2, "c": 3}
    # b missing: carried; c gone from the read and not missing (off the bus): dropped.
    assert partial.carry(last, {"a": 10}, ["b"]) == ({"a": 10, "b": 2}, frozenset({"b"}))
    # Read again: current, nothing carried; a missing GPU never read before: nothing.
    assert partial.carry(last, {"a": 10, "b": 20}, ["b", "z"]) == (
        {"a": 10, "b": 20},
        frozenset(),
    )


def test_stale_is_what_is_shown_and_carried_or_missing_now() -> None:
    assert partial.stale({"a", "b", "c"}, {"b"}, ["c", "z"]) == frozenset({"b", "c"})
    assert partial.stale({"a"}, (), ()) == frozenset()


def test_rows_of_a_state_from_an_older_agent_are_current() -> None:
    links = {"links": 18, "active": 18, "inactive": [], "counters": {}}
    assert statusrows.nvlink_row(links) == "NVLink 18/18"
    assert statusrows.nvlink_row({**links, "stale": "yes"}) == "NVLink 18/18"
    inactive = {"links": 0, "active": 0, "inactive": [], "counters": {}, "stale": True}
    assert statusrows.nvlink_row(inactive) == f"NVLink: all links inactive ({STALE})"
    gpu = {"processes": [], "processes_stale": True, "fields": {"memory.used": 4096}}
    assert statusrows.process_rows(gpu) == []  # none when last read: nothing to show
