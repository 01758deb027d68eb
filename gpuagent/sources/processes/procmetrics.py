"""Prometheus series for who is on each GPU, from one tick's state.

``gpuagent_gpu_processes`` counts the compute processes on each GPU (0 for an idle one) and
``gpuagent_gpu_unit_memory_bytes`` sums their GPU memory by systemd ``unit``; processes in no
unit systemd knows (or while it cannot be asked) are summed under ``unit=""``.  Units are
labels and PIDs never are: a PID is a new series for every job, a unit (``train@3.service``,
``docker-<id>.scope``) is what an alert or a dashboard groups by.  A GPU whose processes are
not known (the read failing, the probe failing) or whose sample is stale has neither series.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuagent.schema import State

__all__ = ["families"]

_LABELS = ("pci_slot", "uuid")
_MIB = 1048576


def families(state: State) -> list[Metric]:
    count = GaugeMetricFamily(
        "gpuagent_gpu_processes",
        "Compute processes on the GPU (nvidia-smi --query-compute-apps), as last read.",
        labels=list(_LABELS),
    )
    memory = GaugeMetricFamily(
        "gpuagent_gpu_unit_memory_bytes",
        'GPU memory used by the GPU\'s processes, summed by systemd unit (unit="": processes '
        "in no unit systemd knows).",
        labels=[*_LABELS, "unit"],
    )
    for gpu in state["gpus"]:
        processes = gpu.get("processes")
        if processes is None or gpu["stale"]:
            continue
        who = [gpu["pci_slot"], gpu["uuid"] or ""]
        count.add_metric(who, float(len(processes)))
        by_unit: dict[str, int] = {}
        for p in processes:
            if p["used_memory_mib"] is not None:
                unit = p["unit"] or ""
                by_unit[unit] = by_unit.get(unit, 0) + p["used_memory_mib"]
        for unit, mib in sorted(by_unit.items()):
            memory.add_metric([*who, unit], float(mib * _MIB))
    return [count, memory]
