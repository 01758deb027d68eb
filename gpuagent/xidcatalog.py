"""What each Xid code means and what an operator should do about it (pure data).

The facts (short names, NVIDIA's resolution buckets) come from NVIDIA's Xid catalog
(docs.nvidia.com/deploy/xid-errors), its memory-error and debug guides, and the NVML recovery
actions; the advice is in our own words.  ``severity`` says what a code does to a GPU's health:

* ``none``: counted, but the GPU stays healthy: application-class Xids (13, 31, 43, 45, 68 …)
  hurt one process, not the GPU, and detail lines of another Xid (171, 172 follow 48);
* ``warning`` / ``critical``: a problem of kind ``xid`` on the GPU until the next boot.

Xid 94/95, 144-150 and 154 carry their severity or action in the line itself; see
:func:`gpuagent.xid.assess`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATALOG", "NONE", "RECOVERY_ACTIONS", "XidInfo", "lookup"]

# Counted only: the GPU stays healthy.
NONE = "none"


@dataclass(frozen=True)
class XidInfo:
    """One Xid code: ``name`` (short), ``severity`` (``none``, ``warning``, ``critical``),
    ``action`` (one of :data:`gpuagent.health.ACTIONS`) and ``advice`` (one sentence)."""

    name: str
    severity: str
    action: str
    advice: str


def _app(name: str, advice: str, action: str = "restart_app") -> XidInfo:
    return XidInfo(name, NONE, action, advice)


def _warn(name: str, advice: str, action: str = "none") -> XidInfo:
    return XidInfo(name, "warning", action, advice)


def _crit(name: str, advice: str, action: str = "reset_gpu") -> XidInfo:
    return XidInfo(name, "critical", action, advice)


_RESET = "the GPU needs a reset (nvidia-smi -r, or reboot the host)"
_NVLINK5 = "the line says whether it was fatal (reset the GPU) or not (watch the link)"

CATALOG: dict[int, XidInfo] = {
    8: _app("GPU stopped processing", "a channel stopped making progress; restart the job"),
    13: _app("Graphics engine exception", "a CUDA context faulted, usually the job's own bug"),
    31: _app("GPU memory page fault", "a job touched an unmapped GPU address; restart it"),
    32: _app("Invalid push buffer stream", "a job sent the GPU a bad command stream"),
    43: _app("GPU stopped processing", "one job's channel was reset; the GPU is fine", "none"),
    45: _app("Preemptive cleanup", "channels of a failed or exiting job were torn down", "none"),
    46: _crit("GPU stopped processing", f"the whole GPU stopped responding; {_RESET}"),
    48: _crit("Double-bit ECC error", f"uncorrectable memory error; {_RESET}"),
    54: _crit(
        "Auxiliary power not connected",
        "the board lacks auxiliary power: drain the host and check cabling and PSU",
        "drain_and_rma",
    ),
    61: _crit("Internal micro-controller breakpoint", f"GPU firmware stopped; {_RESET}"),
    62: _crit("Internal micro-controller halt", f"GPU firmware halted; {_RESET}"),
    63: _warn(
        "Row remapping pending",
        "a bad memory row was recorded; the repair takes effect at the next GPU reset",
    ),
    64: _crit(
        "Row remapping failure",
        "the GPU could not remap a bad memory row: drain it and have the board replaced",
        "drain_and_rma",
    ),
    68: _app("Video decoder exception", "the NVDEC engine faulted in one job; restart it"),
    69: _app("Graphics engine class error", "a job sent a method the GPU rejects"),
    74: _crit("NVLink error", f"an NVLink link failed; {_RESET}, then check the link"),
    79: _crit(
        "GPU has fallen off the bus",
        "the GPU no longer answers on PCIe; reboot the host, and if it repeats check power, "
        "cooling and the slot",
        "reboot",
    ),
    92: _warn("High single-bit ECC error rate", "memory is correcting many errors; watch it"),
    94: _app("Contained ECC error", "an uncorrectable memory error hit only one job"),
    95: _crit("Uncontained ECC error", f"an uncorrectable memory error hit every job; {_RESET}"),
    109: _crit("Context switch timeout", f"the GPU failed to switch contexts; {_RESET}"),
    119: _crit("GSP RPC timeout", f"the GPU's firmware processor stopped answering; {_RESET}"),
    120: _crit("GSP error", f"the GPU's firmware processor faulted; {_RESET}"),
    121: _warn("C2C link error", "a recovered CPU-GPU link error; report it if it repeats"),
    122: _app("SPI PMU RPC read failure", "a firmware read failed; report it", "none"),
    123: _app("SPI PMU RPC write failure", "a firmware write failed; report it", "none"),
    136: _crit("NVLink training failure", f"an NVLink link did not come up; {_RESET}"),
    137: _warn("NVLink privilege error", "a refused NVLink register access; see the other Xids"),
    140: _crit("Unrecovered ECC error", f"an ECC error escaped recovery; {_RESET}"),
    143: _crit("GPU initialization error", f"the GPU failed to initialise; {_RESET}"),
    144: _warn("NVLink SAW error", _NVLINK5, "reset_gpu"),
    145: _warn("NVLink RLW error", _NVLINK5, "reset_gpu"),
    146: _warn("NVLink TLW error", _NVLINK5, "reset_gpu"),
    147: _warn("NVLink TREX error", _NVLINK5),
    148: _warn("NVLink power control error", _NVLINK5),
    149: _crit("NVLink network interface error", _NVLINK5),
    150: _crit("NVLink management watchdog", f"the NVLink firmware watchdog fired; {_RESET}"),
    154: _crit("GPU recovery action changed", "the driver says which recovery the GPU needs"),
    155: _crit("NVLink software-defined error", f"NVLink stopped by software policy; {_RESET}"),
    156: _warn("Resource retirement event", "a unit was retired; it takes effect at reset"),
    157: _warn("Resource retirement failure", "retiring a unit failed; report it if it repeats"),
    158: _crit("GPU fatal timeout", f"an internal timeout was fatal; {_RESET}"),
    171: _app("Uncorrectable DRAM error detail", "detail of the Xid 48 beside it", "reset_gpu"),
    172: _app("Uncorrectable SRAM error detail", "detail of the Xid 48 beside it", "reset_gpu"),
}

# Xid 154 "... to 0x<n> (...)": NVML's nvmlDeviceGpuRecoveryAction_t as gpuagent's actions.
# 5 (recover the IMEX domain) has no action of its own: the host's fabric needs looking at.
RECOVERY_ACTIONS = {
    0: "none",
    1: "reset_gpu",
    2: "reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "check_host",
    6: "reset_gpu",
    7: "reboot",
}


def lookup(code: int) -> XidInfo:
    """The catalog entry of ``code``; an unknown code is a warning naming it."""
    info = CATALOG.get(code)
    if info is not None:
        return info
    return _warn(
        "Unknown Xid", f"not in gpuagent's catalog; look Xid {code} up in NVIDIA's Xid catalog"
    )
