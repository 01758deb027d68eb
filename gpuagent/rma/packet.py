"""The RMA packet of one board from what the agent remembers and the driver says (pure).

:func:`build` takes plain values that :mod:`gpuagent.commands.rmacli` read (the GPUs the
agent remembers, the journal's timeline of the board, this boot's wear record, the state's
problems, the driver's ``-q`` answer, the evidence bundles' names) and gives the packet as
one JSON object; :func:`render` is the same for a person.  The object's keys are a contract
(README "The RMA packet", gpuagent(8)):

- ``uuid``, ``serial``, ``name``, ``vbios``, ``board_part_number``: the board (None: not
  known); ``pci_slot``: where it is on this host now (None: not on the bus now);
- ``slots``: where it sat, ``[{"pci_slot", "first", "last", "left"}]`` (s since the epoch or
  None; ``left``: when it was replaced out of that slot);
- ``driver``: ``{"read": bool, "error": str|None}`` and, once read, ``remapped_rows``,
  ``retired_pages`` and ``sram_threshold_exceeded`` as the driver said;
- ``gates``: ``[{"gate", "met", "reading", "rule", "source"}]``
  (:mod:`gpuagent.rma.gates`); ``gate_met``: whether any gate is met;
- ``faults``: the board's Xids and problem starts across boots and slots (``gpuagent
  history --json``'s steps);
- ``wear``: its wear records, oldest first: ``[{"time", "boot", "pci_slot", "counters"}]``;
- ``pcie_errors``: its PCIe path's ``pcie_error`` problems, now (the state) and across boots
  (the journal): ``[{"pci_slot", "time", "severity", "message", "pcie_device", "boot"}]``;
- ``evidence``: ``{"directory", "files", "more"}``: the bundles of its slots;
- ``notes``: what could not be read, one line each;
- ``next_step``: ``{"text", "source"}``, NVIDIA's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from gpuagent.rma import gates
from gpuagent.rma.smiq import Board
from gpuagent.sources.kernel.timeline import Step
from gpuagent.sources.wear.counters import said
from gpuagent.untrusted import printable

__all__ = ["FAULTS", "build", "render"]

# The steps that are faults.
FAULTS = ("xid", "problem_start")
_PCIE = "pcie_error"


def build(
    uuid: str,
    *,
    remembered: Sequence[Mapping[str, Any]],
    steps: Sequence[Step],
    wear_now: tuple[str, Mapping[str, int]] | None,
    problems: Mapping[str, Sequence[Mapping[str, Any]]],
    read: Board | str | None,
    evidence: tuple[str, Sequence[str], int] | None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The packet of the board ``uuid``.  ``remembered``: the ``gpus.json`` entries naming it
    (in a slot now, or departed: ``pci_slot``, ``serial``, ``name``, ``gone_at``, ``at``);
    ``steps``: its timeline; ``wear_now``: this boot's wear record (slot, counters);
    ``problems``: the state's problems by slot; ``read``: the driver's answer, the one-line
    reason it was not read, or None where the board is not on this host now; ``evidence``:
    the directory, the bundle names of the board's slots and how many more were left out."""
    here = next((e for e in remembered if "gone_at" in e and e.get("gone_at") is None), None)
    slot = str(here["pci_slot"]) if here else None
    board = read if isinstance(read, Board) else None
    ident = board.identity if board else {}
    serial = ident.get("serial") or _first(remembered, "serial") or _first_step_serial(steps, uuid)
    out: dict[str, Any] = {
        "uuid": ident.get("uuid") or uuid,
        "serial": serial,
        "name": ident.get("name") or _first(remembered, "name"),
        "vbios": ident.get("vbios"),
        "board_part_number": ident.get("board_part_number"),
        "pci_slot": slot,
        "slots": _slots(remembered, steps),
        "driver": _driver(board, read),
    }
    judged = gates.judge(board) if board else ()
    out["gates"] = [asdict(g) for g in judged]
    out["gate_met"] = any(g.met for g in judged)
    out["faults"] = [s.as_json() for s in steps if s.event in FAULTS]
    out["wear"] = _wear(steps, wear_now)
    out["pcie_errors"] = _pcie(steps, problems, {s["pci_slot"] for s in out["slots"]})
    directory, files, more = evidence or (None, (), 0)
    out["evidence"] = {"directory": directory, "files": list(files), "more": more}
    out["notes"] = list(notes)
    out["next_step"] = {"text": gates.NEXT_STEP, "source": gates.RMA_PROCESS}
    return out


def _first(entries: Iterable[Mapping[str, Any]], key: str) -> str | None:
    return next((str(e[key]) for e in entries if isinstance(e.get(key), str) and e[key]), None)


def _first_step_serial(steps: Iterable[Step], uuid: str) -> str | None:
    """The serial a board replacement's record gave the board."""
    for s in steps:
        if s.event == "board_replaced":
            if s.uuid and s.uuid.lower() == uuid.lower() and s.serial:
                return s.serial
            if s.old_uuid and s.old_uuid.lower() == uuid.lower() and s.old_serial:
                return s.old_serial
    return None


def _slots(remembered: Sequence[Mapping[str, Any]], steps: Sequence[Step]) -> list[dict[str, Any]]:
    """Where the board sat: each slot with the first and last time a record names it there,
    and when it left (a departure the agent remembers)."""
    found: dict[str, dict[str, Any]] = {}
    for s in steps:
        if s.pci_slot and s.event != "boot":
            seen = found.setdefault(s.pci_slot, {"first": s.time, "last": s.time, "left": None})
            seen["first"], seen["last"] = min(seen["first"], s.time), max(seen["last"], s.time)
    for e in remembered:
        where = str(e["pci_slot"])
        seen = found.setdefault(where, {"first": None, "last": None, "left": None})
        if "at" in e:  # a departure
            seen["left"] = e.get("at")
    return [{"pci_slot": k, **v} for k, v in sorted(found.items(), key=_when)]


