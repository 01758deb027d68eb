"""NVIDIA GPU detection on the PCI bus through sysfs.

A device is an NVIDIA GPU when its ``vendor`` is ``0x10de`` and its ``class`` is VGA
(``0x0300xx``) or 3D controller (``0x0302xx``; every data-center GPU).  NVIDIA's other
functions (HD audio, USB, UCSI, NVSwitch bridges) and other vendors' VGA (BMCs) are not GPUs.
The bus is re-read on every tick; a device that vanishes between listing and reading is
hot-plug, not an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["NVIDIA_VENDOR", "PciGpu", "is_nvidia_gpu", "module_loaded", "scan"]

NVIDIA_VENDOR = 0x10DE
_GPU_CLASSES = (0x0300, 0x0302)  # VGA compatible controller, 3D controller


@dataclass(frozen=True)
class PciGpu:
    """One NVIDIA GPU function on the PCI bus.

    ``slot`` is the sysfs BDF (``0000:41:00.0``), ``device_id`` and ``pci_class`` are the
    sysfs hex strings (``0x2335``, ``0x030200``), ``driver`` the bound driver's name
    (``nvidia``, ``nouveau``, ``vfio-pci``) or ``None`` when unbound.
    """

    slot: str
    device_id: str
    pci_class: str
    driver: str | None

    @property
    def probeable(self) -> bool:
        """Whether nvidia-smi can be asked about it: bound to ``nvidia``, or not bound yet."""
        return self.driver in (None, "nvidia")


def is_nvidia_gpu(vendor: int, pci_class: int) -> bool:
    """Classify a function from its ``vendor`` and 24-bit ``class`` values."""
    return vendor == NVIDIA_VENDOR and (pci_class >> 8) in _GPU_CLASSES


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


def scan(sysfs_root: str) -> tuple[list[PciGpu], list[str]]:
    """List the NVIDIA GPUs under ``<sysfs_root>/bus/pci/devices``, sorted by slot.

    Returns the GPUs and a list of one-line problems (an unreadable or malformed ``vendor``
    or ``class`` file), each naming the file.  A device gone between listing and reading is
    skipped silently.  A missing PCI directory is a problem, not an exception.
    """
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    problems: list[str] = []
    try:
        slots = sorted(os.listdir(base))
    except OSError as e:
        return [], [f"{base}: cannot list PCI devices: {e.strerror}"]
    gpus: list[PciGpu] = []
    for slot in slots:
        dev = os.path.join(base, slot)
        try:
            vendor_text = _read(os.path.join(dev, "vendor"))
            vendor = _hex(vendor_text)
            if vendor != NVIDIA_VENDOR:
                if vendor_text is not None and vendor is None:
                    problems.append(f"{dev}/vendor: not a hex number: {vendor_text!r}")
                continue
            class_text = _read(os.path.join(dev, "class"))
            device_text = _read(os.path.join(dev, "device"))
        except (OSError, UnicodeDecodeError) as e:
            problems.append(f"{dev}: cannot read: {getattr(e, 'strerror', None) or e}")
            continue
        pci_class = _hex(class_text)
        if class_text is None:
            continue
        if pci_class is None:
            problems.append(f"{dev}/class: not a hex number: {class_text!r}")
            continue
        if not is_nvidia_gpu(NVIDIA_VENDOR, pci_class):
            continue
        gpus.append(PciGpu(slot, device_text or "", class_text, _driver(dev)))
    return gpus, problems


def _driver(dev: str) -> str | None:
    try:
        return os.path.basename(os.readlink(os.path.join(dev, "driver")))
    except OSError:
        return None


def module_loaded(sysfs_root: str, name: str = "nvidia") -> bool:
    """Whether kernel module ``name`` is loaded (``<sysfs_root>/module/<name>`` exists)."""
    return os.path.isdir(os.path.join(sysfs_root, "module", name))
