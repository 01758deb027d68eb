"""Health rules for nvidia-smi's answers and the PCI bus: facts in, :class:`Finding` out (pure).

The severity and action of each kind follow gpuagent(8)'s table.  Every rule reads only what
nvidia-smi or sysfs said; a field a driver does not report (``None``) is never a problem.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.kernel.drivercatalog import Cause, explain
from gpuagent.views import Finding, PciGpu, Row

__all__ = [
    "BUSY_UTILIZATION",
    "DISPLAY_DRIVERS",
    "KINDS",
    "THROTTLE_BITS",
    "bus_findings",
    "count_findings",
    "deliberate",
    "error_finding",
    "inforom_warning",
    "missing_finding",
    "row_findings",
    "smi_findings",
    "throttle_reasons",
    "wrong_driver_findings",
]

# Every kind these rules report through the agent, with its Event's name
# (logs.Event.problem).
KINDS = (
    "lost",
    "missing",
    "requires_reset",
    "recovery_action",
    "row_remap_pending",
    "row_remap_failed",
    "retired_pages_pending",
    # gpuagent.sources.probe.pages
    "retired_pages_limit",
    "retired_pages_rising",
    "inforom",
    "throttled",
    "pcie_link_degraded",
    "fabric",
    "ecc_uncorrected",
    "gone_from_bus",
    "no_driver",
    "gpu_count",
    "mig_pending",
    "wrong_driver",
)

# Every clocks_event_reasons.active bit NVML documents (nvml.h, "NvmlClocksEventReasons" in
# NVIDIA's NVML API Reference; DCGM's DCGM_CLOCKS_THROTTLE_REASON_* copy its notes), judged by
# what it means.  Those that mean a problem of the host, each with its cause and fix:
COOLING = "a cooling problem: check the fans, the airflow and the inlet temperature"
POWER = "a power delivery problem: check the power supplies and the GPU's power cables"
THROTTLE_BITS: dict[int, tuple[str, tuple[str, ...]]] = {
    # "HW Slowdown (reducing the core clocks by a factor of 2 or more)": the temperature too
    # high, the external power brake asserted, or the power draw too high (fast trigger).
    0x8: ("hardware slowdown", (COOLING, POWER)),
    # "SW Thermal Slowdown": the GPU or its memory above its maximum operating temperature.
    0x20: ("software thermal slowdown", (COOLING,)),
    0x40: ("hardware thermal slowdown", (COOLING,)),
    # "HW Power Brake Slowdown": the external power brake, asserted by the system's power
    # supply.
    0x80: ("hardware power brake", (POWER,)),
}
# Normal operation, no problem: nothing runs (idle), the operator's application clocks, the
# power limit doing its job (software power cap), sync boost, the display clocks.
NORMAL_BITS: dict[int, str] = {
    0x1: "idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x10: "sync boost",
    0x100: "display clock setting",
}

# Display drivers that take an NVIDIA GPU from the nvidia module: the driver's own list
# ("NVRM: This can occur when a driver such as: nouveau, rivafb, nvidiafb or rivatv was loaded
# and obtained ownership of the NVIDIA device(s).").  vfio-pci, pci-stub and the like are
# chosen on purpose (passthrough) and are not here.
DISPLAY_DRIVERS = frozenset({"nouveau", "nvidiafb", "rivafb", "rivatv"})
# utilization.gpu (%) from which a GPU counts as busy: its PCIe link should then run at its
# highest generation.  An idle GPU downshifts it to save power (Gen1 at P8 in the RTX 2080
# SUPER and 4080 SUPER idle captures, Gen3/Gen4 under load).
BUSY_UTILIZATION = 10

# gpu_recovery_action (nvmlDeviceGetGpuRecoveryAction): severity and action.
_RECOVERY: dict[str, tuple[str, str]] = {
    "Reset": (CRITICAL, "reset_gpu"),
    "Reboot": (CRITICAL, "reboot"),
    "Drain P2P": (WARNING, "drain_p2p"),
    "Drain and Reset": (CRITICAL, "drain_and_reset"),
}
# An infoROM does not heal: the problem ends only with another GPU (or a driver that reads it).
_INFOROM = "when nvidia-smi no longer says the infoROM is corrupted (a new GPU)"
# fabric.state: a GPU of an NVSwitch system runs no CUDA work until it has joined the fabric.
_FABRIC_PENDING = frozenset({"Not Started", "In Progress"})


def _yes(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() == "yes"


def throttle_fix(names: Iterable[str]) -> str:
    """What the throttle reasons ``names`` (:data:`THROTTLE_BITS`) say to fix, each cause
    once: ``a cooling problem: check …``."""
    causes = dict(THROTTLE_BITS.values())
    return "; ".join(dict.fromkeys(c for n in names for c in causes.get(n, ())))


def throttle_reasons(row: Row) -> list[str]:
    """The reasons of a problem (:data:`THROTTLE_BITS`) that hold the clocks of the GPU in
    ``row`` down, from ``clocks_event_reasons.active`` (``clocks_throttle_reasons.active`` on
    older drivers, a hex bit mask); ``[]`` when none is active (:data:`NORMAL_BITS` and bits
    NVML does not document are none) or the field is missing."""
    return _throttle_reasons(
        row.get("clocks_event_reasons.active") or row.get("clocks_throttle_reasons.active")
    )


def _throttle_reasons(value: object) -> list[str]:
    if not isinstance(value, str):
        return []
    try:
        bits = int(value, 16)
    except ValueError:
        return []
    return [name for bit, (name, _) in THROTTLE_BITS.items() if bits & bit]


def _recovery(value: object) -> Finding | None:
    if not isinstance(value, str) or value == "None":
        return None
    severity, action = _RECOVERY.get(value, (CRITICAL, "reboot"))
    return Finding(
        "recovery_action",
        severity,
        action,
        f"the driver asks for recovery: {value}",
        ends="when gpu_recovery_action reads None again",
    )


def _fabric(state: object, status: object) -> Finding | None:
    if state in _FABRIC_PENDING:
        text = f"not joined the NVLink fabric (fabric.state {state})"
    elif state == "Completed" and isinstance(status, str) and status != "Success":
        text = f"failed to join the NVLink fabric: {status}"
    else:
        return None
    return Finding(
        "fabric",
        CRITICAL,
        "check_host",
        f"{text}; it cannot run CUDA work",
        ends="when the GPU has joined the NVLink fabric",
    )


def _link(row: Row) -> Finding | None:
    """``pcie_link_degraded``: a link narrower than its maximum, or, while the GPU is busy
    (``utilization.gpu`` at least :data:`BUSY_UTILIZATION` %), of a lower generation than the
    highest both ends support (``pcie.link.gen.current`` below ``pcie.link.gen.max``)."""
    faults = []
    width, width_max = row.get("pcie.link.width.current"), row.get("pcie.link.width.max")
    if isinstance(width, int) and isinstance(width_max, int) and width < width_max:
        faults.append(f"x{width} of x{width_max}")
    gen = row.get("pcie.link.gen.current")
    if gen is None:
        gen = row.get("pcie.link.gen.gpucurrent")
    gen_max, busy = row.get("pcie.link.gen.max"), row.get("utilization.gpu")
    if (
        isinstance(gen, int)
        and isinstance(gen_max, int)
        and isinstance(busy, int | float)
        and gen < gen_max
        and busy >= BUSY_UTILIZATION
    ):
        faults.append(f"Gen{gen} of Gen{gen_max} while the GPU is busy")
    if not faults:
        return None
    return Finding(
        "pcie_link_degraded",
        WARNING,
        "check_host",
        f"PCIe link at {' and '.join(faults)}",
        ends="when the link runs at its full width (and, busy, its highest generation) again",
    )


def _mig(current: object, pending: object) -> Finding | None:
    if not isinstance(current, str) or not isinstance(pending, str) or current == pending:
        return None
    return Finding(
        "mig_pending",
        WARNING,
        "reset_gpu",
        f"MIG mode is {current}, {pending} only after a GPU reset (mig.mode.pending)",
        ends="when the pending MIG mode is the current one (after a GPU reset)",
    )


def row_findings(
    row: Row, requires_reset: Iterable[str] = (), *, throttle: bool = True
) -> list[Finding]:
    """The problems one GPU's row shows; ``requires_reset`` the fields that read
    ``[GPU requires reset]`` (smi.Output.requires_reset).  ``throttle`` False leaves
    ``throttled`` to a window of samples
    (:class:`gpuagent.sources.probe.throttle.ThrottleWindow`)."""
    out: list[Finding] = []
    reset = list(requires_reset)
    if reset:
        out.append(
            Finding(
                "requires_reset",
                CRITICAL,
                "reset_gpu",
                f"nvidia-smi says the GPU requires a reset ({', '.join(reset)})",
                ends="when nvidia-smi reads its values again (after the reset)",
            )
        )
    if (f := _recovery(row.get("gpu_recovery_action"))) is not None:
        out.append(f)
    if _yes(row.get("remapped_rows.failure")):
        out.append(
            Finding(
                "row_remap_failed",
                CRITICAL,
                "drain_and_rma",
                "row remapping failed",
                ends="when nvidia-smi no longer reads remapped_rows.failure Yes (a new GPU)",
            )
        )
    if _yes(row.get("remapped_rows.pending")):
        out.append(
            Finding(
                "row_remap_pending",
                WARNING,
                "reset_gpu",
                "a memory row remap is pending until the GPU is reset",
                ends="when the remap is done (after a GPU reset)",
            )
        )
    if _yes(row.get("retired_pages.pending")):
        out.append(
            Finding(
                "retired_pages_pending",
                WARNING,
                "reset_gpu",
                "a retired memory page is pending until the GPU is reset",
                ends="when the page is retired (after a GPU reset)",
            )
        )
    if row.get("inforom.checksum_validation") == "invalid":
        out.append(
            Finding(
                "inforom",
                WARNING,
                "drain_and_rma",
                "the infoROM checksum is invalid",
                ends=_INFOROM,
            )
        )
    reasons = throttle_reasons(row) if throttle else []
    if reasons:
        out.append(
            Finding(
                "throttled",
                WARNING,
                "check_host",
                f"clocks held down: {', '.join(reasons)}; {throttle_fix(reasons)}",
                ends="when a sample shows no hardware slowdown",
            )
        )
    if (f := _link(row)) is not None:
        out.append(f)
    if (f := _mig(row.get("mig.mode.current"), row.get("mig.mode.pending"))) is not None:
        out.append(f)
    if (f := _fabric(row.get("fabric.state"), row.get("fabric.status"))) is not None:
        out.append(f)
    ecc = row.get("ecc.errors.uncorrected.volatile.total")
    if isinstance(ecc, int | float) and ecc > 0:
        out.append(
            Finding(
                "ecc_uncorrected",
                WARNING,
                "reset_gpu",
                f"{ecc:g} uncorrected ECC errors since the driver loaded",
                ends="when the count is 0 again (after a GPU reset or a reboot)",
            )
        )
    return out


def error_finding(text: str) -> Finding:
    """``lost``: nvidia-smi printed an error line for the GPU instead of its row."""
    action = "reset_gpu" if "reset" in text.lower() and "reboot" not in text.lower() else "reboot"
    return Finding(
        "lost",
        CRITICAL,
        action,
        f"nvidia-smi cannot reach the GPU: {text}",
        ends="when nvidia-smi reports the GPU again",
    )


def missing_finding() -> Finding:
    """``missing``: a GPU bound to nvidia on the PCI bus that nvidia-smi does not report."""
    return Finding(
        "missing",
        CRITICAL,
        "reboot",
        "missing from nvidia-smi, though bound to nvidia on the PCI bus (fallen off the bus "
        "or failed: look for Xid 79)",
        ends="when nvidia-smi reports the GPU again",
    )


def inforom_warning() -> Finding:
    """``inforom``: nvidia-smi warned that the GPU's infoROM is corrupted (exit 14)."""
    return Finding(
        "inforom",
        WARNING,
        "drain_and_rma",
        "nvidia-smi says the infoROM is corrupted",
        ends=_INFOROM,
    )