def _when(item: tuple[str, dict[str, Any]]) -> tuple[float, str]:
    first = item[1]["first"]
    return (first if isinstance(first, int | float) else float("inf"), item[0])


def _driver(board: Board | None, read: Board | str | None) -> dict[str, Any]:
    if board is None:
        error = read if isinstance(read, str) else "the board is not on this host's bus now"
        return {"read": False, "error": error}
    return {
        "read": True,
        "error": None,
        "remapped_rows": {
            "correctable": board.remaps_correctable,
            "uncorrectable": board.remaps_uncorrectable,
            "pending": board.remap_pending,
            "failure": board.remap_failure,
            "banks": dict(board.banks),
        },
        "retired_pages": {
            "single_bit": board.pages_sbe,
            "double_bit": board.pages_dbe,
            "pending": board.pages_pending,
        },
        "sram_threshold_exceeded": board.sram_threshold_exceeded,
    }


def _wear(steps: Sequence[Step], now: tuple[str, Mapping[str, int]] | None) -> list[dict[str, Any]]:
    out = [
        {"time": s.time, "boot": s.boot, "pci_slot": s.pci_slot, "counters": dict(s.wear)}
        for s in steps
        if s.event == "wear" and s.wear is not None
    ]
    if now is not None and not any(w["counters"] == dict(now[1]) for w in out[-1:]):
        # This boot's record, where the journal (unread, or rotated) does not hold it.
        out.append({"time": None, "boot": None, "pci_slot": now[0], "counters": dict(now[1])})
    return out


def _pcie(
    steps: Sequence[Step],
    problems: Mapping[str, Sequence[Mapping[str, Any]]],
    slots: set[str],
) -> list[dict[str, Any]]:
    out = [
        {
            "pci_slot": s.pci_slot,
            "time": s.time,
            "severity": s.severity,
            "message": None,
            "pcie_device": None,
            "boot": s.boot,
        }
        for s in steps
        if s.event == "problem_start" and s.kind == _PCIE
    ]
    for slot in sorted(slots):
        for p in problems.get(slot, ()):
            if p.get("kind") == _PCIE:
                out.append(
                    {
                        "pci_slot": slot,
                        "time": p.get("since"),
                        "severity": p.get("severity"),
                        "message": p.get("message"),
                        "pcie_device": p.get("pcie_device"),
                        "boot": None,
                    }
                )
    return out


def render(packet: Mapping[str, Any]) -> str:
    """The packet for a person: the board, the gates, its story, and NVIDIA's next step."""
    lines = [f"RMA packet of board {packet['uuid']}"]
    for key, label in (
        ("serial", "serial"),
        ("name", "name"),
        ("vbios", "VBIOS"),
        ("board_part_number", "board part number"),
        ("pci_slot", "on the bus now in"),
    ):
        lines.append(f"  {label + ':':<20} {packet[key] if packet[key] is not None else '-'}")
    lines.append("slots it sat in:")
    for s in packet["slots"]:
        left = f", left {_stamp(s['left'])}" if s["left"] is not None else ""
        lines.append(f"  {s['pci_slot']:<13} {_stamp(s['first'])} .. {_stamp(s['last'])}{left}")
    lines.append("NVIDIA's gates (read from the driver now):")
    if not packet["driver"]["read"]:
        lines.append(f"  not read: {packet['driver']['error']}")
    for g in packet["gates"]:
        met = {True: "MET", False: "not met", None: "unknown"}[g["met"]]
        lines.append(f"  {g['gate']:<18} {met}: {g['reading']}")
        lines.append(f"  {'':<18} gate: {g['rule']} ({g['source']})")
    lines.append(f"faults across boots and slots: {len(packet['faults'])}")
    for f in packet["faults"]:
        what = f"Xid {f['xid']}" if f["xid"] is not None else f["kind"]
        action = f" (action: {f['action']})" if f["action"] else ""
        lines.append(f"  {_stamp(f['time'])}  {f['pci_slot']:<13} {what}{action}")
    lines.append("wear, oldest first:")
    for w in packet["wear"]:
        when = _stamp(w["time"]) if w["time"] is not None else "this boot"
        lines.append(f"  {when:<19}  {w['pci_slot']:<13} {said(w['counters']) or '-'}")
    lines.append(f"PCIe path errors: {len(packet['pcie_errors'])}")
    for p in packet["pcie_errors"]:
        device = f" at {p['pcie_device']}" if p["pcie_device"] else ""
        lines.append(f"  {_stamp(p['time'])}  {p['pci_slot']:<13} {p['severity']}{device}")
    ev = packet["evidence"]
    if ev["directory"] is not None:
        more = f" (and {ev['more']} more)" if ev["more"] else ""
        lines.append(f"evidence bundles in {ev['directory']}: {len(ev['files'])}{more}")
        lines.extend(f"  {name}" for name in ev["files"])
    lines.extend(f"note: {n}" for n in packet["notes"])
    lines.append(f"next step: {packet['next_step']['text']} ({packet['next_step']['source']})")
    # Journal fields and the driver's words, which anyone who logs may have written.
    return "\n".join(printable(line) for line in lines)


def _stamp(at: object) -> str:
    if not isinstance(at, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
