"""A GPU's story across boots, from journal entries: ``gpuagent history`` (pure).

The entries are the kernel's records (Xids, the UUID lines), the agent's own problem lines
(``_SYSTEMD_UNIT=gpuagent.service``: starts and ends, each naming the GPU's UUID in
``GPU_UUID`` where it was known; a wear record, a step for each board it names) and root's
clears, of every boot the journal holds, in journal order.  :func:`events` turns them into
:class:`Step` s, a ``boot`` step where each boot's entries begin; :func:`render` is the
timeline for a person.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from gpuagent.logs import Event
from gpuagent.sources.bus.pciaddr import device_of
from gpuagent.sources.kernel import clears
from gpuagent.sources.kernel.xid import GpuUuid, Xid, assess, parse
from gpuagent.sources.victims.rule import Victim, describe, parse_victims
from gpuagent.sources.wear import boards as wearboards
from gpuagent.sources.wear.counters import FIELDS as WEAR_FIELDS
from gpuagent.sources.wear.counters import LABELS as WEAR_LABELS
from gpuagent.sources.wear.counters import count
from gpuagent.untrusted import printable, whole

__all__ = ["FIELDS", "STARTS", "UNIT", "Step", "events", "of_boards", "render", "serials", "steps"]

# The fields of a journal entry that the timeline reads.
FIELDS = (
    "_BOOT_ID",
    "_TRANSPORT",
    "_SYSTEMD_UNIT",
    "_UID",
    "MESSAGE",
    "MESSAGE_ID",
    "PCI_SLOT",
    "GPU_UUID",
    "OLD_UUID",
    "OLD_SERIAL",
    "NEW_SERIAL",
    "PROBLEM",
    "SEVERITY",
    "ACTION",
    "XID",
    "KIND",
    "CLEARED_BY",
    "_AUDIT_LOGINUID",
    "SUDO_USER",
    "VICTIMS",
    wearboards.FIELD,
    *(name.upper() for name in WEAR_FIELDS.values()),
)

UNIT = "gpuagent.service"
# The MESSAGE_IDs of the agent's problem starts (its own lines and the driver's problems).
STARTS = {
    e.value for e in Event if e.name.startswith("PROBLEM_") and e is not Event.PROBLEM_CLEARED
}
STARTS |= {Event.XID_PROBLEM.value, Event.GPU_INIT_FAILED.value}


@dataclass(frozen=True)
class Step:
    """One event of the timeline (``--json``'s objects): ``event`` is ``boot``, ``xid``,
    ``problem_start``, ``problem_end``, ``clear``, ``board_replaced``, ``wear`` or
    ``victims`` (the processes a critical Xid hit: ``victims``, each a
    :class:`~gpuagent.sources.victims.rule.Victim`); ``time`` in
    s since the epoch; ``by`` the person behind a clear
    (:func:`gpuagent.sources.kernel.clears.person`, else root); for a board replaced, ``uuid``
    and ``serial`` the new board's, ``old_uuid`` and ``old_serial`` the one before it (None:
    not known); for a wear record, ``wear`` its counters by name
    (:mod:`gpuagent.sources.wear.counters`)."""

    boot: str
    time: float
    pci_slot: str | None
    uuid: str | None
    event: str
    kind: str | None = None
    xid: int | None = None
    action: str | None = None
    # Not in the JSON: what recurrence counts (critical only).
    severity: str | None = None
    by: str | None = None
    serial: str | None = None
    old_uuid: str | None = None
    old_serial: str | None = None
    wear: Mapping[str, int] | None = field(default=None, hash=False)
    victims: tuple[Victim, ...] | None = field(default=None, hash=False)

    def as_json(self) -> dict[str, object]:
        out = asdict(self)
        del out["severity"]
        return out


def _text(entry: Mapping[str, object], key: str) -> str | None:
    value = entry.get(key)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def events(
    entries: Iterable[tuple[float, Mapping[str, object]]],
    slot: str | None,
    names: clears.Names = clears.no_names,
    *,
    uuid: str | None = None,
) -> list[Step]:
    """The timeline of the GPU in ``slot`` (None: every GPU), or of the board ``uuid`` in
    whichever slot it was, from ``(time, fields)`` entries in journal order; ``names`` gives
    the user names of the clears' login uids.  A step that names no UUID is the board's
    where another step of its boot names the board in that slot."""
    out: list[Step] = []
    boot = ""
    uuids: dict[str, str] = {}
    told: set[tuple[str, str, int]] = set()
    want = None if slot is None else device_of(slot)
    for at, entry in entries:
        this = _text(entry, "_BOOT_ID") or ""
        if this != boot:
            boot = this
            out.append(Step(boot, at, None, None, "boot"))
        for step in steps(boot, at, entry, uuids, told, names=names):
            if want is None or (step.pci_slot and device_of(step.pci_slot) == want):
                out.append(step)
    if uuid is not None:
        return of_boards(out, {uuid})
    if slot is not None:
        out = _trimmed(out)
    return out


def _trimmed(steps: list[Step]) -> list[Step]:
    """A boot step only where the GPU's story goes on after it."""
    return [s for i, s in enumerate(steps) if s.event != "boot" or _after(steps, i)]


