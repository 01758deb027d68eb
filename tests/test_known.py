"""The GPUs this host had, remembered under $STATE_DIRECTORY: gone_from_bus across an agent
restart, forgotten after root's ``gpuagent clear SLOT gone_from_bus`` (a real journal file)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from gpuagent.logs import Event
from gpuagent.schema import State
from gpuagent.sources.bus.known import FILE
from tests import fakesysfs, replay
from tests.conftest import Host
from tests.test_clear import LATER, clear_entry
from tests.test_kernlog import append, make

__all__ = ["make"]  # the fixture


def kinds(state: State, slot: str) -> list[str]:
    return [p["kind"] for g in state["gpus"] if g["pci_slot"] == slot for p in g["problems"]]


def remembered(directory: str) -> list[str]:
    with open(os.path.join(directory, FILE), encoding="utf-8") as f:
        return [g["pci_slot"] for g in json.load(f)["gpus"]]


def unplug(host: Host, slot: str) -> None:
    """The GPU in ``slot`` leaves the fake bus, and nvidia-smi's answer."""
    fakesysfs.remove_device(host.root, slot)
    host.healthy(slots=[s for s in host.slots if s != slot])


def test_a_gpu_gone_stays_gone_across_a_restart_until_cleared(
    host: Host, make: Any, tmp_path: str
) -> None:
    journal = make("kernel: nothing of the driver's\n")
    directory = os.path.join(str(tmp_path), "lib")
    os.mkdir(directory)
    sick = host.slots[4]
    host.make_agent(state_directory=directory, journal_directory=journal)
    host.tick(2)  # the second tick knows the first one's samples: names and UUIDs
    assert remembered(directory) == sorted(host.slots)
    with open(os.path.join(directory, FILE), encoding="utf-8") as f:
        gpu = next(g for g in json.load(f)["gpus"] if g["pci_slot"] == sick)
    assert gpu["name"] == "NVIDIA H200" and str(gpu["uuid"]).startswith("GPU-")
    unplug(host, sick)
    assert kinds(host.tick().state, sick) == ["gone_from_bus"]
    with open(os.path.join(directory, FILE), encoding="utf-8") as f:
        gone_at = next(g for g in json.load(f)["gpus"] if g["pci_slot"] == sick)["gone_at"]
    assert isinstance(gone_at, float)
    # A restart (an apt upgrade): the new agent never saw the GPU, and still knows it; the
    # fault is no new one to it: restated at info, since it was first found missing.
    host.make_agent(state_directory=directory, journal_directory=journal)
    st = host.tick().state
    assert kinds(st, sick) == ["gone_from_bus"]
    (p,) = [p for g in st["gpus"] if g["pci_slot"] == sick for p in g["problems"]]
    assert p["since"] == gone_at
    lines = [(r.levelno, r.getMessage()) for r in host.events(Event.problem("gone_from_bus"))]
    assert [level for level, _ in lines] == [logging.ERROR]
    # Restated with an event of its own: no new start for gpuagent history.
    (still,) = host.events(Event.STILL_HOLDS)
    assert still.levelno == logging.INFO
    assert still.getMessage().startswith(f"GPU {sick}: still critical gone_from_bus: ")
    assert still.getMessage().endswith(", seen before the restart")
    # Root says it left for good: forgotten, here and after the next restart.
    append(journal, clear_entry("0", LATER, slot=sick, kind="gone_from_bus"))
    st = host.tick().state
    assert kinds(st, sick) == []
    assert sick not in remembered(directory)
    ends = [r.getMessage() for r in host.events(Event.PROBLEM_CLEARED)]
    assert any(m.startswith(f"GPU {sick}: gone_from_bus cleared by an operator") for m in ends)
    host.make_agent(state_directory=directory, journal_directory=journal)
    assert kinds(host.tick().state, sick) == []
    assert host.state["problems"] == {}


def test_without_a_state_directory_a_restart_forgets(host: Host) -> None:
    sick = host.slots[4]
    host.make_agent()
    host.tick()
    unplug(host, sick)
    assert kinds(host.tick().state, sick) == ["gone_from_bus"]
    host.make_agent()
    assert kinds(host.tick().state, sick) == []


def test_a_file_that_cannot_be_read_or_written_is_one_warning(host: Host, tmp_path: str) -> None:
    directory = os.path.join(str(tmp_path), "lib")
    os.mkdir(directory)
    with open(os.path.join(directory, FILE), "w", encoding="utf-8") as f:
        f.write("{not json")
    host.make_agent(state_directory=directory)
    st = host.tick().state
    (warning,) = [m for m in host.lines(logging.WARNING) if "cannot read the GPUs" in m]
    assert warning.endswith("; going on with the GPUs on the bus")
    # Rewritten from what the agent sees at once: the trouble is over.
    assert remembered(directory) == sorted(host.slots)
    assert "known_gpus" not in st["problems"]
    missing = os.path.join(str(tmp_path), "nowhere")
    host.make_agent(state_directory=missing)
    st = host.tick(3).state
    assert "cannot remember the GPUs this host has" in st["problems"]["known_gpus"]
    warnings = [m for m in host.lines(logging.WARNING) if "cannot remember the GPUs" in m]
    assert len(warnings) == 1
    assert all(g["health"] == "ok" for g in st["gpus"])
    # The boot's wear records too: one warning, its own trouble.
    (wear,) = [m for m in host.lines(logging.WARNING) if "cannot remember the boards' wear" in m]
    assert wear.endswith("; going on with this run's records only")
    assert "wear.json: cannot remember" in st["problems"]["wear_records"]


