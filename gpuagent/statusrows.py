"""Rows of ``gpuagent status`` for NVLink, NVIDIA's services and the kernel's counts (pure,
light imports: ``gpuagent status`` must start fast)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .status import clean

__all__ = ["clock", "count", "nvlink_row", "services_row"]

# How the row names each unit; DCGM is shown only when installed (it is optional).
_NAMES = (
    ("nvidia-fabricmanager.service", "fabric manager"),
    ("nvidia-persistenced.service", "persistenced"),
    ("nvidia-dcgm.service", "dcgm"),
)


def clock(at: float) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(at))
    except (OverflowError, OSError, ValueError):
        return "?"


def count(name: str, c: Mapping[str, Any]) -> str:
    """``Xid 79`` times its count and the last one's local time of day."""
    return f"{name} \u00d7{c['count']}, last {clock(c['last'])}"


def nvlink_row(nvlink: object) -> str | None:
    """``NVLink 18/18``, ``NVLink 17/18, link 14 inactive``; None without a read."""
    if not isinstance(nvlink, Mapping):
        return None
    inactive = nvlink.get("inactive") or []
    text = f"NVLink {clean(nvlink.get('active'))}/{clean(nvlink.get('links'))}"
    if nvlink.get("links") == 0:
        return "NVLink: all links inactive"
    if inactive:
        which = ", ".join(clean(n) for n in inactive)
        text += f", link{'s' if len(inactive) > 1 else ''} {which} inactive"
    return text


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
            if name != "dcgm":
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
