"""The NVLink and services series (gpuagent.sources.nvlink.nvmetrics) and their status rows, from
states the report writes."""

from __future__ import annotations

from gpuagent import metrics
from gpuagent.commands.statusrows import nvlink_row, services_row
from gpuagent.views import NvlinkGpu, NvlinkView, ServicesView, UnitView
from tests.states import SLOT, gpu, state

FM = "nvidia-fabricmanager.service"
PD = "nvidia-persistenced.service"
DCGM = "nvidia-dcgm.service"
COUNTS = {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}


def links(inactive: tuple[int, ...] = (), recovery: dict[int, int] | None = None) -> NvlinkView:
    counters = {n: {**COUNTS, "Recovery Errors": (recovery or {}).get(n, 0)} for n in range(18)}
    counters[3]["CRC Errors"] = None  # type: ignore[assignment]  # N/A: no series
    return NvlinkView({SLOT: NvlinkGpu(18, inactive, counters)})


def test_the_state_has_the_issues_nvlink_entry() -> None:
    st = state(nvlink=links((14,), {14: 542}))
    entry = gpu(st)["nvlink"]
    assert (entry["links"], entry["active"], entry["inactive"]) == (18, 17, [14])
    assert entry["counters"]["14"] == {"replay": 0, "recovery": 542, "crc": 0}
    assert nvlink_row(entry) == "NVLink 17/18, link 14 inactive"
    assert nvlink_row(gpu(state(nvlink=links()))["nvlink"]) == "NVLink 18/18"
    assert "nvlink" not in gpu(state())


def test_link_labels_only_for_links_with_a_count() -> None:
    text = metrics.render(state(nvlink=links((14,), {14: 542})))
    series = [ln for ln in text.splitlines() if ln.startswith("gpuagent_gpu_nvlink")]
    # Labels are written sorted; an empty label is no label to Prometheus.
    s = f'pci_slot="{SLOT}"'
    assert series == [
        f'gpuagent_gpu_nvlink_links{{{s},state="active",uuid=""}} 17.0',
        f'gpuagent_gpu_nvlink_links{{{s},state="inactive",uuid=""}} 1.0',
        f'gpuagent_gpu_nvlink_errors_total{{counter="crc",link="",{s},uuid=""}} 0.0',
        f'gpuagent_gpu_nvlink_errors_total{{counter="recovery",link="14",{s},uuid=""}} 542.0',
        f'gpuagent_gpu_nvlink_errors_total{{counter="replay",link="",{s},uuid=""}} 0.0',
    ]


def test_services_series_and_row() -> None:
    units = {
        FM: UnitView("loaded", "active", "running", "success", 0),
        PD: UnitView("loaded", "inactive", "dead", "success", 0),
        DCGM: UnitView("not-found", "inactive", "dead", "", None),
    }
    st = state(services=ServicesView(units))
    assert st["services"][PD] == {
        "load_state": "loaded",
        "active_state": "inactive",
        "sub_state": "dead",
        "result": "success",
        "restarts": 0,
    }
    text = metrics.render(st)
    assert f'gpuagent_service_active{{unit="{FM}"}} 1.0' in text
    assert f'gpuagent_service_active{{unit="{PD}"}} 0.0' in text
    assert f'gpuagent_service_restarts_total{{unit="{FM}"}} 0.0' in text
    assert DCGM not in text  # not installed: no series
    assert services_row(st["services"]) == "fabric manager active, persistenced inactive (dead)"
    assert services_row(state()["services"]) is None
