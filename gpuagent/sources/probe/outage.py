"""The probe's own problems, host-level: nvidia-smi missing or failing with GPUs on the bus
(pure).

The other outages are the driver's to judge (:mod:`gpuagent.sources.driver.driverstate`): a
timeout or a child stuck in the driver is ``driver_hung``, a driver/library mismatch (exit
18) ``driver_mismatch``, the nvidia module not loaded ``no_driver_module``.
"""

from __future__ import annotations

from gpuagent.health import CRITICAL, WARNING
from gpuagent.schema import ProbeState
from gpuagent.sources.probe.smi import HINTS
from gpuagent.views import Failure, Finding, Gate, ProbeView

__all__ = ["DRIVERS", "EVIDENCE", "KINDS", "outage"]

# The kinds of the probe's own problems (gpuagent-problems(7) lists every kind).
NOT_FOUND = "nvidia_smi_missing"
FAILING = "smi_failing"
KINDS = (NOT_FOUND, FAILING)

# The failures the driver's problems say: no smi_failing of their own.
DRIVERS = frozenset({Failure.TIMEOUT, Failure.VERSION_MISMATCH})
# The failures that are evidence about the GPUs: nvidia-smi's own words that a GPU is lost or
# needs a reset.  Every other class may be the agent's own trouble (a sandbox or permission
# that stops NVML, "Failed to initialize NVML: Unknown Error" when a cgroup's device rules
# change), which never drains a node: a warning.
EVIDENCE = frozenset({Failure.GPU_LOST})


def outage(probe: ProbeView, after: int = 1) -> list[Finding]:
    """The probe's host problems as of ``probe`` (its state on a bus with GPUs to probe:
    ``idle`` has none): ``nvidia_smi_missing`` (warning) while it is not found, and
    ``smi_failing`` while it fails, its class and error in the message, from the
    ``after``-th failure in a row on (``backoff_after``: the outage's start; one failed probe
    is a blip): critical only where nvidia-smi says a GPU is lost (:data:`EVIDENCE`), else a
    warning, the agent's own trouble.  Both are told by the probe's own
    lines (``nvidia-smi not found``, ``nvidia-smi failing``: :attr:`Finding.told`)."""
    if probe.state is ProbeState.GATED and probe.gate is Gate.NVIDIA_SMI_MISSING:
        return [
            Finding(
                NOT_FOUND,
                WARNING,
                "check_host",
                "nvidia-smi is not found with GPUs on the PCI bus: they are not sampled; "
                f"{HINTS[Failure.NOT_FOUND]}",
                ends="when nvidia-smi is found",
                told=True,
            )
        ]
    failure = probe.failure or Failure.OTHER
    if probe.state is not ProbeState.FAILING or failure in DRIVERS or probe.failures < after:
        return []
    return [
        Finding(
            FAILING,
            CRITICAL if failure in EVIDENCE else WARNING,
            "check_host",
            f"nvidia-smi failing ({failure.value}): {probe.last_error or 'no answer'}; "
            f"{HINTS[failure]}",
            ends="when nvidia-smi answers again",
            told=True,
        )
    ]
