"""A vGPU guest's licence as ``nvidia-smi -q`` prints it, and what it means (pure).

No ``--query-gpu`` field carries it: ``-q`` has, per GPU (``GPU 00000000:02:01.0``), a
``GPU Virtualization Mode`` section (``Virtualization Mode : VGPU``; ``None`` on bare metal,
``Pass-Through`` in a VM given the whole GPU) and, on a GPU whose driver is licensed
(NVIDIA's vGPU guest driver), a ``vGPU Software Licensed Product`` section::

    vGPU Software Licensed Product
        Product Name                      : NVIDIA Virtual Compute Server
        License Status                    : Unlicensed (Restricted)

(NVIDIA/gpu-operator#628; tests/data/corpus/vgpu).  ``License Status`` is ``Licensed
(Expiry: ...)``, ``Unlicensed (Unrestricted)`` (the grace period: full capability for a while,
20 minutes for vGPU for Compute in NVIDIA's licensing guide), ``Unlicensed (Restricted)``
(after it: CUDA fails, "all CUDA-capable devices are busy or unavailable", or runs
throttled, DDMAL/Rodan#1332) or, from older drivers, a plain ``Unlicensed`` (DCGM's string
for NVML's UNLICENSED and UNINITIALIZED states; throttled in NVIDIA/gpu-operator#220): it is
judged as restricted, since nothing says a grace period runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.probe.qtext import gpu_lines
from gpuagent.untrusted import capped
from gpuagent.views import Finding

__all__ = ["ARGS", "GRACE", "UNLICENSED", "Licence", "finding", "parse"]

ARGS = ("-q",)
UNLICENSED = "vgpu_unlicensed"
GRACE = "vgpu_license_grace"

_VIRTUALIZATION = "GPU Virtualization Mode"
_LICENSED = "vGPU Software Licensed Product"
_ENDS = "when nvidia-smi -q says the guest is licensed"
_ASK = "see journalctl -u nvidia-gridd"


@dataclass(frozen=True)
class Licence:
    """One GPU's sections: ``slot`` (sysfs form; ``""`` where the text names no GPU), its
    ``mode`` (``VGPU``, ``Pass-Through``, ``None``), licensed ``product`` and ``status``
    (``License Status``); None where ``-q`` has no such line."""

    slot: str
    mode: str | None = None
    product: str | None = None
    status: str | None = None

    @property
    def licensed_product(self) -> bool:
        """Whether the GPU has a licensed product at all (a vGPU guest driver's GPU)."""
        return self.status is not None


def parse(text: str) -> tuple[Licence, ...]:
    """Each GPU's licence in ``-q`` output, in its order; lines outside the two sections are
    not read (the rest of ``-q`` is the probe's, in its own query)."""
    found: dict[str, dict[str, str]] = {}
    section, depth, last = "", 0, ""
    for slot, indent, stripped in gpu_lines(text):
        if slot != last:
            section, last = "", slot  # the next GPU's sections
        if section and indent <= depth:
            section = ""
        if stripped in (_VIRTUALIZATION, _LICENSED):
            section, depth = stripped, indent
            continue
        key, colon, value = stripped.partition(":")
        if not section or not colon:
            continue
        field = _field(section, key.strip())
        if field:
            found.setdefault(slot, {})[field] = value.strip()
    return tuple(
        Licence(s, f.get("mode"), f.get("product"), f.get("status")) for s, f in found.items()
    )


def _field(section: str, key: str) -> str:
    if section == _VIRTUALIZATION:
        return "mode" if key == "Virtualization Mode" else ""
    return {"Product Name": "product", "License Status": "status"}.get(key, "")


def finding(licence: Licence, server: str) -> Finding | None:
    """The problem of a GPU's licence (None: licensed, or no licensed product); ``server``
    names where the licence comes from, for the message."""
    status = licence.status
    if status is None or status.startswith("Licensed"):
        return None
    product = capped(licence.product or "its licensed product")
    status = capped(status)
    if status == "Unlicensed (Unrestricted)":
        return Finding(
            GRACE,
            WARNING,
            "check_host",
            f"vGPU licence {status}: {product} runs in its grace period, then CUDA fails or "
            f"is throttled unless nvidia-gridd gets a licence from {server}; {_ASK}",
            ends=_ENDS,
        )
    if status.startswith("Unlicensed"):
        return Finding(
            UNLICENSED,
            CRITICAL,
            "check_host",
            f"vGPU licence {status}: {product} is restricted, CUDA fails or is throttled "
            f"until nvidia-gridd gets a licence from {server}; {_ASK}",
            ends=_ENDS,
        )
    return None
