"""Fake sysfs trees: PCI devices with ``vendor``, ``device``, ``class`` and a ``driver`` link.

Trees are built from the real ``lspci`` listings in ``data/corpus/pci`` (one per machine
model) or as N identical NVIDIA GPUs for scenario tests.
"""

from __future__ import annotations

import os
import re
import shutil

NVIDIA = 0x10DE
H200 = 0x2335
CLASS_3D = 0x030200

# lspci without -nn names classes and vendors; these are pci.ids' names for the ones that
# appear in the corpus listings.
CLASS_NAMES = {
    "VGA compatible controller": 0x0300,
    "3D controller": 0x0302,
    "Display controller": 0x0380,
    "Bridge": 0x0680,
    "PCI bridge": 0x0604,
    "Host bridge": 0x0600,
    "ISA bridge": 0x0601,
    "Audio device": 0x0403,
    "USB controller": 0x0C03,
    "Serial bus controller": 0x0C80,
    "Ethernet controller": 0x0200,
    "Infiniband controller": 0x0207,
    "Non-Volatile memory controller": 0x0108,
    "SATA controller": 0x0106,
    "Serial Attached SCSI controller": 0x0107,
    "System peripheral": 0x0880,
    "RAM memory": 0x0500,
    "SMBus": 0x0C05,
    "Communication controller": 0x0780,
    "Signal processing controller": 0x1180,
}
VENDOR_NAMES = {
    "NVIDIA Corporation": NVIDIA,
    "Intel Corporation": 0x8086,
    "Matrox Electronics Systems Ltd.": 0x102B,
    "ASPEED Technology, Inc.": 0x1A03,
    "Mellanox Technologies": 0x15B3,
    "Broadcom Inc. and subsidiaries": 0x14E4,
    "Broadcom / LSI": 0x1000,
    "Micron Technology Inc": 0x1344,
    "PLDA": 0x1556,
}
_NN = re.compile(
    r"^(?:(?P<dom>[0-9a-f]{4}):)?(?P<bdf>[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) "
    r".*?\[(?P<cls>[0-9a-f]{4})\]: .*\[(?P<ven>[0-9a-f]{4}):(?P<dev>[0-9a-f]{4})\]"
)
_PLAIN = re.compile(
    r"^(?:(?P<dom>[0-9a-f]{4}):)?(?P<bdf>[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) (?P<cls>[^:\[]+?)"
    r"(?: \[(?P<clsnum>[0-9a-f]{4})\])?: (?P<rest>.*)$"
)


def add_device(
    root: str, slot: str, vendor: int, device: int, pci_class: int, driver: str | None = None
) -> str:
    """Create ``<root>/bus/pci/devices/<slot>`` and return its path."""
    dev = os.path.join(root, "bus", "pci", "devices", slot)
    os.makedirs(dev, exist_ok=True)
    for name, value in (
        ("vendor", f"0x{vendor:04x}"),
        ("device", f"0x{device:04x}"),
        ("class", f"0x{pci_class:06x}"),
    ):
        with open(os.path.join(dev, name), "w", encoding="ascii") as f:
            f.write(value + "\n")
    bind(root, slot, driver)
    return dev


def nest(root: str, slot: str, above: tuple[str, ...]) -> str:
    """Lay ``slot``'s entry out as sysfs does: its directory under ``devices/`` below its
    bridges ``above`` (root port first, each an Intel PCI bridge with its own link), and
    ``bus/pci/devices/<slot>`` a link to it; returns the directory."""
    links = os.path.join(root, "bus", "pci", "devices")
    where = os.path.join(root, "devices", f"pci{slot.split(':', maxsplit=1)[0]}:00")
    for bridge in above:
        where = os.path.join(where, bridge)
        if not os.path.lexists(os.path.join(links, bridge)):
            os.makedirs(where)
            for name, value in (("vendor", "0x8086"), ("device", "0x6f04"), ("class", "0x060400")):
                with open(os.path.join(where, name), "w", encoding="ascii") as f:
                    f.write(value + "\n")
            os.symlink(where, os.path.join(links, bridge))
    where = os.path.join(where, slot)
    os.rename(os.path.join(links, slot), where)
    os.symlink(where, os.path.join(links, slot))
    return where


