"""A damaged journal file (a real one from make-test-journal, one entry object overwritten in
its middle, as a crash or a bad disk leaves it): sd-journal drops the file from a matched
reader at the damage and says nothing, so every later kernel record was missed.  Now the
agent says so (its journal problem) and still reads the records after the damage."""

from __future__ import annotations

import struct
from typing import Any

from gpuagent.sources.kernel.earlier import EarlierBoots
from gpuagent.sources.kernel.kernlog import DAMAGE_HOLD, KernelLog
from gpuagent.sources.kernel.xidcount import XidCounter
from tests.conftest import Clock
from tests.journalfeed import this_boot
from tests.test_kernlog import append, export, make, records

__all__ = ["make"]  # the fixture

FILLER = 2000
# Kernel lines: filler (no GPU's), with an Xid 79 three quarters of the way through.
LINES = "".join(
    f"[ {10 + i / 1000:.6f}] e1000e 0000:00:19.0 eth0: link flap {i}\n"
    + (
        f"[ {10 + i / 1000:.6f}] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off\n"
        if i == FILLER * 3 // 4
        else ""
    )
    for i in range(FILLER)
)


def damage(path: str) -> None:
    """Overwrite the entry object in the middle of the journal file at ``path`` (its items:
    the offsets of its data objects), as torn writes do."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        header_size = struct.unpack_from("<Q", data, 88)[0]
        entries, at = [], header_size
        while at + 16 <= len(data):
            kind, size = data[at], struct.unpack_from("<Q", data, at + 8)[0]
            if size == 0:
                break
            if kind == 3:  # OBJECT_ENTRY
                entries.append(at)
            at += (size + 7) & ~7
        assert len(entries) > FILLER
        middle = entries[len(entries) // 2]
        data[middle + 16 : middle + 48] = b"\xff" * 32
        f.seek(0)
        f.write(data)


def test_a_damaged_file_is_the_journal_problem_and_the_records_after_it_are_read(
    make: Any,
) -> None:
    directory = make(LINES)
    damage(f"{directory}/x.journal")
    clock = Clock(100.0)
    log = KernelLog(directory, clock=clock)
    counter = XidCounter()
    got = records(log)
    for at, message in got:
        counter.add(at, message)
    # Before: 1,000 records (those before the damage), no Xid, no problem.
    assert [f.code for f in counter.take_new([])] == [79]
    assert len(got) == FILLER  # the damaged entry alone is lost
    assert log.error is not None and "journal file is damaged" in log.error, log.error
    assert "journalctl --verify" in log.error
    # Nothing is handed out twice, and the problem holds while nothing new comes ...
    assert records(log) == []
    assert log.error is not None
    # ... and ends by itself.
    clock.now += DAMAGE_HOLD
    assert records(log) == []
    assert log.error is None


def test_after_the_damage_appended_records_still_come(make: Any) -> None:
    directory = make(LINES)
    extra = make("[ 99.000000] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE.\n", "extra")
    damage(f"{directory}/x.journal")
    log = KernelLog(directory)
    assert len(records(log)) == FILLER
    append(directory, export(extra))
    later = [m for _, m in records(log)]
    assert any("Xid (PCI:0000:3b:00): 48" in m for m in later), later


def test_the_earlier_boots_read_goes_on_past_damage_and_says_so(make: Any) -> None:
    """Three earlier boots in one file, damaged in the second: sd-journal dropped the file
    from the reader there, and every boot after it was lost without a word (issue 39).  Now
    the read goes on past the damage and the state's history says it met one."""
    boots = ["a" * 32, "b" * 32, "c" * 32]
    filler = "".join(f"kernel: e1000e 0000:00:19.0 eth0: link flap {i}\n" for i in range(FILLER))
    text = "".join(f"#@boot {b}\n{filler}" for b in boots[1:])
    journal = make(filler + text + f"#@boot {this_boot()}\nkernel: now\n", boot=boots[0])
    damage(f"{journal}/x.journal")
    reading = EarlierBoots(journal, 100000, 2)
    for _ in range(100_000):
        if reading.done:
            break
        reading.step()
    assert reading.done
    assert boots[2] in reading.boots
    assert "a damaged journal file" in reading.summary
    assert reading.summary.startswith("3 earlier boots")
