"""Prometheus series for who is on each GPU, from one tick's state.

``gpuagent_gpu_processes`` counts the compute processes on each GPU (0 for an idle one) and
``gpuagent_gpu_unit_memory_bytes`` sums their GPU memory by systemd ``unit``; processes in no
unit systemd knows (or while it cannot be asked) are summed under ``unit=""``.  Units are
labels and PIDs never are: a PID is a new series for every job, a unit (``train@3.service``,
``docker-<id>.scope``) is what an alert or a dashboard groups by.  A GPU whose processes are
not known (the read failing, the probe failing) or whose sample is stale has neither series.
"""

from __future__ import annotations

from gpuagent.schema import State
from gpuagent.views import Series, Table

__all__ = ["tables"]

_LABELS = ("pci_slot", "uuid")
_MIB = 1048576


def tables(state: State) -> list[Table]:
    """Who is on each GPU in ``state``, as :class:`~gpuagent.views.Table`."""
    count: list[Series] = []
    memory: list[Series] = []
    for gpu in state["gpus"]:
        processes = gpu.get("processes")
        if processes is None or gpu["stale"]:
            continue
        slot, uuid = gpu["pci_slot"], gpu["uuid"] or ""
        count.append(((slot, uuid), float(len(processes))))
        by_unit: dict[str, int] = {}
        for p in processes:
            if p["used_memory_mib"] is not None:
                unit = p["unit"] or ""
                by_unit[unit] = by_unit.get(unit, 0) + p["used_memory_mib"]
        memory += [((slot, uuid, unit), float(mib * _MIB)) for unit, mib in sorted(by_unit.items())]
    return [
        Table(
            "gauge",
            "gpuagent_gpu_processes",
            "Compute processes on the GPU (nvidia-smi --query-compute-apps), as last read.",
            _LABELS,
            tuple(count),
        ),
        Table(
            "gauge",
            "gpuagent_gpu_unit_memory_bytes",
            'GPU memory used by the GPU\'s processes, summed by systemd unit (unit="": '
            "processes in no unit systemd knows).",
            (*_LABELS, "unit"),
            tuple(memory),
        ),
    ]
