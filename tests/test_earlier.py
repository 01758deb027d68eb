"""Recurrence across boots, wired: the earlier boots of a real journal file (make-test-journal,
several boots in one file) read in slices by the agent on a fake host."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from gpuagent.config import Config
from gpuagent.logs import Event, EventLog
from gpuagent.schema import State
from gpuagent.sources.kernel import earlier
from gpuagent.sources.kernel.earlier import EarlierBoots, driver_levels
from gpuagent.sources.kernel.earlierfile import FILE, KeptFile
from gpuagent.sources.kernel.source import Kernel
from tests.conftest import Host
from tests.journalfeed import journal_remote, this_boot, write_file
from tests.journalfeed import xid as xid_line
from tests.test_kernel import FELL_OFF
from tests.test_kernlog import append, export_entry, make
from tests.tools import need

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
    # Journal files in a directory outside /run are kept across boots: none earlier yet.
    assert st["history"] == "no earlier boot yet"
    assert [a for a, _ in xid(st)] == ["reboot"]


@pytest.mark.parametrize(
    ("kept", "said"), [(True, "no earlier boot yet"), (False, "this boot only")]
)
def test_no_earlier_boot_says_whether_the_journal_keeps_them(
    make: Any, kept: bool, said: str
) -> None:
    # Issue 42: "this boot only" on a persistent journal's first boot was untrue.
    asked: list[bool] = []

    def lasts() -> bool:
        asked.append(kept)
        return kept

    reading = EarlierBoots(make(FELL_OFF), 3650, 2, lasts=lasts)
    assert reading.summary == "reading earlier boots"
    for _ in range(100):
        if reading.done:
            break
        reading.step(1.0)
    assert (reading.done, reading.summary, asked) == (True, said, [kept])


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


# The tmpfs flood (issue 40): any user's failed mount in a user namespace is a kernel record
# at KERN_ERR (fs_context.c's logfc for errorf), ~900 a second.
FLOOD = 300_000
TMPFS = b"tmpfs: Bad value for 'size'"


def _kernel(boot: str, at_us: int, message: bytes, priority: int) -> bytes:
    return (
        (
            f"__REALTIME_TIMESTAMP={at_us}\n__MONOTONIC_TIMESTAMP={at_us - 1_699_000_000_000_000}\n"
            f"_BOOT_ID={boot}\n_MACHINE_ID={'f' * 32}\n_HOSTNAME=testhost\n_TRANSPORT=kernel\n"
            f"PRIORITY={priority}\nSYSLOG_FACILITY=0\nSYSLOG_IDENTIFIER=kernel\n"
        ).encode()
        + b"MESSAGE\n"
        + len(message).to_bytes(8, "little")
        + message
        + b"\n\n"
    )


@pytest.fixture(scope="session")
def flooded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real journal (two files: journal-remote rotates at its size) of an earlier boot A
    with an Xid 79, then FLOOD tmpfs records 1 ms apart, then another Xid 79; an earlier
    boot B with one Xid 79; this boot's one record.  Made once a session (about 6 s, 90 MB)."""
    need(journal_remote() is not None, "systemd-journal-remote is not installed")
    directory = str(tmp_path_factory.mktemp("flooded"))
    fell = xid_line(SLOT).encode()
    start = 1_700_000_000_000_000
    stream = [_kernel(A, start, fell, 4)]
    stream += [_kernel(A, start + 1000 * (i + 1), TMPFS, 3) for i in range(FLOOD)]
    stream.append(_kernel(A, start + 1000 * (FLOOD + 1), fell, 4))
    stream.append(_kernel(B, start + 86_400_000_000, fell, 4))
    stream.append(_kernel(this_boot(), start + 2 * 86_400_000_000, b"this boot", 6))
    write_file(os.path.join(directory, "x.journal"), b"".join(stream))
    yield directory
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))


def ticking() -> Callable[[], float]:
    """A clock 1 ms later at each look: a slice (10 ms) reads 8 entries, so the slices a read
    takes count the entries it was handed, whatever this machine's speed."""
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001
        return now[0]

    return clock


def read_all(reading: EarlierBoots, most: int = 100_000) -> int:
    """Step ``reading`` until done (at most ``most`` slices); the slices it took."""
    slices = 0
    while not reading.done and slices < most:
        reading.step()
        slices += 1
    assert reading.done
    return slices


def test_a_flood_of_tmpfs_records_does_not_delay_the_earlier_boots(flooded: str) -> None:
    # Bound: the read takes (the entries its match passes) / (entries a slice) + 1 slices,
    # whatever the flood at another priority: here 3 entries, one slice.  Matched on the
    # kernel's transport alone it took 35,727 slices of this clock (298 real slices on the
    # build machine: 50 minutes at the default interval).
    reading = EarlierBoots(flooded, 100_000, 2, levels=("4",), clock=ticking())
    assert read_all(reading) <= 2
    assert reading.taken == 3
    assert reading.summary == "2 earlier boots"
    assert {(h.boot, h.slot, h.code) for h in reading.recurrence._hits} == {
        (A, SLOT, 79),
        (B, SLOT, 79),
    }


def test_the_driver_s_records_are_at_the_kernel_s_default_level(tmp_path: Any) -> None:
    printk = tmp_path / "printk"
    printk.write_text("7\t4\t1\t7\n")
    assert driver_levels(str(printk)) == ("4",)
    printk.write_text("3 6 1 3\n")  # a host that changed the default: that level too
    assert driver_levels(str(printk)) == ("4", "6")
    printk.write_text("x\n")
    assert driver_levels(str(printk)) == ("4",)
    assert driver_levels(str(tmp_path / "none")) == ("4",)


