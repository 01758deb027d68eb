"""NVIDIA GPU detection on the PCI bus through sysfs.

A device is an NVIDIA GPU when its ``vendor`` is ``0x10de`` and its ``class`` is VGA
(``0x0300xx``) or 3D controller (``0x0302xx``; every data-center GPU).  NVIDIA's other
functions (HD audio, USB, UCSI, NVSwitch bridges) and other vendors' VGA (BMCs) are not GPUs.
The bus is re-read on every tick; a device that vanishes between listing and reading is
hot-plug, not an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gpuagent.sources.bus.pciaddr import path
from gpuagent.views import PciGpu

__all__ = [
    "NVIDIA_VENDOR",
    "Scanner",
    "is_gpu",
    "is_nvidia_gpu",
    "is_nvswitch",
    "module_loaded",
    "nvswitches",
    "path_of",
    "scan",
]

NVIDIA_VENDOR = 0x10DE
_GPU_CLASSES = (0x0300, 0x0302)  # VGA compatible controller, 3D controller
# NVSwitches show up as NVIDIA functions of class "Bridge / other" (0x0680xx).
_NVSWITCH_CLASS = 0x0680


def is_nvidia_gpu(vendor: int, pci_class: int) -> bool:
    """Classify a function from its ``vendor`` and 24-bit ``class`` values."""
    return vendor == NVIDIA_VENDOR and (pci_class >> 8) in _GPU_CLASSES


def is_nvswitch(vendor: int, pci_class: int) -> bool:
    """Whether a function with ``vendor`` and 24-bit ``class`` is an NVSwitch."""
    return vendor == NVIDIA_VENDOR and (pci_class >> 8) == _NVSWITCH_CLASS


def _read(path: str) -> str | None:
    # Raw os.open/os.read: a tick reads ~200 of these, and open() costs three times as much.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.read(fd, 64).decode("ascii").strip()
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def _hex(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


# What a function is: its (device id, class) when it is an NVIDIA GPU, else None.
_Identity = tuple[str, str] | None


class Scanner:
    """Scans ``<sysfs_root>/bus/pci/devices`` every tick, remembering what each function is.

    A function's vendor and class cannot change while its sysfs entry lives; a device that
    is removed and another that appears in its slot get a new entry, with a new inode number,
    which is read afresh.  The number comes with the listing (``d_ino``: no stat), and sysfs
    never gives it to another entry (kernfs's 64-bit ids carry a generation).  So a tick
    lists the bus and, while the listing is the last one, reads only the ``driver`` link of
    each GPU: on a GPU-less host with 200 functions, one ``getdents`` and no file opened.
    Functions whose files could not be read are not remembered, so their problem is seen
    again on every tick.
    """

    def __init__(self, sysfs_root: str) -> None:
        self.root = sysfs_root
        self.base = os.path.join(sysfs_root, "bus", "pci", "devices")
        # Each function read, by slot: the inode number of the entry it was read from and
        # what it is.
        self._known: dict[str, tuple[int, _Identity]] = {}
        # The last listing (slot -> inode number) while every function in it is known, and
        # its GPUs (slot, device id, class) in slot order.
        self._listing: dict[str, int] | None = None
        self._gpus: list[tuple[str, str, str]] = []

    def scan(self) -> tuple[list[PciGpu], list[str]]:
        """The NVIDIA GPUs on the bus, sorted by slot, and one-line problems naming files.

        A device gone between listing and reading is skipped silently; a missing PCI
        directory is a problem, not an exception.
        """
        try:
            with os.scandir(self.base) as it:
                listing = {e.name: e.inode() for e in it}
        except OSError as e:
            return [], [f"{self.base}: cannot list PCI devices: {e.strerror}"]
        problems = self._identify(listing) if listing != self._listing else []
        gpus = [
            PciGpu(slot, device_id, pci_class, _driver(os.path.join(self.base, slot)))
            for slot, device_id, pci_class in self._gpus
        ]
        return gpus, problems

    def _identify(self, listing: dict[str, int]) -> list[str]:
        """Learn what the functions of ``listing`` are, reading those not known from the
        same entry; returns the problems of those that could not be read."""
        problems: list[str] = []
        known: dict[str, tuple[int, _Identity]] = {}
        for slot in sorted(listing):
            inode = listing[slot]
            cached = self._known.get(slot)
            if cached is not None and cached[0] == inode:
                ident = cached[1]
            else:
                try:
                    ident = _identify(os.path.join(self.base, slot))
                except _Unreadable as e:
                    problems.append(str(e))
                    continue
                except _Gone:
                    continue  # gone between listing and reading
            known[slot] = (inode, ident)
        self._known = known
        self._listing = listing if len(known) == len(listing) else None
        self._gpus = [(slot, *ident) for slot, (_, ident) in known.items() if ident is not None]
        return problems


class _Unreadable(Exception):
    """A function's file that exists but cannot be used; ``str()`` names it."""


class _Gone(Exception):
    """A function that vanished while it was read (hot-plug)."""


def _identify(dev: str) -> tuple[str, str] | None:
    """(device id, class) of an NVIDIA GPU at ``dev``, None for any other function."""
    try:
        vendor_text = _read(os.path.join(dev, "vendor"))
        vendor = _hex(vendor_text)
        if vendor != NVIDIA_VENDOR:
            if vendor_text is not None and vendor is None:
                raise _Unreadable(f"{dev}/vendor: not a hex number: {vendor_text!r}")
            if vendor_text is None:
                raise _Gone
            return None
        class_text = _read(os.path.join(dev, "class"))
        device_text = _read(os.path.join(dev, "device"))
    except (OSError, UnicodeDecodeError) as e:
        raise _Unreadable(f"{dev}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if class_text is None:
        raise _Gone
    pci_class = _hex(class_text)
    if pci_class is None:
        raise _Unreadable(f"{dev}/class: not a hex number: {class_text!r}")
    if not is_nvidia_gpu(NVIDIA_VENDOR, pci_class):
        return None
    return device_text or "", class_text


def scan(sysfs_root: str) -> tuple[list[PciGpu], list[str]]:
    """One scan without memory (``gpuagent detect``); see :meth:`Scanner.scan`."""
    return Scanner(sysfs_root).scan()


def is_gpu(sysfs_root: str, slot: str) -> bool:
    """Whether the function at ``slot`` (a checked slot name) is an NVIDIA GPU; False for
    one that is absent, gone or unreadable."""
    try:
        return _identify(os.path.join(sysfs_root, "bus", "pci", "devices", slot)) is not None
    except (_Unreadable, _Gone):
        return False


def nvswitches(sysfs_root: str) -> tuple[list[str], list[str]]:
    """The slots of the NVSwitches on the bus (sorted) and one-line problems naming files.

    Read afresh on each call (two small files per function): NVSwitches do not come and go,
    so a caller needs this rarely (the fabric manager check), not every tick.
    """
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        slots = sorted(os.listdir(base))
    except OSError as e:
        return [], [f"{base}: cannot list PCI devices: {e.strerror}"]
    found: list[str] = []
    problems: list[str] = []
    for slot in slots:
        dev = os.path.join(base, slot)
        try:
            vendor = _hex(_read(os.path.join(dev, "vendor")))
            if vendor != NVIDIA_VENDOR:
                continue
            pci_class = _hex(_read(os.path.join(dev, "class")))
        except (OSError, UnicodeDecodeError) as e:
            problems.append(f"{dev}: cannot read: {getattr(e, 'strerror', None) or e}")
            continue
        if pci_class is not None and is_nvswitch(vendor, pci_class):
            found.append(slot)
    return found, problems


def _driver(dev: str) -> str | None:
    try:
        return os.path.basename(os.readlink(os.path.join(dev, "driver")))
    except OSError:
        return None


def module_loaded(sysfs_root: str, name: str = "nvidia") -> bool:
    """Whether kernel module ``name`` is loaded (``<sysfs_root>/module/<name>`` exists)."""
    return os.path.isdir(os.path.join(sysfs_root, "module", name))


# PCI base classes a stray address may name (the PCI code and ID assignment spec).
_CLASS_NAMES = {0x06: "a bridge", 0x03: "a display controller", 0x02: "a network controller"}


def describe(sysfs_root: str, slot: str) -> str:
    """What sits at ``slot`` per ``<sysfs_root>/bus/pci/devices/<slot>/class``: ``a bridge
    (class 0x060400)``, ``a device of class 0x…``, or ``nothing`` (no such function)."""
    try:
        text = _read(os.path.join(sysfs_root, "bus", "pci", "devices", slot, "class"))
    except OSError:
        text = None
    value = _hex(text)
    if value is None:
        return "nothing"
    name = _CLASS_NAMES.get(value >> 16, "a device")
    return f"{name} (class 0x{value:06x})"


def path_of(
    sysfs_root: str, slot: str, resolve: Callable[[str], str] = os.path.realpath
) -> tuple[str, ...]:
    """The PCIe path of the function at ``slot``, root port first, the function last
    (:func:`gpuagent.sources.bus.pciaddr.path` of its sysfs entry resolved): the function alone
    where its entry is not under its bridges (a flat tree)."""
    found = path(resolve(os.path.join(sysfs_root, "bus", "pci", "devices", slot)))
    return found if found and found[-1] == slot else (slot,)