def of_boards(steps: list[Step], uuids: Iterable[str]) -> list[Step]:
    """The story of the boards ``uuids`` in whichever slot they were, from every GPU's
    ``steps``: those naming one of them (a replacement names both boards), and a step naming
    none where another of its boot names the board in its slot."""
    want = {u.lower() for u in uuids}
    boards = {
        (s.boot, device_of(s.pci_slot)): s.uuid.lower() for s in steps if s.uuid and s.pci_slot
    }

    def whose(s: Step) -> set[str]:
        if s.uuid:
            return {s.uuid.lower(), *([s.old_uuid.lower()] if s.old_uuid else [])}
        board = boards.get((s.boot, device_of(s.pci_slot))) if s.pci_slot else None
        return {board} if board else set()

    return _trimmed([s for s in steps if s.event == "boot" or whose(s) & want])


def serials(steps: Iterable[Step], serial: str) -> set[str]:
    """The UUIDs of the boards with ``serial`` that the steps' replacements name."""
    out: set[str] = set()
    for s in steps:
        if s.event == "board_replaced":
            if s.serial == serial and s.uuid:
                out.add(s.uuid)
            if s.old_serial == serial and s.old_uuid:
                out.add(s.old_uuid)
    return out


def _after(steps: list[Step], i: int) -> bool:
    return any(s.event != "boot" for s in steps[i + 1 :]) and (
        i == 0 or steps[i - 1].event != "boot"
    )


def steps(
    boot: str,
    at: float,
    entry: Mapping[str, object],
    uuids: dict[str, str],
    told: set[tuple[str, str, int]],
    *,
    names: clears.Names = clears.no_names,
) -> list[Step]:
    """The steps one entry of ``boot`` at ``at`` makes; ``uuids`` (the driver's UUID lines by
    device) and ``told`` (the Xids already stepped) carry over from entry to entry."""
    if _text(entry, "_TRANSPORT") == "kernel":
        found: list[Step] = []
        for e in parse(_text(entry, "MESSAGE") or ""):
            if isinstance(e, GpuUuid):
                uuids[e.device] = e.uuid
            elif isinstance(e, Xid) and e.device is not None:
                key = (boot, e.device, e.code)
                if e.origin != "xid" and key in told:
                    continue  # the fall-off's companion records: one Xid 79
                told.add(key)
                slot = f"{e.device}.{e.function or 0}"
                info = assess(e)
                uuid = uuids.get(e.device)
                found.append(
                    Step(boot, at, slot, uuid, "xid", "xid", e.code, info.action, info.severity)
                )
        return found
    where = _text(entry, "PCI_SLOT")
    # The agent's lines name the board (GPU_UUID); a clear or an older agent's line does not.
    uuid = _text(entry, "GPU_UUID") or (uuids.get(device_of(where)) if where else None)
    message_id = _text(entry, "MESSAGE_ID")
    if message_id == Event.OPERATOR_CLEAR.value:
        clear = clears.parse(entry, at, names)
        if clear is None:
            return []
        return [Step(boot, at, clear.slot, uuid, "clear", clear.kind, by=clear.by)]
    if _text(entry, "_SYSTEMD_UNIT") != UNIT:
        return []
    if message_id == Event.WEAR_RECORDED.value and (read := _text(entry, wearboards.FIELD)):
        return _boards(boot, at, read, uuids)
    if not where:
        return []
    code = _text(entry, "XID")
    xid = whole(code, 6) if code else None
    kind, action, severity = (_text(entry, k) for k in ("PROBLEM", "ACTION", "SEVERITY"))
    if message_id == Event.BOARD_REPLACED.value:
        old_uuid, old_serial, serial = (
            _text(entry, k) for k in ("OLD_UUID", "OLD_SERIAL", "NEW_SERIAL")
        )
        return [
            Step(
                boot,
                at,
                where,
                uuid,
                "board_replaced",
                serial=serial,
                old_uuid=old_uuid,
                old_serial=old_serial,
            )
        ]
    if message_id == Event.WEAR_RECORDED.value:
        # Before 0.9.0 a record a board, each counter a field of its own.
        return [Step(boot, at, where, uuid, "wear", wear=_wear(entry))]
    if message_id == Event.FAULT_VICTIMS.value:
        hit = parse_victims(_text(entry, "VICTIMS"))
        return [Step(boot, at, where, uuid, "victims", xid=xid, victims=hit)]
    if message_id == Event.PROBLEM_CLEARED.value:
        return [Step(boot, at, where, uuid, "problem_end", kind, xid, action)]
    if message_id in STARTS:
        return [Step(boot, at, where, uuid, "problem_start", kind, xid, action, severity)]
    return []