def bus_findings(
    on_bus: Iterable[PciGpu],
    seen: Iterable[str],
    *,
    module_loaded: bool,
    not_back: Iterable[str] = (),
    gone_since: Mapping[str, float] | None = None,
    causes: Mapping[str, Cause] | None = None,
) -> dict[str, list[Finding]]:
    """``gone_from_bus`` for each slot in ``seen`` that is not ``on_bus`` any more (of those
    in ``not_back``, last on it in an earlier boot: it did not come back after the reboot;
    ``gone_since``, when it was first found missing, is the fault's time), and ``no_driver``
    for each GPU bound to no driver while the ``nvidia`` module is loaded, its cause the
    driver's own words of this boot where it gave one (``causes``, by slot:
    :mod:`gpuagent.sources.kernel.drivercatalog`)."""
    on_bus, earlier = list(on_bus), set(not_back)
    present = {g.slot for g in on_bus}
    out: dict[str, list[Finding]] = {}
    for slot in sorted(set(seen) - present):
        text = "did not come back on the PCI bus after the reboot" if slot in earlier else ""
        text = f"the GPU {text or 'is no longer on the PCI bus'}"
        at = (gone_since or {}).get(slot)
        out[slot] = [
            Finding(
                "gone_from_bus",
                CRITICAL,
                "reboot",
                text,
                at=at,
                ends="when the GPU is back on the PCI bus",
            )
        ]
    if module_loaded:
        for g in on_bus:
            if g.driver is None:
                out[g.slot] = [_no_driver((causes or {}).get(g.slot))]
    return out