def test_after_a_reboot_a_gpu_that_did_not_come_back_is_said_to_be_so(
    host: Host, tmp_path: str
) -> None:
    directory = os.path.join(str(tmp_path), "lib")
    os.mkdir(directory)
    sick, other = host.slots[4], host.slots[5]
    host.make_agent(state_directory=directory, boot=lambda: "a" * 32, expected_gpus=8)
    host.tick()
    unplug(host, other)
    # Gone in this boot: no longer on the bus, and the count names it.
    (p,) = [p for g in host.tick().state["gpus"] if g["pci_slot"] == other for p in g["problems"]]
    assert p["message"] == "the GPU is no longer on the PCI bus"
    # The next boot: the other GPU is back, this one is not.
    fakesysfs.add_device(
        host.root, other, fakesysfs.NVIDIA, fakesysfs.H200, fakesysfs.CLASS_3D, "nvidia"
    )
    fakesysfs.remove_device(host.root, sick)
    host.healthy(slots=[s for s in host.slots if s != sick])
    host.make_agent(state_directory=directory, boot=lambda: "b" * 32, expected_gpus=8)
    st = host.tick().state
    (p,) = [p for g in st["gpus"] if g["pci_slot"] == sick for p in g["problems"]]
    assert (p["kind"], p["action"]) == ("gone_from_bus", "reboot")
    assert p["message"] == "the GPU did not come back on the PCI bus after the reboot"
    (line,) = [r.getMessage() for r in host.events(Event.problem("gone_from_bus"))][-1:]
    assert line == (
        f"GPU {sick}: critical gone_from_bus: the GPU did not come back on the PCI bus "
        "after the reboot; action: reboot; ends by itself when the GPU is back on the PCI bus; "
        f"if it left for good: gpuagent clear {sick} gone_from_bus"
    )
    (count,) = st["host_problems"]
    assert count["kind"] == "gpu_count"
    assert count["message"] == (
        f"7 NVIDIA GPUs on the PCI bus where expected_gpus is 8; missing: {sick}"
    )
    assert kinds(st, other) == []
    # A restart in the same boot still says it did not come back.
    host.make_agent(state_directory=directory, boot=lambda: "b" * 32)
    (p,) = [p for g in host.tick().state["gpus"] if g["pci_slot"] == sick for p in g["problems"]]
    assert p["message"] == "the GPU did not come back on the PCI bus after the reboot"


def test_a_renumbered_bus_loses_no_gpu(host: Host, make: Any, tmp_path: str) -> None:
    """A BIOS or kernel change renumbers the PCI bus: every board answers in a new slot under
    its UUID.  No GPU is gone from the bus, not even on the first tick, when the boards have
    not said their UUIDs yet (issue 39)."""
    journal = make("kernel: nothing of the driver's\n")
    directory = os.path.join(str(tmp_path), "lib")
    os.mkdir(directory)
    host.make_agent(state_directory=directory, journal_directory=journal, boot=lambda: "a" * 32)
    host.tick(2)
    uuids = {s: replay.gpu_uuid(s) for s in host.slots}
    # The next boot: each board one bus further on, its UUID the same.
    renumbered = {s: f"0000:{int(s[5:7], 16) + 1:02x}:00.0" for s in host.slots}
    for old, new in renumbered.items():
        fakesysfs.remove_device(host.root, old)
        fakesysfs.add_device(
            host.root, new, fakesysfs.NVIDIA, fakesysfs.H200, fakesysfs.CLASS_3D, "nvidia"
        )
    host.healthy(
        slots=list(renumbered.values()),
        override={new: {"uuid": uuids[old]} for old, new in renumbered.items()},
    )
    host.make_agent(state_directory=directory, journal_directory=journal, boot=lambda: "b" * 32)
    for _ in range(3):
        st = host.tick().state
        assert [p for g in st["gpus"] for p in g["problems"]] == [], st["status"]
    assert sorted(g["pci_slot"] for g in st["gpus"]) == sorted(renumbered.values())
    moved = host.events(Event.BOARD_MOVED)
    assert sorted(r.OLD_SLOT for r in moved) == sorted(renumbered)  # type: ignore[attr-defined]
    assert host.events(Event.problem("gone_from_bus")) == []
