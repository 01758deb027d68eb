"""Rows of ``gpuagent status`` for NVLink, NVIDIA's services and the kernel's counts (pure,
light imports: ``gpuagent status`` must start fast)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gpuagent.commands.status import clean, finite
from gpuagent.edges.systemd.unitname import job_words

__all__ = [
    "HIDDEN_MIB",
    "clock",
    "count",
    "nvlink_row",
    "process_rows",
    "services_row",
    "vgpu_row",
]

# How the row names each unit; DCGM and IMEX are shown only when installed (they are
# optional: IMEX only on multi-node NVLink trays).
_NAMES = (
    ("nvidia-fabricmanager.service", "fabric manager"),
    ("nvidia-persistenced.service", "persistenced"),
    ("nvidia-dcgm.service", "dcgm"),
    ("nvidia-imex.service", "imex"),
)
_OPTIONAL = frozenset({"dcgm", "imex"})


# Memory in use with no process listed, above what a display's own use is (a desktop GPU's
# idle 200-600 MiB): a process in another PID namespace, or a context that leaked.
HIDDEN_MIB = 1024
# Processes listed under one GPU; the rest are counted.
_SHOWN = 8


def clock(at: float) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(at))
    except (OverflowError, OSError, ValueError):
        return "?"


def count(name: str, c: Mapping[str, Any]) -> str:
    """``Xid 79`` times its count and the last one's local time of day."""
    return f"{name} \u00d7{c['count']}, last {clock(c['last'])}"


# After a row read before nvidia-smi stopped reporting the GPU: not how it is now.
_STALE = "STALE, read before nvidia-smi stopped reporting the GPU"


def nvlink_row(nvlink: object) -> str | None:
    """``NVLink 18/18``, ``NVLink 17/18, link 14 inactive``; None without a read; an
    earlier read's says it is stale."""
    if not isinstance(nvlink, Mapping):
        return None
    inactive = nvlink.get("inactive") or []
    text = f"NVLink {clean(nvlink.get('active'))}/{clean(nvlink.get('links'))}"
    if nvlink.get("links") == 0:
        text = "NVLink: all links inactive"
    elif inactive:
        which = ", ".join(clean(n) for n in inactive)
        text += f", link{'s' if len(inactive) > 1 else ''} {which} inactive"
    return f"{text} ({_STALE})" if nvlink.get("stale") is True else text


def vgpu_row(vgpu: object) -> str | None:
    """``vGPU NVIDIA Virtual Compute Server: Licensed (Expiry: N/A)``; None off a guest."""
    if not isinstance(vgpu, Mapping):
        return None
    product = vgpu.get("product")
    name = f" {clean(product)}" if isinstance(product, str) and product else ""
    return f"vGPU{name}: {clean(vgpu.get('license_status') or 'licence not known')}"


def services_row(services: object) -> str | None:
    """``fabric manager active, persistenced active``; None when they were not read."""
    if not isinstance(services, Mapping) or not services:
        return None
    parts = []
    for unit, name in _NAMES:
        u = services.get(unit)
        if not isinstance(u, Mapping):
            continue
        if u.get("load_state") == "not-found":
            if name not in _OPTIONAL:
                parts.append(f"{name} not installed")
            continue
        state = clean(u.get("active_state"))
        if u.get("sub_state") and u.get("sub_state") != "running":
            state += f" ({clean(u.get('sub_state'))})"
        restarts = u.get("restarts")
        if isinstance(restarts, int) and restarts:
            state += f", {restarts} restart{'s' if restarts > 1 else ''}"
        parts.append(f"{name} {state}")
    return ", ".join(parts) or None


def _mib(value: object) -> str:
    if not isinstance(value, int):
        return "memory n/a"
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value} MiB"


def _who(p: Mapping[str, Any]) -> str:
    """How a process's unit is shown: the unit, a container by runtime and id, or why none."""
    kind, ref, unit = p.get("unit_kind"), p.get("unit_ref"), p.get("unit")
    if kind == "container" and isinstance(ref, str):
        runtime, _, cid = ref.partition(":")
        return f"{clean(runtime)} container {clean(cid)}"
    if isinstance(unit, str):
        if kind == "slurm" and isinstance(ref, str):
            return f"{clean(unit)} ({clean(job_words(ref))})"
        return clean(unit)
    return "no unit" if kind == "unknown" else "unit not known"


def process_rows(gpu: Mapping[str, Any]) -> list[str]:
    """Who is on the GPU, a line per process, most memory first:
    ``train@3.service 41.2 GiB (pid 48213 python3)``; on a GPU with a problem, a line saying
    that memory is in use with no process visible; none when the processes were not read.
    An earlier read's (``processes_stale``) come under a line that says so, never as who is
    on it now."""
    processes = gpu.get("processes")
    if not isinstance(processes, list):
        return []
    if gpu.get("processes_stale") is True:
        rows = _process_lines(processes)
        return [f"processes {_STALE}:", *(f"  {row}" for row in rows)] if rows else []
    if not processes:
        used = (gpu.get("fields") or {}).get("memory.used")
        # On a healthy GPU it is the normal case of a container's process (another PID
        # namespace): noise.  Beside a problem it may be why a reset is refused.
        if gpu.get("problems") and finite(used) and used >= HIDDEN_MIB:
            return [
                f"no process visible to the agent, {_mib(int(used))} in use "
                "(a process in another PID namespace, or a leaked context)"
            ]
        return []
    return _process_lines(processes)


def _process_lines(processes: list[Any]) -> list[str]:
    ordered = sorted(
        (p for p in processes if isinstance(p, Mapping)),
        key=lambda p: -p["used_memory_mib"] if isinstance(p.get("used_memory_mib"), int) else 1,
    )
    lines = []
    for p in ordered[:_SHOWN]:
        name = p.get("name")
        command = f" {clean(name.rpartition('/')[2])}" if isinstance(name, str) and name else ""
        lines.append(
            f"{_who(p)} {_mib(p.get('used_memory_mib'))} (pid {clean(p.get('pid'))}{command})"
        )
    if len(ordered) > _SHOWN:
        lines.append(f"and {len(ordered) - _SHOWN} more processes")
    return lines
