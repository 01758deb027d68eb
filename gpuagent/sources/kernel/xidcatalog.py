"""What each Xid code means and what an operator should do about it (pure data).

The facts (short names, NVIDIA's resolution buckets) come from NVIDIA's Xid catalog
(docs.nvidia.com/deploy/xid-errors), its memory-error and debug guides, and the NVML recovery
actions; the advice is in our own words.  ``severity`` says what a code does to a GPU's health:

* ``none``: counted, but the GPU stays healthy: application-class Xids (13, 31, 43, 45, 68 …)
  hurt one process, not the GPU, and detail lines of another Xid (171, 172 follow 48);
* ``warning`` / ``critical``: a problem of kind ``xid`` on the GPU (a warning ends after
  ``xid_warning_hold`` without a recurrence, see
  :func:`gpuagent.sources.kernel.xidcount.finding`; a
  critical one holds until the next boot).

Every code of NVIDIA's catalog is here; where gpuagent departs from NVIDIA's immediate
resolution bucket, the entry's ``why`` says why (``tests/test_xidcatalog.py`` checks each
code against the reference table, ``tests/data/reference/xid-catalog.tsv``).  Xid 94/95,
144-150 and 154 carry their severity or action in the line itself; see
:func:`gpuagent.sources.kernel.xid.assess`.  A site's ``[xid]`` table
(:class:`gpuagent.configkeys.Override`, applied by :func:`override`) has the last word.
"""

from __future__ import annotations

from dataclasses import replace

from gpuagent.configkeys import Override
from gpuagent.views import XidInfo

__all__ = [
    "CATALOG",
    "NONE",
    "RECOVERY_ACTIONS",
    "advice",
    "lookup",
    "override",
]

# Counted only: the GPU stays healthy.
NONE = "none"


def _app(name: str, advice: str, action: str = "restart_app", why: str = "") -> XidInfo:
    return XidInfo(name, NONE, action, advice, why)


def _ignore(name: str, advice: str) -> XidInfo:
    """NVIDIA's IGNORE bucket: counted, no problem, nothing to do."""
    return XidInfo(name, NONE, "none", advice)


def _warn(name: str, advice: str, action: str = "none", why: str = "") -> XidInfo:
    return XidInfo(name, "warning", action, advice, why)


def _crit(name: str, advice: str, action: str = "reset_gpu", why: str = "") -> XidInfo:
    return XidInfo(name, "critical", action, advice, why)


# SLOT is the GPU's PCI slot, put in by the line that says it (advice): without -i,
# nvidia-smi -r resets every GPU of the host.
_RESET = "the GPU needs a reset (nvidia-smi -r -i SLOT, or reboot the host)"
_NVLINK5 = "the line says whether it was fatal (reset the GPU) or not (watch the link)"
_ENGINE = "an engine faulted in one job; restart the job, the GPU is fine"
_STRICTER = "NVIDIA files it under IGNORE for the running work; "
# Engines whose faults hurt one job only (NVIDIA: RESTART_APP), by Xid code.
_ENGINES = {
    39: "Copy engine 0",
    40: "Copy engine 1",
    41: "Copy engine 2",
    60: "Video processor (SEC2)",
    70: "Copy engine 3",
    71: "Copy engine 4",
    72: "Copy engine 5",
    75: "Copy engine 6",
    76: "Copy engine 7",
    77: "Copy engine 8",
    82: "JPEG decoder 0 (NVJPG0)",
    83: "Video decoder 1 (NVDEC1)",
    84: "Video decoder 2 (NVDEC2)",
    85: "Copy engine 9",
    86: "Optical flow accelerator (OFA)",
    88: "Video decoder 3 (NVDEC3)",
    89: "Video decoder 4 (NVDEC4)",
    96: "Video decoder 5 (NVDEC5)",
    97: "Video decoder 6 (NVDEC6)",
    98: "Video decoder 7 (NVDEC7)",
    **{99 + i: f"JPEG decoder {1 + i} (NVJPG{1 + i})" for i in range(7)},
    **{126 + i: f"Copy engine {10 + i}" for i in range(10)},
    139: "Optical flow accelerator 1 (OFA1)",
}

