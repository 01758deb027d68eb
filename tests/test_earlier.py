"""Recurrence across boots, wired: the earlier boots of a real journal file (make-test-journal,
several boots in one file) read in slices by the agent on a fake host."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpuagent.logs import Event
from gpuagent.schema import State
from gpuagent.sources.kernel import earlier
from gpuagent.sources.kernel.earlier import EarlierBoots
from tests.conftest import Host
from tests.journalfeed import this_boot
from tests.test_kernel import FELL_OFF
from tests.test_kernlog import append, export_entry, make

__all__ = ["make"]  # the fixture

SLOT = "0000:18:00.0"
A = "0123456789abcdef0123456789abcdef"
B = "fedcba9876543210fedcba9876543210"


def xid(state: State) -> list[tuple[str, str]]:
    return [
        (p["action"], p["message"])
        for g in state["gpus"]
        if g["pci_slot"] == SLOT
        for p in g["problems"]
        if p["kind"] == "xid"
    ]


def test_the_same_xid_in_two_earlier_boots_asks_for_rma(host: Host, make: Any) -> None:
    journal = make(
        FELL_OFF + f"#@boot {B}\n" + FELL_OFF + f"#@boot {this_boot()}\n" + FELL_OFF, boot=A
    )
    host.make_agent(journal_directory=journal, history_days=3650)
    st = host.tick().state
    assert st["history"] == "2 earlier boots"
    ((action, message),) = xid(st)
    assert action == "drain_and_rma"
    assert message.startswith(f"Xid 79 on {SLOT} in 3 boots since 2024-04-05; ")


def test_boots_not_records(host: Host, make: Any) -> None:
    journal = make(FELL_OFF * 3 + f"#@boot {this_boot()}\n" + FELL_OFF, boot=A)
    host.make_agent(journal_directory=journal, history_days=3650)
    st = host.tick().state
    assert st["history"] == "1 earlier boot"
    assert [a for a, _ in xid(st)] == ["reboot"]


def test_a_journal_of_this_boot_only_escalates_nothing(host: Host, make: Any) -> None:
    journal = make(FELL_OFF)
    host.make_agent(journal_directory=journal, history_days=3650)
    st = host.tick().state
    assert st["history"] == "this boot only"
    assert [a for a, _ in xid(st)] == ["reboot"]


def test_read_in_slices_and_said_until_done(make: Any) -> None:
    lines = "".join(f"kernel: line {i}\n" for i in range(5000))
    journal = make(lines + f"#@boot {this_boot()}\n" + "kernel: now\n", boot=A)
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001  # each look at the clock: 1 ms later
        return now[0]

    earlier = EarlierBoots(journal, 100000, 2, clock=clock)
    slices = 0
    while not earlier.done and slices < 10_000:
        assert earlier.summary == "reading earlier boots"
        spent = now[0]
        earlier.step()
        # The clock is read after each entry: a slice ends within its budget (10 ms), opening
        # the journal included (give or take a look: this clock's float sums are not exact).
        assert now[0] - spent <= earlier_slice() + 0.001
        slices += 1
    assert earlier.done
    assert slices >= 500  # 5000 records, one look at the clock after each, 9 looks a slice
    assert earlier.summary == "1 earlier boot"


def earlier_slice() -> float:
    return earlier.SLICE


def agent_line(
    boot: str, at: float, event: Event, fields: Mapping[str, str], *, mono: int = 5_000_000
) -> bytes:
    """One of the agent's lines with ``event`` and ``fields``, logged at ``at`` (s since the
    epoch; ``mono`` µs into the boot), as the journal stores it."""
    return export_entry(
        [
            ("__REALTIME_TIMESTAMP", str(int(at * 1e6)).encode()),
            ("__MONOTONIC_TIMESTAMP", str(mono).encode()),
            ("_BOOT_ID", boot.encode()),
            ("_TRANSPORT", b"stdout"),
            ("_SYSTEMD_UNIT", b"gpuagent.service"),
            ("MESSAGE_ID", event.value.encode()),
            *((k, v.encode()) for k, v in fields.items()),
        ]
    )


def agent_problem(boot: str, at: float, slot: str, uuid: str | None = None) -> bytes:
    """The agent's start line of a critical recovery_action, as the journal stores it (with
    the board's ``GPU_UUID`` where given)."""
    board = {"GPU_UUID": uuid} if uuid else {}
    problem = {"PROBLEM": "recovery_action", "SEVERITY": "critical", "ACTION": "reset_gpu"}
    message = {"MESSAGE": "GPU: recovery_action critical"}
    event = Event.PROBLEM_RECOVERY_ACTION
    return agent_line(boot, at, event, {**board, "PCI_SLOT": slot, **problem, **message})


