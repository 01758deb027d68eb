"""Recurrence across boots (the pure counter): boots, not records; UUID before slot; a clear
restarts the count; a single boot escalates nothing."""

from __future__ import annotations

import time

from gpuagent.sources.kernel.recurrence import Hit, Recurrence
from gpuagent.views import Finding

SLOT = "0000:cf:00.0"
UUID = "GPU-11111111-2222-3333-4444-555555555555"
DAY = 86400.0
T0 = time.mktime((2026, 11, 2, 12, 0, 0, 0, 0, -1))
XID79 = Finding(
    "xid", "critical", "reboot", "Xid 79 (GPU has fallen off the bus): reboot", (("xid", 79),)
)


def hit(boot: int, at: float, slot: str = SLOT, uuid: str | None = UUID, code: int = 79) -> Hit:
    return Hit(f"boot{boot}", at, slot, uuid, "xid", code)


def test_boots_not_records() -> None:
    r = Recurrence(needed=2)
    for i in range(5):
        r.add(hit(1, T0 + i))  # five records, one boot
    assert r.escalate(SLOT, UUID, XID79) == XID79
    r.add(hit(2, T0 + DAY))
    sick = r.escalate(SLOT, UUID, XID79)
    assert sick.action == "drain_and_rma" and sick.severity == "critical"
    assert sick.message.startswith(f"Xid 79 on {SLOT} in 3 boots since 2026-11-02; ")
    assert sick.key == XID79.key  # the same problem, escalated


def test_only_this_boot_escalates_nothing() -> None:
    r = Recurrence()
    assert r.boots(SLOT, UUID, "xid", 79) == []
    assert r.escalate(SLOT, UUID, XID79) == XID79


def test_the_gpu_is_its_uuid_else_its_slot() -> None:
    r = Recurrence(needed=2)
    r.add(hit(1, T0, slot="0000:18:00.0"))  # the same GPU, moved
    r.add(hit(2, T0 + DAY, uuid=None))  # no UUID known then: the slot says
    assert len(r.boots(SLOT, UUID, "xid", 79)) == 2
    other = "GPU-99999999-2222-3333-4444-555555555555"
    assert len(r.boots(SLOT, other, "xid", 79)) == 1  # another GPU in the slot
    assert r.boots(SLOT, UUID, "xid", 48) == []  # another code


def test_a_clear_restarts_the_count() -> None:
    r = Recurrence(needed=2)
    r.add(hit(1, T0))
    r.add(hit(2, T0 + DAY))
    r.clear(T0 + DAY + 60, SLOT, "xid")
    assert r.escalate(SLOT, UUID, XID79) == XID79
    r.add(hit(3, T0 + 2 * DAY))
    r.add(hit(4, T0 + 3 * DAY))
    assert r.escalate(SLOT, UUID, XID79).action == "drain_and_rma"
    r.clear(T0 + 4 * DAY, SLOT, "all")
    assert r.boots(SLOT, UUID, "xid", 79) == []


def test_a_warning_is_not_escalated() -> None:
    r = Recurrence(needed=1)
    r.add(hit(1, T0, code=13))
    warning = Finding("xid", "warning", "restart_app", "Xid 13", (("xid", 13),))
    assert r.escalate(SLOT, UUID, warning) == warning
