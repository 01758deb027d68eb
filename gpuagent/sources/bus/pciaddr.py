"""PCI addresses in the forms the sources write them (pure).

* sysfs, the agent's own form and every key it uses: ``0000:3b:00.0`` (domain of at least four
  lower-case hex digits, bus, device, function) — a *slot*;
* nvidia-smi's ``pci.bus_id``: ``00000000:3B:00.0`` (eight-digit domain, upper case);
* the kernel driver's Xid lines: ``0000:3b:00`` (no function) — a *device* — with domains of 4
  to 8 digits, or a whole slot in its other records.
"""

from __future__ import annotations

import re

__all__ = [
    "DEVICE",
    "SLOT",
    "device_of",
    "is_bus_id",
    "parse_device",
    "path",
    "path_role",
    "slot_of",
    "sysfs_slot",
]

# Regular-expression fragments for the kernel's forms, for patterns that embed an address.
DEVICE = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
SLOT = DEVICE + r"\.[0-7]"

_BUS_ID = re.compile(r"(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<rest>[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])")
_WHERE = re.compile(rf"(?P<device>{DEVICE})(?:\.(?P<function>[0-7]))?")
_FUNCTION = re.compile(SLOT, re.ASCII)


def sysfs_slot(bus_id: str) -> str:
    """nvidia-smi's ``pci.bus_id`` (``00000000:41:00.0``) in sysfs form (``0000:41:00.0``):
    every spelling of one slot gives the same one.

    A bus id without a domain (``41:00.0``) is in domain 0, as lspci writes it; text that is
    no bus id is returned lower-cased as it is.
    """
    m = _BUS_ID.fullmatch(bus_id.strip().lower())
    if m is None:
        return bus_id.strip().lower()
    return f"{int(m['domain'] or '0', 16):04x}:{m['rest']}"


def is_bus_id(text: str) -> bool:
    """Whether ``text`` (lower case) is a ``pci.bus_id`` nvidia-smi could print."""
    return _BUS_ID.fullmatch(text) is not None


def parse_device(text: str) -> tuple[str, int | None] | None:
    """A kernel record's address (``0000:3B:00`` or ``00000000:3b:00.1``) as the device in
    sysfs form (``0000:3b:00``) and the function where it is given; None if it is not one."""
    m = _WHERE.fullmatch(text)
    if m is None:
        return None
    domain, bus, dev = m.group("device").lower().split(":")
    function = m.group("function")
    return f"{int(domain, 16):04x}:{bus}:{dev}", None if function is None else int(function)


def slot_of(text: str) -> str:
    """A kernel record's whole slot (``0000:3B:00.0``) in sysfs form; function 0 if absent."""
    device, function = parse_device(text) or (text.lower(), 0)
    return f"{device}.{function or 0}"


def device_of(slot: str) -> str:
    """The device of a sysfs slot: ``0000:3b:00.0`` -> ``0000:3b:00``."""
    return slot.rpartition(".")[0]


def path(resolved: str) -> tuple[str, ...]:
    """The PCI functions from the root port down to a device, as its sysfs directory resolved
    (``/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0``) names them: ``("0000:00:01.0",
    "0000:01:00.0")``; the device alone where it hangs off the host bridge (a root-complex
    integrated device, a VM's)."""
    return tuple(part for part in resolved.split("/") if _FUNCTION.fullmatch(part))


def path_role(position: int, length: int) -> str:
    """What the function at ``position`` of a GPU's path of ``length`` is, for a message."""
    if position == length - 1:
        return "the GPU itself"
    if position == 0:
        return "its root port"
    return "a bridge on its path (PCIe switch or riser)"