def test_nvidia_smi_s_problem_recurring_asks_for_rma(host: Host, make: Any) -> None:
    sick = host.slots[0]
    journal = make(f"kernel: boot A\n#@boot {B}\nkernel: boot B\n", boot=A)
    append(journal, agent_problem(A, 1_700_000_100, sick) + agent_problem(B, 1_700_086_500, sick))
    now = export_entry(
        [
            ("__REALTIME_TIMESTAMP", b"1700200000000000"),
            ("__MONOTONIC_TIMESTAMP", b"1000000"),
            ("_BOOT_ID", this_boot().encode()),
            ("_TRANSPORT", b"kernel"),
            ("MESSAGE", b"this boot"),
        ]
    )
    append(journal, now)
    host.healthy(override={sick: {"gpu_recovery_action": "Reset"}})
    host.make_agent(journal_directory=journal, history_days=3650)
    st = host.tick().state
    assert st["history"] == "2 earlier boots"
    (p,) = next(g for g in st["gpus"] if g["pci_slot"] == sick)["problems"]
    assert (p["kind"], p["action"]) == ("recovery_action", "drain_and_rma")
    assert p["message"].startswith(f"recovery_action on {sick} in 3 boots since 2023-11-1")


@pytest.mark.parametrize("same", [True, False])
def test_a_replaced_board_does_not_inherit_its_slots_problems(
    host: Host, make: Any, same: bool
) -> None:
    sick = host.slots[0]
    host.healthy(override={sick: {"gpu_recovery_action": "Reset"}})
    host.make_agent()
    board = next(g for g in host.tick().state["gpus"] if g["pci_slot"] == sick)["uuid"]
    assert board is not None
    old = board if same else "GPU-99999999-8888-7777-6666-555555555555"
    journal = make(f"kernel: boot A\n#@boot {B}\nkernel: boot B\n", boot=A)
    append(
        journal,
        agent_problem(A, 1_700_000_100, sick, old) + agent_problem(B, 1_700_086_500, sick, old),
    )
    host.make_agent(journal_directory=journal, history_days=3650)
    host.tick()
    st = host.tick().state
    assert st["history"] == "2 earlier boots"
    (p,) = next(g for g in st["gpus"] if g["pci_slot"] == sick)["problems"]
    assert p["action"] == ("drain_and_rma" if same else "reset_gpu")


def test_reopened_every_chunk_nothing_is_read_twice_or_missed(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(earlier, "CHUNK", 100)
    xid79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    lines = "".join(xid79 if i % 50 == 0 else f"kernel: line {i}\n" for i in range(1000))
    journal = make(lines + f"#@boot {this_boot()}\nkernel: now\n", boot=A)
    reading = EarlierBoots(journal, 100000, 2)
    while not reading.done:
        reading.step()
    assert len(reading.recurrence._hits) == 20


def test_a_journal_directory_it_may_not_open_ends_the_read_with_nothing() -> None:
    # The kernel source says why (its own one line); the earlier boots are then none.
    def refused(directory: str) -> Any:
        raise PermissionError(13, "Permission denied", directory)

    earlier = EarlierBoots("/srv/journal", 30, 2, open_reader=refused, this_boot=lambda: "b")
    earlier.step()
    assert (earlier.done, earlier.summary) == (True, "this boot only")