def _boards(boot: str, at: float, text: str, uuids: Mapping[str, str]) -> list[Step]:
    """A wear record's steps, one a board of its ``WEAR_BOARDS``; a board it names no UUID
    of is the one the driver's UUID line names in its slot."""
    return [
        Step(
            boot,
            at,
            b.pci_slot,
            b.gpu_uuid or uuids.get(device_of(b.pci_slot)),
            "wear",
            wear=b.counts,
        )
        for b in wearboards.read(text)
    ]


def _wear(entry: Mapping[str, object]) -> dict[str, int]:
    """A wear record's counters: the fields that are counts."""
    out: dict[str, int] = {}
    for name in WEAR_FIELDS.values():
        text = _text(entry, name.upper())
        if text is not None and (got := count(text)) is not None:
            out[name] = got
    return out


def render(steps: list[Step]) -> str:
    """The timeline for a person: one line a step, a rule at each boot; a wear record says
    each counter's growth since the board's record before it (``+3``)."""
    lines: list[str] = []
    wore: dict[str, Mapping[str, int]] = {}
    for s in steps:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.time))
        if s.event == "boot":
            lines.append(printable(f"-- boot {s.boot[:12]} ({stamp}) --"))
            continue
        what = f"Xid {s.xid}" if s.xid is not None else (s.kind or "")
        if s.event == "board_replaced":
            what = f"{_board(s.old_uuid, s.old_serial)} -> {_board(s.uuid, s.serial)}"
        if s.event == "victims":
            what = f"{what} hit {describe(s.victims or ())}"
        if s.event == "wear" and s.wear is not None:
            board = (s.uuid or s.pci_slot or "").lower()
            what = _grown(s.wear, wore.get(board))
            wore[board] = s.wear
        action = f" (action: {s.action})" if s.action else ""
        by = f" by {s.by}" if s.by else ""
        # Every field here is a journal field, which anyone who logs may have written.
        lines.append(printable(f"{stamp}  {s.pci_slot:<13} {s.event:<13} {what}{action}{by}"))
    return "\n".join(lines) if lines else "no GPU events in the journal"


def _grown(counts: Mapping[str, int], before: Mapping[str, int] | None) -> str:
    """A wear record for a person, each counter with its growth since ``before``."""
    said = []
    for name, label in WEAR_LABELS.items():
        if name not in counts:
            continue
        grew = counts[name] - before[name] if before and name in before else 0
        said.append(f"{label} {counts[name]}" + (f" (+{grew})" if grew > 0 else ""))
    return ", ".join(said) or "no counters"


def _board(uuid: str | None, serial: str | None) -> str:
    """A board for a person: ``GPU-… (serial 1320221034567)``."""
    return (uuid or "unknown board") + (f" (serial {serial})" if serial else "")