class Lines(EventLog):
    """The lines logged, their messages only."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def __call__(self, level: int, event: Event | None, message: str, **fields: Any) -> None:
        self.lines.append(message)


def kept(tmp_path: Any, lines: list[str]) -> KeptFile:
    return KeptFile(str(tmp_path), Lines(lines))


def test_a_restart_does_not_read_the_finished_boots_again(flooded: str, tmp_path: Any) -> None:
    lines: list[str] = []
    first = EarlierBoots(flooded, 100_000, 2, kept=kept(tmp_path, lines), levels=("4",))
    read_all(first)
    again = EarlierBoots(flooded, 100_000, 2, kept=kept(tmp_path, lines), levels=("4",))
    assert read_all(again) == 1
    assert again.taken == 0
    assert again.summary == "2 earlier boots"
    assert set(again.recurrence._hits) == set(first.recurrence._hits)
    assert lines == []


def test_a_restart_mid_read_goes_on_from_the_kept_cursor(
    make: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A flood at the driver's priority (here: "kernel: line N" at warning) still has to be
    # read; a restart goes on where the last run kept its cursor (each CHUNK entries).
    monkeypatch.setattr(earlier, "CHUNK", 100)
    wear = "\n".join(
        [
            f"#@boot {B}",
            *(f"kernel: line {i}" for i in range(250)),
            xid_line(SLOT),
            f"#@boot {this_boot()}",
            "kernel: now",
        ]
    )
    journal = make(xid_line(SLOT) + "\n" + wear + "\n", boot=A)
    lines: list[str] = []
    first = EarlierBoots(journal, 100_000, 2, kept=kept(tmp_path, lines), clock=ticking())
    while first.taken < 200:
        first.step()
    again = EarlierBoots(journal, 100_000, 2, kept=kept(tmp_path, lines), clock=ticking())
    read_all(again)
    assert first.taken + again.taken == 252
    fresh = EarlierBoots(journal, 100_000, 2)
    read_all(fresh)
    assert again.summary == fresh.summary == "2 earlier boots"
    assert set(again.recurrence._hits) == set(fresh.recurrence._hits)
    assert len(again.recurrence._hits) == 2


@pytest.mark.parametrize(
    "damage",
    [
        "not json",
        '{"version": 1, "journal": "", "since": 0, "cursor": null, "at": 0, "boots": {"x": {}}}',
        "[]",
    ],
)
def test_a_kept_file_that_is_not_the_agent_s_is_read_afresh(
    make: Any, tmp_path: Any, damage: str
) -> None:
    journal = make(xid_line(SLOT) + f"\n#@boot {this_boot()}\nkernel: now\n", boot=A)
    (tmp_path / FILE).write_text(damage)
    lines: list[str] = []
    reading = EarlierBoots(journal, 100_000, 2, kept=kept(tmp_path, lines))
    read_all(reading)
    assert (reading.taken, reading.summary) == (1, "1 earlier boot")
    assert len(lines) == 1 and lines[0].startswith(f"{tmp_path / FILE}: cannot read")
    assert json.loads((tmp_path / FILE).read_text())["boots"][A]["hits"]


def test_a_kept_file_of_another_journal_is_not_used(make: Any, tmp_path: Any) -> None:
    journal = make(xid_line(SLOT) + f"\n#@boot {this_boot()}\nkernel: now\n", boot=A)
    other = make(f"kernel: other\n#@boot {this_boot()}\nkernel: now\n", "other", boot=B)
    read_all(EarlierBoots(other, 100_000, 2, kept=kept(tmp_path, [])))
    reading = EarlierBoots(journal, 100_000, 2, kept=kept(tmp_path, []))
    read_all(reading)
    assert (reading.taken, reading.boots) == (1, frozenset({A}))


def test_a_long_read_says_how_long_once(make: Any) -> None:
    lines = "".join(f"kernel: line {i}\n" for i in range(200))
    journal = make(lines + f"#@boot {this_boot()}\nkernel: now\n", boot=A)
    # 200 entries 1 s apart (make-test-journal's stamps), this boot 10,000 s after the first.
    reading = EarlierBoots(journal, 100_000, 2, clock=ticking(), booted=lambda: 1_700_010_000.0)
    seen = []
    for _ in range(10):
        reading.step()
        seen.append(reading.left)
    assert seen[:5] == [None] * 5
    left = seen[6]
    assert left is not None and left > earlier.BOUND


def test_the_kernel_source_says_a_long_read_once(make: Any) -> None:
    lines = "".join(f"kernel: line {i}\n" for i in range(200))
    journal = make(lines + f"#@boot {this_boot()}\nkernel: now\n", boot=A)
    said: list[str] = []
    kernel = Kernel(Config(journal_directory=journal, history_days=100_000), Lines(said))
    kernel.earlier = EarlierBoots(
        journal, 100_000, 2, clock=ticking(), booted=lambda: 1_700_010_000.0
    )
    for _ in range(12):
        kernel.earlier.step()
        kernel._say_how_long(10.0)
    (line,) = [s for s in said if "earlier boots' records will take about" in s]
    assert "recurrence and the wear trend wait for it" in line
