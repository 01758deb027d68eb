"""States for tests, written by the agent's one writer (:func:`gpuagent.report.build`) from a
few facts: the GPUs on the bus, their samples, the probe, the problems.

Defaults make a healthy one-H200 host sampled just now; every time defaults to one relative to
``now``, the wall time the state is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from gpuagent import __version__, report
from gpuagent.schema import GpuEntry, ProbeState, State
from gpuagent.sources.probe import rules
from gpuagent.state import SCHEMA
from gpuagent.views import (
    BusView,
    Finding,
    KernelView,
    NvlinkView,
    PciGpu,
    ProbeView,
    Problem,
    ProcessesView,
    Row,
    Sample,
    SamplesView,
    ServicesView,
    VgpuView,
)

__all__ = ["H200", "NOW", "NO_KERNEL", "SLOT", "gpu", "nvidia", "problem", "sample", "state"]

NOW = 1_800_000_000.0
SLOT = "0000:18:00.0"
# What a busy H200 reports (the fake host's capture).
H200: Row = {
    "name": "NVIDIA H200",
    "temperature.gpu": 52,
    "utilization.gpu": 100,
    "memory.used": 32362,
    "memory.total": 143771,
    "power.draw": 627.4,
    "power.limit": 700.0,
}
NO_KERNEL = KernelView({}, {}, {})


def nvidia(slot: str = SLOT, driver: str | None = "nvidia") -> PciGpu:
    """An H200 on the PCI bus, bound to ``driver``."""
    return PciGpu(slot, "0x2335", "0x030200", driver)


def sample(fields: Row | None = None, at: float = NOW) -> Sample:
    """One GPU's sample taken at wall time ``at`` (:data:`H200` without ``fields``)."""
    return Sample(dict(H200) if fields is None else fields, at, 0.0)


def problem(
    kind: str,
    severity: str,
    action: str,
    *,
    slot: str = SLOT,
    message: str = "m",
    since: float = NOW,
) -> Problem:
    """A problem holding on ``slot`` (``""``: the host) since ``since``."""
    return Problem(slot, Finding(kind, severity, action, message), since)


def state(
    *,
    now: float = NOW,
    pid: int | None = None,
    started_at: float | None = None,
    ticks: int = 360,
    interval: float = 10.0,
    bus: Sequence[PciGpu] = (nvidia(),),
    samples: Mapping[str, Sample] | None = None,
    stale: Iterable[str] = (),
    missing: Sequence[str] = (),
    probe: ProbeView | None = None,
    problems: Mapping[str, Sequence[Problem]] | None = None,
    trouble: Mapping[str, str] | None = None,
    nvlink: NvlinkView | None = None,
    services: ServicesView | None = None,
    processes: ProcessesView | None = None,
    vgpu: VgpuView | None = None,
    kernel: KernelView = NO_KERNEL,
    ended: tuple[str, float] | None = None,
) -> State:
    """The state of a tick at wall time ``now``.  ``samples`` default to one of :data:`H200`
    taken at ``now`` for each GPU nvidia-smi answers for; those not in ``stale`` are fresh.
    ``probe`` defaults to one that answered at ``now``, ``ticks`` spawns since the start
    (``now`` - 3600 s by default); ``problems`` are by slot (``""``: the host), ``trouble``
    the agent's own by kind; ``processes`` default to not known (not read).  With ``ended``
    (the ``exit``'s reason and time) it is the last state an agent writes, at that time."""
    if samples is None:
        samples = {g.slot: sample(at=now) for g in bus if g.probeable}
    if probe is None:
        probe = ProbeView(state=ProbeState.OK, spawns_total=ticks, last_success_at=now)
    origin = report.Origin(
        SCHEMA,
        __version__,
        os.getpid() if pid is None else pid,
        now - 3600 if started_at is None else started_at,
        interval,
    )
    # As the verdict would: a GPU missing from nvidia-smi has that problem too.
    held: dict[str, list[Problem]] = {slot: list(ps) for slot, ps in (problems or {}).items()}
    for slot in missing:
        held.setdefault(slot, []).append(Problem(slot, rules.missing_finding(), now))
    written = report.build(
        origin,
        now=now,
        ticks=ticks,
        bus=BusView(tuple(bus), frozenset(g.slot for g in bus), (), True),
        probe=probe,
        samples=SamplesView(samples, frozenset(samples) - frozenset(stale), tuple(missing)),
        kernel=kernel,
        nvlink=nvlink or NvlinkView({}),
        services=services or ServicesView({}),
        processes=processes or ProcessesView(),
        vgpu=vgpu,
        problems=held,
        trouble=trouble or {},
    )
    if ended is None:
        return written.state
    reason, at = ended
    return report.finished(written, reason, at)


def gpu(st: State, slot: str = SLOT) -> GpuEntry:
    """The one entry of ``st`` for the GPU in ``slot``."""
    (entry,) = [g for g in st["gpus"] if g["pci_slot"] == slot]
    return entry
