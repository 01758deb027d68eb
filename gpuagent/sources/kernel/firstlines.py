"""The first record of each (GPU or NVSwitch, code) this boot, told once: the lines of counted
Xids and SXids that no problem's start line says, and the Xids of addresses that are no GPU
(strays), whose lines are capped and whose problems are the host's."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from gpuagent.health import WARNING
from gpuagent.logs import Event, EventLog
from gpuagent.sources.kernel.xidcount import MAX_STRAYS, First
from gpuagent.views import Finding, XidCount

__all__ = ["FirstLines"]

# Lines a boot logs for Xids of addresses that are no GPU, one each; the rest are one line.
_STRAY_LINES = 8
# Addresses that are no GPU whose Xids are host problems of their own; the rest are one.
_STRAY_FINDINGS = 5


class FirstLines:
    """Logs on ``log``; ``told`` are the lines of counted Xids and SXids (slot, kind, code)
    the agent before a restart logged this boot: the boot read again does not log them
    again."""

    def __init__(self, log: EventLog, told: Iterable[tuple[str, str, int]] = ()) -> None:
        self.log = log
        # The counted Xids' and SXids' lines logged this boot (slot, kind, code), restarts
        # included: replaced, not changed, so that the view can hand it on as it is.
        self.told: frozenset[tuple[str, str, int]] = frozenset(told)
        # Addresses Xids named that are no GPU (not on the bus, never seen, never sampled),
        # in the order of their first records.
        self.strays: dict[str, None] = {}
        # This boot's lines for them so far, and whether the line for the rest was logged.
        self._stray_lines = 0
        self._summarised = False

    def afresh(self) -> None:
        """Another journal: nothing of it was told yet."""
        self.told = frozenset()
        self.strays, self._stray_lines, self._summarised = {}, 0, False

    def tell(
        self,
        firsts: Iterable[First],
        counts: Mapping[tuple[str, int], XidCount],
        describe: Callable[[str], str],
    ) -> None:
        """Log the first record of each (GPU or NVSwitch, code) this boot that no problem's
        start line says: counted Xids, SXids, the Xids of addresses that are no GPU."""
        untold = 0
        for first in firsts:
            stray = first.slot in self.strays
            if first.finding is not None and not stray:
                continue  # the health model's start line says it
            told = (first.slot, first.kind, first.code)
            if told in self.told:
                continue  # logged before a restart: its record is no new one
            if stray and self._stray_lines >= _STRAY_LINES:
                untold += 1
                continue
            fields: dict[str, int | str]
            if first.kind == "sxid":
                level, event, fields = logging.WARNING, Event.SXID, {"sxid": first.code}
            else:
                count = counts[first.slot, first.code]
                level, event = logging.INFO, Event.XID_COUNTED
                fields = {"xid": first.code, "action": count.info.action}
                fields |= _process_fields(count, first.unit)
            self.told |= {told}
            if stray:
                self._stray_lines += 1
                line = f"Xid {first.code} names PCI {first.slot}: {describe(first.slot)}, no GPU"
                self.log(level, event, line, address=first.slot, **fields)
            else:
                self.log(level, event, first.message, pci_slot=first.slot, **fields)
        if untold:
            self._summarise()

    def _summarise(self) -> None:
        if not self._summarised:
            self._summarised = True
            self.log(
                logging.WARNING,
                Event.XID_COUNTED,
                f"Xids name more PCI addresses that are no GPU: past {_STRAY_LINES} such lines "
                "this boot they are not logged one by one, but counted in the state's host "
                "problems; check the host",
            )

    def apart(
        self, found: Mapping[str, list[Finding]], describe: Callable[[str], str], overflow: int
    ) -> dict[str, list[Finding]]:
        """``found`` (problems by slot) with the strays' set apart: under ``""``, as the
        host's problems, those of the first addresses that are no GPU, then one for the rest
        and the ``overflow`` records past the boot's cap; ``describe`` says what sysfs has at
        an address."""
        out = {s: fs for s, fs in found.items() if s not in self.strays}
        sick = [s for s in self.strays if s in found]
        host = [_stray(f, s, describe(s)) for s in sorted(sick[:_STRAY_FINDINGS]) for f in found[s]]
        if len(sick) > _STRAY_FINDINGS or overflow:
            host.append(_others(len(sick) - _STRAY_FINDINGS, overflow))
        if host:
            out[""] = host
        return out


def _process_fields(count: XidCount, unit: str | None) -> dict[str, int | str]:
    """The journal fields naming an Xid's process: ``UNIT``, ``PROCESS_PID``, ``PROCESS_COMM``
    (not ``PROCESS_NAME``: python-systemd's handler sets that field itself, to Python's
    process name, and refuses a record that has it)."""
    out: dict[str, int | str] = {}
    if unit is not None:
        out["unit"] = unit
    if count.pid is not None:
        out["process_pid"] = count.pid
    if count.process is not None:
        out["process_comm"] = count.process
    return out


def _others(addresses: int, overflow: int) -> Finding:
    """The Xids of the addresses that are no GPU past those that are problems of their own
    (``addresses`` of them), and the ``overflow`` records of those past the boot's cap
    (:data:`~gpuagent.sources.kernel.xidcount.MAX_STRAYS`, counted but not kept), as one host
    problem."""
    words = [f"Xids name {addresses} more PCI addresses that are no GPU"] if addresses > 0 else []
    if overflow:
        words.append(
            f"{overflow} records named PCI addresses that are no GPU past the {MAX_STRAYS} "
            "a boot keeps (counted, not kept)"
        )
    return Finding(
        "xid",
        WARNING,
        "check_host",
        f"{'; '.join(words)}: check the host",
        (("address", "others"),),
        ends="at the next boot",
    )


def _stray(f: Finding, slot: str, what: str) -> Finding:
    """An Xid of an address that is no GPU, as the host's problem: a warning to look at the
    host (nothing there to reset or drain), naming the address and what sysfs has there."""
    return Finding(
        f.kind,
        WARNING,
        "check_host",
        f"{f.message}; logged for PCI {slot}, which is no GPU (sysfs: {what}): check the host",
        (*f.extra, ("address", slot)),
        ends=f.ends,
    )