def _no_driver(cause: Cause | None) -> Finding:
    """``no_driver``, with the driver's own words on why where it gave them: a reboot only
    where one can help (it loads the same module, firmware and BIOS layout)."""
    said = "the nvidia module is loaded but no driver is bound to the GPU"
    default = " (the driver failed to initialise it; see dmesg)"
    action, why = explain(cause, "reboot", default)
    return Finding(
        "no_driver", CRITICAL, action, said + why, ends="when a driver is bound to the GPU"
    )


def wrong_driver_findings(on_bus: Iterable[PciGpu]) -> dict[str, list[Finding]]:
    """``wrong_driver`` for each GPU a display driver (:data:`DISPLAY_DRIVERS`: nouveau,
    nvidiafb …) holds instead of ``nvidia``.  A GPU bound to ``vfio-pci``, ``pci-stub`` or
    another driver is passthrough on purpose (:func:`deliberate`) and is no problem."""
    return {
        g.slot: [
            Finding(
                "wrong_driver",
                CRITICAL,
                "check_host",
                f"bound to {g.driver}, not nvidia: blacklist {g.driver} "
                "(modprobe.d, and the initramfs), then reboot",
                ends="when nvidia holds the GPU",
            )
        ]
        for g in on_bus
        if g.driver in DISPLAY_DRIVERS
    }