CATALOG: dict[int, XidInfo] = {
    8: _app("GPU stopped processing", "a channel stopped making progress; restart the job"),
    11: _app("Invalid push buffer stream", "a job sent the GPU a bad command stream"),
    13: _app("Graphics engine exception", "a CUDA context faulted, usually the job's own bug"),
    25: _app("Invalid push buffer stream", "a job sent the GPU an illegal notifier"),
    31: _app("GPU memory page fault", "a job touched an unmapped GPU address; restart it"),
    32: _app("Invalid push buffer stream", "a job sent the GPU a bad command stream"),
    37: _ignore("Driver firmware error", "an unimplemented firmware method; nothing to do"),
    38: _ignore("Driver firmware error", "a firmware watchdog timeout; report it if it repeats"),
    **{code: _app(f"{engine} exception", _ENGINE) for code, engine in _ENGINES.items()},
    43: _app("GPU stopped processing", "one job's channel was reset; the GPU is fine", "none"),
    44: _ignore("Graphics engine fault during context switch", "counted; nothing to do"),
    45: _app("Preemptive cleanup", "channels of a failed or exiting job were torn down", "none"),
    46: _crit("GPU stopped processing", f"the whole GPU stopped responding; {_RESET}"),
    48: _crit("Double-bit ECC error", f"uncorrectable memory error; {_RESET}"),
    54: _crit(
        "Auxiliary power not connected",
        "the board lacks auxiliary power: check its seating and its power cables",
        "check_host",
        why="NVIDIA's bucket is CHECK_MECHANICALS (hands on the board, not a replacement); "
        "the reference table's drain_and_rma comes before anyone has looked",
    ),
    61: _crit("Internal micro-controller breakpoint", f"GPU firmware stopped; {_RESET}"),
    62: _crit("Internal micro-controller halt", f"GPU firmware halted; {_RESET}"),
    63: _warn(
        "Row remapping pending",
        "a bad memory row was recorded; the repair takes effect at the next GPU reset",
        why=_STRICTER + "the repair waits for a reset, so the GPU is a warning until then "
        "(or for xid_warning_hold)",
    ),
    64: _crit(
        "Row remapping failure",
        "the GPU could not remap a bad memory row: drain it and have the board replaced",
        "drain_and_rma",
        why="NVIDIA's immediate bucket is RESET_GPU, but its memory-error guide makes a remap "
        "failure an RMA criterion: after the reset the memory can no longer heal itself",
    ),
    66: _ignore("Illegal access by driver", "a register access the firmware refused; counted"),
    67: _ignore("Illegal access by driver", "a verification violation; counted"),
    68: _app("Video decoder exception", "the NVDEC engine faulted in one job; restart it"),
    69: _app("Graphics engine class error", "a job sent a method the GPU rejects"),
    74: _crit("NVLink error", f"an NVLink link failed; {_RESET}, then check the link"),
    78: _warn("vGPU start error", "a vGPU failed to start; update the vGPU software"),
    79: _crit(
        "GPU has fallen off the bus",
        "the GPU no longer answers on PCIe; reboot the host, and if it repeats check power, "
        "cooling and the slot",
        "reboot",
    ),
    80: _app("Corrupted data sent to GPU", "a job sent the GPU corrupted data; restart it"),
    92: _warn(
        "High single-bit ECC error rate",
        "memory is correcting many errors; watch it",
        why=_STRICTER + "many corrected errors are worth a look before they turn uncorrectable",
    ),
    93: _ignore("InfoROM wear limit", "a non-fatal violation of the InfoROM's wear limit"),
    94: _app("Contained ECC error", "an uncorrectable memory error hit only one job"),
    95: _crit("Uncontained ECC error", f"an uncorrectable memory error hit every job; {_RESET}"),
    106: _ignore("SMBPBI test message", "a test message from the board's management interface"),
    107: _ignore("SMBPBI test message", "a test message from the board's management interface"),
    109: _crit("Context switch timeout", f"the GPU failed to switch contexts; {_RESET}"),
    110: _crit("Security fault", f"the GPU reported a security fault; {_RESET}"),
    119: _crit("GSP RPC timeout", f"the GPU's firmware processor stopped answering; {_RESET}"),
    120: _crit("GSP error", f"the GPU's firmware processor faulted; {_RESET}"),
    121: _warn(
        "C2C link error",
        "a recovered CPU-GPU link error; report it if it repeats",
        why=_STRICTER + "the CPU-GPU link is worth watching while it errs",
    ),
    122: _app("SPI PMU RPC read failure", "a firmware read failed; report it", "none"),
    123: _app("SPI PMU RPC write failure", "a firmware write failed; report it", "none"),
    136: _crit("NVLink training failure", f"an NVLink link did not come up; {_RESET}"),
    137: _warn(
        "NVLink privilege error",
        "a refused NVLink register access; see the other Xids",
        why=_STRICTER + "it comes with other NVLink faults, and says where to look",
    ),
    140: _crit("Unrecovered ECC error", f"an ECC error escaped recovery; {_RESET}"),
    141: _ignore("CUDA fast path error", "counted; nothing to do"),
    142: _warn("NVENC3 error", "a video encoder engine error; report it if it repeats"),
    143: _crit("GPU initialization error", f"the GPU failed to initialise; {_RESET}"),
    144: _warn("NVLink SAW error", _NVLINK5, "reset_gpu"),
    145: _warn("NVLink RLW error", _NVLINK5, "reset_gpu"),
    146: _warn("NVLink TLW error", _NVLINK5, "reset_gpu"),
    147: _warn("NVLink TREX error", _NVLINK5),
    148: _warn("NVLink power control error", _NVLINK5),
    149: _crit("NVLink network interface error", _NVLINK5),
    150: _crit("NVLink management watchdog", f"the NVLink firmware watchdog fired; {_RESET}"),
    151: _crit(
        "Key rotation error",
        "confidential computing could not rotate its keys; reboot the host (or the VM)",
        "reboot",
    ),
    152: _ignore("DLA SMMU error", "counted; nothing to do"),
    153: _ignore("DLA timeout", "counted; nothing to do"),
    154: _crit("GPU recovery action changed", "the driver says which recovery the GPU needs"),
    155: _crit("NVLink software-defined error", f"NVLink stopped by software policy; {_RESET}"),
    156: _warn(
        "Resource retirement event",
        "a unit was retired; it takes effect at the next GPU reset",
        "reset_gpu",
    ),
    157: _warn(
        "Resource retirement failure",
        "retiring a unit failed; report it if it repeats",
        why=_STRICTER + "a unit that could not be retired may fault again",
    ),
    158: _crit("GPU fatal timeout", f"an internal timeout was fatal; {_RESET}"),
    159: _warn("CHI non-data error", "a coherent-interconnect error; see the other Xids"),
    160: _ignore("Channel retirement event", "a channel was retired; counted"),
    161: _ignore("Channel retirement failure", "retiring a channel failed; counted"),
    162: _warn("Power smoothing re-engaged", "the power smoothing circuit works again"),
    163: _warn("Power smoothing disengaged", "the power smoothing circuit stopped; watch power"),
    164: _warn("Power smoothing low lifetime", "the power smoothing circuit nears its end"),
    165: _warn("Power smoothing lifetime exhausted", "the power smoothing circuit is worn out"),
    166: _warn("Unencrypted traffic in CC mode", "traffic came before the link was encrypted"),
    167: _warn("PCIe fatal timeout", "a PCIe request timed out; check the slot and link"),
    168: _warn("WPR errors", "errors in the write-protected region; report it if it repeats"),
    169: _warn("Internal micro-controller halt", "the SEC2 micro-controller halted"),
    170: _warn("Interrupt in CC mode", "an interrupt seen in confidential computing mode"),
    171: _app(
        "Uncorrectable DRAM error detail",
        "detail of the Xid 48 beside it",
        "reset_gpu",
        why="a detail line of the Xid 48 beside it, which is the problem: counted, so that "
        "one fault is not two problems",
    ),
    172: _app(
        "Uncorrectable SRAM error detail",
        "detail of the Xid 48 beside it",
        "reset_gpu",
        why="a detail line of the Xid 48 beside it, which is the problem: counted, so that "
        "one fault is not two problems",
    ),
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


def advice(info: XidInfo, slot: str) -> str:
    """``info``'s advice for the GPU in ``slot``: a reset names it (``nvidia-smi -r -i
    0000:3b:00.0``)."""
    return info.advice.replace("-i SLOT", f"-i {slot}")


def override(info: XidInfo, site: Override | None) -> XidInfo:
    """``info`` (from :func:`lookup` or :func:`gpuagent.sources.kernel.xid.assess`) with what the
    site's ``[xid]`` entry ``site`` sets; ``info`` itself without one.  ``severity = "none"`` counts
    the code without a problem.  An entry with a count is applied as it stands:
    whether the count was reached is :class:`gpuagent.sources.kernel.xidwindow.Bursts`'s to say."""
    if site is None or (site.severity is None and site.action is None):
        return info
    burst = "" if site.window is None else f"{site.repeats} within {site.window:g} s, "
    return replace(
        info,
        severity=site.severity or info.severity,
        action=site.action or info.action,
        advice=f"{info.advice} ({burst}as this site's [xid] table says)",
    )
