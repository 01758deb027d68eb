"""Prometheus series for NVLink and NVIDIA's services, from one tick's state.

``gpuagent_gpu_nvlink_links`` counts each GPU's links by ``state`` (active, inactive).
``gpuagent_gpu_nvlink_errors_total`` is the driver's lifetime count per GPU and ``counter``
(replay, recovery, crc): one series per GPU and counter while every link's count is zero, and
otherwise one per link with a non-zero count, labelled ``link``; so the series stay few, and
``sum by (counter)`` is right either way.  ``gpuagent_service_active`` and
``gpuagent_service_restarts_total`` are NVIDIA's units as systemd says (none when not read).
"""

from __future__ import annotations

from gpuagent.schema import NvlinkEntry, State
from gpuagent.sources.nvlink.memo import ByIdentity
from gpuagent.views import Series, Table

__all__ = ["tables"]

_LABELS = ("pci_slot", "uuid")


def _error_series(nvlink: NvlinkEntry) -> tuple[tuple[str, str, float], ...]:
    """A GPU's error series (counter, link, count): per counter, its links with a non-zero
    count, else one series of all links (link ``""``) at 0."""
    per: dict[str, dict[str, int]] = {}
    for link, values in nvlink["counters"].items():
        for counter, value in values.items():
            if value is not None:
                per.setdefault(counter, {})[link] = value
    out: list[tuple[str, str, float]] = []
    for counter, by_link in sorted(per.items()):
        rising = {n: v for n, v in by_link.items() if v}
        if not rising:
            out.append((counter, "", 0.0))
        out += [
            (counter, n, float(v)) for n, v in sorted(rising.items(), key=lambda kv: int(kv[0]))
        ]
    return tuple(out)


# A GPU's entry is the same object from one NVLink read to the next (it is read-only): its
# 54 counters are summed up once a read, not once a tick.
_errors = ByIdentity(_error_series)


def tables(state: State) -> list[Table]:
    """The NVLink and services families of ``state``, as :class:`~gpuagent.views.Table`."""
    links: list[Series] = []
    errors: list[Series] = []
    for gpu in state["gpus"]:
        nvlink = gpu.get("nvlink")
        if nvlink is None:
            continue
        slot, uuid = gpu["pci_slot"], gpu["uuid"] or ""
        links.append(((slot, uuid, "active"), float(nvlink["active"])))
        links.append(((slot, uuid, "inactive"), float(len(nvlink["inactive"]))))
        errors += [((slot, uuid, counter, link), value) for counter, link, value in _errors(nvlink)]
    active: list[Series] = []
    restarts: list[Series] = []
    for unit, s in state.get("services", {}).items():
        if s["load_state"] == "not-found":
            continue
        running = s["active_state"] in ("active", "reloading", "refreshing")
        active.append(((unit,), 1.0 if running else 0.0))
        if s["restarts"] is not None:
            restarts.append(((unit,), float(s["restarts"])))
    return [
        Table(
            "gauge",
            "gpuagent_gpu_nvlink_links",
            "The GPU's NVLink links as last read, by state (active, inactive).",
            (*_LABELS, "state"),
            tuple(links),
        ),
        Table(
            "counter",
            "gpuagent_gpu_nvlink_errors",
            "NVLink error counts of the GPU's links (driver lifetime), by counter; per link, "
            "with a link label, for the links with a non-zero count.",
            (*_LABELS, "counter", "link"),
            tuple(errors),
        ),
        Table(
            "gauge",
            "gpuagent_service_active",
            "1 when the NVIDIA systemd unit is active (or reloading), else 0.",
            ("unit",),
            tuple(active),
        ),
        Table(
            "counter",
            "gpuagent_service_restarts",
            "How often systemd restarted the NVIDIA unit since it was last started by hand "
            "(NRestarts).",
            ("unit",),
            tuple(restarts),
        ),
    ]