def deliberate(gpu: PciGpu) -> bool:
    """Whether ``gpu`` is bound to another driver on purpose (``vfio-pci``, ``pci-stub`` …):
    neither ``nvidia``, nor unbound, nor a display driver; its slot has no problems."""
    return not gpu.probeable and gpu.driver not in DISPLAY_DRIVERS


def count_findings(
    on_bus: int, expected: int | None, missing: Iterable[str] = (), removed: Iterable[str] = ()
) -> list[Finding]:
    """``gpu_count`` (host-level) when fewer than ``expected`` GPUs are on the bus, naming
    the ``missing`` slots (the GPUs known to this host that are not on it); each slot of
    ``removed`` (root cleared its ``gone_from_bus``: it left for good) is one GPU less to
    expect.  Where the missing GPUs explain the whole shortfall, each its own
    ``gone_from_bus``, the count is theirs: ``cause`` ``gone_from_bus`` (one lost GPU is one
    page, not two)."""
    out = sorted(set(removed))
    if expected is None or on_bus >= expected - len(out):
        return []
    gone = sorted(set(missing))
    less = f", less {len(out)} removed for good ({', '.join(out)})" if out else ""
    named = f"; missing: {', '.join(gone)}" if gone else ""
    # Only a GPU this host knows can be said to have left for good.
    clear = ""
    if gone:
        which, slot = ("it", gone[0]) if len(gone) == 1 else ("one", "SLOT")
        clear = f"; if {which} left for good: gpuagent clear {slot} gone_from_bus"
    explained = len(gone) >= expected - len(out) - on_bus
    return [
        Finding(
            "gpu_count",
            CRITICAL,
            "check_host",
            f"{on_bus} NVIDIA GPU{'' if on_bus == 1 else 's'} on the PCI bus where "
            f"expected_gpus is {expected}{less}{named}",
            (("cause", "gone_from_bus"),) if explained else (),
            ends=f"when {expected - len(out)} GPUs are on the PCI bus{clear}, or expected_gpus "
            "is lowered",
        )
    ]


def smi_findings(
    rows: Mapping[str, Row],
    requires_reset: Mapping[str, Iterable[str]],
    gpu_errors: Mapping[str, str],
    inforom: Iterable[str],
    throttled: Mapping[str, Iterable[Finding]] | None = None,
) -> dict[str, list[Finding]]:
    """Everything one nvidia-smi answer says about its GPUs, by slot: each row's problems,
    ``lost`` for each GPU named in an error line, ``inforom`` for each one warned about.

    ``throttled``, the window's verdict
    (:meth:`gpuagent.sources.probe.throttle.ThrottleWindow.findings`),
    replaces the one-sample ``throttled`` rule; ``None`` keeps that rule."""
    window = throttled is not None
    out = {
        slot: row_findings(row, requires_reset.get(slot, ()), throttle=not window)
        for slot, row in rows.items()
    }
    for slot, found in (throttled or {}).items():
        out.setdefault(slot, []).extend(found)
    for slot, text in gpu_errors.items():
        out.setdefault(slot, []).append(error_finding(text))
    for slot in inforom:
        out.setdefault(slot, []).append(inforom_warning())
    return out