def bind(root: str, slot: str, driver: str | None) -> None:
    """Point ``slot``'s ``driver`` link at ``driver`` (None: unbound)."""
    link = os.path.join(root, "bus", "pci", "devices", slot, "driver")
    if os.path.lexists(link):
        os.unlink(link)
    if driver is not None:
        target = os.path.join(root, "bus", "pci", "drivers", driver)
        os.makedirs(target, exist_ok=True)
        os.symlink(target, link)


def set_module(root: str, loaded: bool, name: str = "nvidia") -> None:
    """Make ``<root>/module/<name>`` exist or not."""
    path = os.path.join(root, "module", name)
    if loaded:
        os.makedirs(path, exist_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def remove_device(root: str, slot: str) -> None:
    """Unplug ``slot``.  Its directory is moved aside rather than deleted: sysfs never gives
    a new device an old entry's inode, while ext4 would hand the freed one straight back."""
    graveyard = os.path.join(root, ".removed")
    os.makedirs(graveyard, exist_ok=True)
    os.rename(
        os.path.join(root, "bus", "pci", "devices", slot),
        os.path.join(graveyard, f"{slot}.{len(os.listdir(graveyard))}"),
    )


def gpu_slots(n: int) -> list[str]:
    """N slots the way an HGX board numbers them."""
    buses = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
    return [f"0000:{(buses[i] if i < len(buses) else 0xE0 + i):02x}:00.0" for i in range(n)]


def gpu_host(root: str, n: int, *, driver: str | None = "nvidia", module: bool = True) -> list[str]:
    """A host with ``n`` H200s (3D controllers), an ASPEED BMC and NVIDIA's audio function."""
    slots = gpu_slots(n)
    for slot in slots:
        add_device(root, slot, NVIDIA, H200, CLASS_3D, driver)
    add_device(root, "0000:03:00.0", 0x1A03, 0x2000, 0x030000, "ast")
    add_device(root, "0000:00:1f.3", 0x8086, 0x51C8, 0x040300, "snd_hda_intel")
    os.makedirs(os.path.join(root, "bus", "pci", "devices"), exist_ok=True)
    set_module(root, module)
    return slots


def from_lspci(root: str, listing: str) -> int:
    """Build a tree from an lspci (``-nn``, plain or ``-vvv``) listing; returns devices made.

    NVIDIA GPUs are bound to ``nvidia`` and the module is marked loaded.
    """
    count = 0
    with open(listing, encoding="utf-8") as f:
        for line in f:
            parsed = _parse(line.rstrip("\n"))
            if parsed is None:
                continue
            slot, vendor, device, cls = parsed
            gpu = vendor == NVIDIA and cls >> 8 in (0x0300, 0x0302)
            add_device(root, slot, vendor, device, cls, "nvidia" if gpu else None)
            count += 1
    os.makedirs(os.path.join(root, "bus", "pci", "devices"), exist_ok=True)
    set_module(root, True)
    return count


def _parse(line: str) -> tuple[str, int, int, int] | None:
    if not line or line[0].isspace():
        return None
    m = _NN.match(line)
    if m:
        slot = f"{m['dom'] or '0000'}:{m['bdf']}"
        return slot, int(m["ven"], 16), int(m["dev"], 16), int(m["cls"], 16) << 8
    m = _PLAIN.match(line)
    if not m:
        return None
    slot = f"{m['dom'] or '0000'}:{m['bdf']}"
    cls = int(m["clsnum"], 16) if m["clsnum"] else CLASS_NAMES.get(m["cls"], 0xFF00)
    rest = m["rest"]
    vendor = next((v for name, v in VENDOR_NAMES.items() if rest.startswith(name)), 0xFFFF)
    dev = re.search(r"\bDevice ([0-9a-f]{4})\b", rest)
    return slot, vendor, int(dev[1], 16) if dev else 0, cls << 8
