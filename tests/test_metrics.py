"""Prometheus metrics: every capture's values in base units, stale and missing GPUs, the
probe's health, and the textfile writer's episodes (symlink, missing directory, errors)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest, parser
from prometheus_client.metrics_core import Metric

from gpuagent import metrics
from gpuagent.config import Config
from gpuagent.daemon import Daemon
from gpuagent.logs import Event, EventLog
from gpuagent.metrics import Collector
from gpuagent.publish import Textfile
from gpuagent.schema import ProbeState, State
from gpuagent.sources.bus.pciaddr import sysfs_slot
from gpuagent.sources.probe.smi import FIELDS, parse
from gpuagent.views import Gate, ProbeView, ProcessesView, Row
from tests import fakesysfs, replay, states
from tests.conftest import Host, ListHandler
from tests.fakehost import H200_LOAD
from tests.test_smi import MISSING_TEXTS, QUERY_CAPTURES

MIG_LOAD = "h200-mig-linux-driver590.48.01-load-query-gpu-all-fields.csv"
MIB = 1048576

# The series and their nvidia-smi fields, with the unit conversions written out again
# here (not taken from gpuagent.metrics): MiB -> bytes, % -> ratio, MHz -> Hz.
EXPECTED_VALUES: dict[str, tuple[str, Callable[[str], float]]] = {
    "gpuagent_gpu_temperature_celsius": ("temperature.gpu", float),
    "gpuagent_gpu_temperature_limit_margin_celsius": (
        "temperature.gpu.tlimit",
        float,
    ),
    "gpuagent_gpu_utilization_ratio": ("utilization.gpu", lambda c: float(c) / 100),
    "gpuagent_gpu_memory_utilization_ratio": ("utilization.memory", lambda c: float(c) / 100),
    "gpuagent_gpu_memory_used_bytes": ("memory.used", lambda c: float(c) * MIB),
    "gpuagent_gpu_memory_total_bytes": ("memory.total", lambda c: float(c) * MIB),
    "gpuagent_gpu_power_draw_watts": ("power.draw", float),
    "gpuagent_gpu_power_limit_watts": ("power.limit", float),
    "gpuagent_gpu_sm_clock_hertz": ("clocks.sm", lambda c: float(c) * 1e6),
    "gpuagent_gpu_memory_clock_hertz": ("clocks.mem", lambda c: float(c) * 1e6),
    "gpuagent_gpu_fan_speed_ratio": ("fan.speed", lambda c: float(c) / 100),
    "gpuagent_gpu_ecc_uncorrected_volatile_errors": (
        "ecc.errors.uncorrected.volatile.total",
        float,
    ),
    "gpuagent_gpu_pstate": ("pstate", lambda c: float(c.removeprefix("P"))),
    "gpuagent_gpu_mig_enabled": ("mig.mode.current", lambda c: {"Enabled": 1.0}.get(c, 0.0)),
}
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]
# prometheus-client 0.16 (Debian 12) leaves the parser unannotated and 0.21 (Debian 13)
# annotates it: a typed name for it is strict-clean under both, where an ignore is not.
metric_families: Callable[[str], Iterable[Metric]] = parser.text_string_to_metric_families


def series(text: str) -> Series:
    """Parse exposition text back into {(sample name, labels): value}."""
    out: Series = {}
    for family in metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, key
            out[key] = s.value
    return out


def named(all_series: Series, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in all_series.items() if n == name}


def one(all_series: Series, name: str, **labels: str) -> float | None:
    return all_series.get((name, frozenset(labels.items())))


def snapshot(samples: Mapping[str, Row], **probe: Any) -> State:
    """The state of a host with these GPUs (their samples, by slot), each fresh, healthy and
    idle (no process), and a probe that answered 100 s after the start, changed by
    ``probe``."""
    answered = ProbeView(
        state=ProbeState.OK,
        spawns_total=10,
        last_success_at=1_800_000_100.0,
        duration=0.25,
        fields=tuple(FIELDS),
    )
    return states.state(
        now=1_800_000_100.0,
        started_at=1_800_000_000.0,
        ticks=10,
        bus=[states.nvidia(slot) for slot in samples],
        samples={slot: states.sample(row, 0.0) for slot, row in samples.items()},
        probe=replace(answered, **probe),
        processes=ProcessesView(dict.fromkeys(samples, ())),
    )


def test_the_test_snapshot_has_the_agents_shape(host: Host) -> None:
    host.make_agent()
    real = host.tick().state
    fake = snapshot({"0000:18:00.0": {}})
    assert set(real) == set(fake)
    assert set(real["probe"]) == set(fake["probe"])
    assert set(real["gpus"][0]) == set(fake["gpus"][0])
    assert set(real["gpus"][0]) == {
        "pci_slot",
        "fields",
        "sampled_at",
        "stale",
        "health",
        "problems",
        "uuid",
        "xids",
        "processes",
    }


# Every capture ------------------------------------------------------------------------------


def _cell(cap: replay.Capture, raw: list[str], field: str) -> str | None:
    name = replay.canonical(field)
    if name not in cap.fields:
        return None
    cell = replay.nounits(raw[cap.fields.index(name)])
    if cell in MISSING_TEXTS or (cell.startswith("[") and cell.endswith("]")):
        return None
    return cell


@pytest.mark.parametrize("name", QUERY_CAPTURES)
def test_every_capture_renders_to_its_values_in_base_units(name: str) -> None:
    cap = replay.load(name)
    fields = tuple(f for f in FIELDS if replay.canonical(f) in cap.fields)
    stdout, _ = replay.answer(cap, list(fields), "csv,noheader,nounits")
    rows = parse(stdout, fields)
    gpus: dict[str, Row] = {}
    for i, row in enumerate(rows):
        bus_id = row.get("pci.bus_id")
        gpus[sysfs_slot(bus_id) if isinstance(bus_id, str) else f"row:{i}"] = row
    got = series(metrics.render(snapshot(gpus)))

    expected: Series = {}
    for i, raw in enumerate(cap.rows):
        bus_id = _cell(cap, raw, "pci.bus_id")
        slot = f"row:{i}"
        if bus_id is not None:  # sysfs form: 00000000:18:00.0 -> 0000:18:00.0
            slot = f"{int(bus_id.split(':')[0], 16):04x}:{bus_id.split(':', 1)[1].lower()}"
            assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", slot)
        ids = {"pci_slot": slot, "uuid": _cell(cap, raw, "uuid") or ""}
        info = {
            **ids,
            "name": _cell(cap, raw, "name") or "",
            "driver_version": _cell(cap, raw, "driver_version") or "",
        }
        expected["gpuagent_gpu_info", frozenset(info.items())] = 1.0
        expected["gpuagent_gpu_healthy", frozenset(ids.items())] = 1.0
        expected["gpuagent_gpu_processes", frozenset(ids.items())] = 0.0  # idle
        for series_name, (field, convert) in EXPECTED_VALUES.items():
            cell = _cell(cap, raw, field)
            if cell is None:
                continue  # a null or unqueried field is no series
            if series_name == "gpuagent_gpu_mig_enabled" and cell not in ("Enabled", "Disabled"):
                continue
            expected[series_name, frozenset(ids.items())] = convert(cell)
    gpu_series = {k: v for k, v in got.items() if k[0].startswith("gpuagent_gpu_")}
    assert gpu_series == expected
    assert any(k[0] != "gpuagent_gpu_info" for k in expected), "no value at all"


def test_a_capture_with_nulls_has_no_series_for_them() -> None:
    cap = replay.load(H200_LOAD)
    stdout, _ = replay.answer(cap, list(FIELDS), "csv,noheader,nounits")
    (row,) = parse(stdout, FIELDS)
    assert row["fan.speed"] is None
    got = series(metrics.render(snapshot({"0000:18:00.0": row})))
    assert named(got, "gpuagent_gpu_fan_speed_ratio") == {}
    assert len(named(got, "gpuagent_gpu_temperature_celsius")) == 1


# Through the agent on a fake 8-GPU host --------------------------------------------------


def render(host: Host) -> Series:
    """The series of the last tick's state."""
    return series(metrics.render(host.state))


def stale(host: Host) -> set[str]:
    """The GPUs whose samples the last tick's state calls stale."""
    return {g["pci_slot"] for g in host.state["gpus"] if g["stale"]}


def test_eight_gpus_labelled_by_slot_and_uuid(host: Host) -> None:
    host.make_agent()
    host.tick()
    got = render(host)
    info = named(got, "gpuagent_gpu_info")
    assert len(info) == 8
    slots = sorted(dict(labels)["pci_slot"] for labels in info)
    assert slots == sorted(host.slots)
    assert len({dict(labels)["uuid"] for labels in info}) == 8
    for labels in info:
        assert dict(labels)["name"] == "NVIDIA H200"
        assert dict(labels)["driver_version"] == "590.48.01"
    temps = named(got, "gpuagent_gpu_temperature_celsius")
    assert {dict(labels)["pci_slot"] for labels in temps} == set(host.slots)
    assert set(temps.values()) == {52.0}
    assert set(named(got, "gpuagent_gpu_memory_total_bytes").values()) == {143771.0 * MIB}
    assert set(named(got, "gpuagent_gpu_utilization_ratio").values()) == {1.0}
    assert set(named(got, "gpuagent_gpu_mig_enabled").values()) == {0.0}
    assert one(got, "gpuagent_probe_up") == 1.0
    assert one(got, "gpuagent_pci_gpus") == 8.0
    assert one(got, "gpuagent_probe_consecutive_failures") == 0.0
    assert one(got, "gpuagent_probe_spawns_total") == float(host.spawns)
    assert (
        one(got, "gpuagent_probe_last_success_timestamp_seconds") == host.probe["last_success_at"]
    )
    assert one(got, "gpuagent_info", version=host.state["version"]) == 1.0
    assert one(got, "gpuagent_interval_seconds") == 10.0
    assert named(got, "gpuagent_probe_failure_info") == {}
    assert named(got, "gpuagent_probe_gated") == {}
    assert named(got, "gpuagent_gpu_missing") == {}


def test_spawns_is_a_counter_without_created() -> None:
    text = metrics.render(snapshot({}))
    assert "# TYPE gpuagent_probe_spawns_total counter" in text
    assert "_created" not in text


def test_mig_capture(host: Host) -> None:
    host.scenario(capture=MIG_LOAD, slots=host.slots)
    host.make_agent()
    host.tick()
    got = render(host)
    assert set(named(got, "gpuagent_gpu_mig_enabled").values()) == {1.0}
    # Utilization is [N/A] in MIG mode: no series, the rest is there.
    assert named(got, "gpuagent_gpu_utilization_ratio") == {}
    assert named(got, "gpuagent_gpu_memory_utilization_ratio") == {}
    assert len(named(got, "gpuagent_gpu_memory_used_bytes")) == 8
    assert set(named(got, "gpuagent_gpu_temperature_celsius").values()) == {36.0}


def test_no_success_yet_means_no_last_success_series(host: Host) -> None:
    host.failing()
    host.make_agent()
    host.tick()
    got = render(host)
    assert one(got, "gpuagent_probe_up") == 0.0
    assert one(got, "gpuagent_probe_consecutive_failures") == 1.0
    assert one(got, "gpuagent_probe_failure_info", **{"class": "version_mismatch"}) == 1.0
    assert named(got, "gpuagent_probe_last_success_timestamp_seconds") == {}
    assert named(got, "gpuagent_gpu_info") == {}
    # Nothing learnt about the GPUs yet: each is known, none healthy.
    assert set(named(got, "gpuagent_gpu_healthy").values()) == {0.0}
    assert one(got, "gpuagent_pci_gpus") == 8.0


def test_stale_gpus_keep_only_their_info(host: Host) -> None:
    host.make_agent()
    host.tick()
    host.failing()
    host.tick()
    # One failed probe, the sample one interval old: still current.
    assert len(named(render(host), "gpuagent_gpu_temperature_celsius")) == 8
    host.tick(2)
    assert stale(host) == set(host.slots)
    got = render(host)
    assert len(named(got, "gpuagent_gpu_info")) == 8
    # (The host's driver_mismatch is the host's series, no GPU's.)
    assert {
        n for n, labels in got if n.startswith("gpuagent_gpu_") and dict(labels).get("pci_slot")
    } == {
        "gpuagent_gpu_info",
        "gpuagent_gpu_healthy",
    }
    assert set(named(got, "gpuagent_gpu_healthy").values()) == {0.0}
    assert one(got, "gpuagent_probe_up") == 0.0
    assert one(got, "gpuagent_probe_consecutive_failures") == 3.0
    assert one(got, "gpuagent_probe_failure_info", **{"class": "version_mismatch"}) == 1.0
    assert (
        one(got, "gpuagent_probe_last_success_timestamp_seconds") == host.probe["last_success_at"]
    )
    host.healthy()
    host.tick(3)  # past the backoff
    got = render(host)
    assert len(named(got, "gpuagent_gpu_temperature_celsius")) == 8
    assert named(got, "gpuagent_probe_failure_info") == {}


def test_gpu_missing_from_nvidia_smi(host: Host) -> None:
    host.make_agent()
    host.healthy(slots=host.slots[:7])
    host.tick()
    got = render(host)
    assert named(got, "gpuagent_gpu_missing") == {frozenset({("pci_slot", host.slots[7])}): 1.0}
    # Never reported: no info (no UUID to give), known to be unhealthy.
    assert len(named(got, "gpuagent_gpu_info")) == 7
    assert one(got, "gpuagent_gpu_healthy", pci_slot=host.slots[7], uuid="") == 0.0
    host.healthy()
    host.tick()
    assert named(render(host), "gpuagent_gpu_missing") == {}


def test_gated_probe_says_why(host: Host) -> None:
    host.make_agent()
    fakesysfs.set_module(host.root, False)
    host.tick()
    got = render(host)
    assert one(got, "gpuagent_probe_gated", reason="driver_not_loaded") == 1.0
    assert one(got, "gpuagent_probe_up") == 0.0
    assert named(got, "gpuagent_probe_failure_info") == {}
    fakesysfs.set_module(host.root, True)
    os.unlink(host.smi)
    host.tick()
    got = render(host)
    assert named(got, "gpuagent_probe_gated") == {
        frozenset({("reason", "nvidia_smi_missing")}): 1.0
    }
    for slot in host.slots:
        fakesysfs.bind(host.root, slot, "vfio-pci")
    host.tick()
    got = render(host)
    assert named(got, "gpuagent_probe_gated") == {frozenset({("reason", "no_gpu")}): 1.0}
    assert one(got, "gpuagent_pci_gpus") == 8.0


# The textfile -------------------------------------------------------------------------------


def recorder() -> tuple[EventLog, ListHandler]:
    logs = ListHandler()
    logger = logging.getLogger(f"test.metrics.{id(logs)}")
    logger.handlers[:] = [logs]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return EventLog(logger), logs


def with_id(logs: ListHandler, event: Event) -> list[logging.LogRecord]:
    return [r for r in logs.records if getattr(r, "MESSAGE_ID", None) == event.value]


def read(path: str) -> Series:
    with open(path, encoding="utf-8") as f:
        return series(f.read())


SNAP = snapshot({"0000:18:00.0": {"uuid": "GPU-1", "temperature.gpu": 40}})


def test_written_through_a_symlink_into_the_agents_directory(tmp_path: str) -> None:
    run = os.path.join(tmp_path, "run")
    textfiles = os.path.join(tmp_path, "node-exporter")
    os.makedirs(run)
    os.makedirs(textfiles)
    link = os.path.join(textfiles, "gpuagent.prom")
    os.symlink(os.path.join(run, "gpuagent.prom"), link)
    log, logs = recorder()
    textfile = Textfile(link, log)
    textfile.write(SNAP)
    assert os.path.islink(link)
    assert os.listdir(run) == ["gpuagent.prom"]
    assert one(
        read(link), "gpuagent_gpu_temperature_celsius", pci_slot="0000:18:00.0", uuid="GPU-1"
    )
    assert textfile.problem is None
    assert logs.records == []
    textfile.remove()
    assert os.listdir(run) == []
    assert os.path.islink(link)


def test_missing_directory_is_one_info_line(tmp_path: str) -> None:
    directory = os.path.join(tmp_path, "node-exporter")
    path = os.path.join(directory, "gpuagent.prom")
    log, logs = recorder()
    textfile = Textfile(path, log)
    for _ in range(5):
        textfile.write(SNAP)
    assert [(r.levelno, getattr(r, "MESSAGE_ID", None)) for r in logs.records] == [
        (logging.INFO, None)
    ]
    assert directory in logs.records[0].getMessage()
    assert "prometheus-node-exporter" in logs.records[0].getMessage()
    assert textfile.problem is None
    os.makedirs(directory)
    textfile.write(SNAP)
    textfile.write(SNAP)
    assert os.path.exists(path)
    assert len(logs.records) == 2
    assert logs.records[1].levelno == logging.INFO


def test_write_error_is_one_line_per_episode_and_leaves_no_temp_file(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "gpuagent.prom")
    log, logs = recorder()
    textfile = Textfile(path, log)
    for _ in range(2):
        os.mkdir(path)  # rename(2) onto a directory fails, also for root
        for _ in range(5):
            textfile.write(SNAP)
        assert textfile.problem is not None
        assert path in textfile.problem
        assert os.listdir(tmp_path) == ["gpuagent.prom"]
        os.rmdir(path)
        textfile.write(SNAP)
        assert textfile.problem is None
        assert os.path.isfile(path)
        os.unlink(path)
    failed = with_id(logs, Event.METRICS_WRITE_FAILED)
    assert len(failed) == 2
    assert all(r.levelno == logging.ERROR for r in failed)
    assert "sampling goes on" in failed[0].getMessage()
    assert [r.levelno for r in logs.records] == [logging.ERROR, logging.INFO] * 2


def test_empty_path_writes_nothing(tmp_path: str) -> None:
    log, logs = recorder()
    textfile = Textfile("", log)
    textfile.write(SNAP)
    textfile.remove()
    assert logs.records == []
    assert os.listdir(tmp_path) == []


def test_configure_moves_the_file(tmp_path: str) -> None:
    first = os.path.join(tmp_path, "a.prom")
    second = os.path.join(tmp_path, "b.prom")
    log, _ = recorder()
    textfile = Textfile(first, log)
    textfile.write(SNAP)
    textfile.configure(second)
    assert not os.path.exists(first)
    textfile.write(SNAP)
    assert os.listdir(tmp_path) == ["b.prom"]


# The daemon ---------------------------------------------------------------------------------


def test_daemon_writes_each_tick_reports_problems_reloads_and_removes_at_exit(
    host: Host, tmp_path: str
) -> None:
    path = os.path.join(tmp_path, "node-exporter", "gpuagent.prom")
    os.makedirs(os.path.dirname(path))
    log, logs = recorder()
    cfg = Config(
        nvidia_smi=host.smi,
        sysfs_root=host.root,
        state_file=os.path.join(tmp_path, "state.json"),
        textfile=path,
        sampler="spawn",  # a spawn a tick, counted in gpuagent_probe_spawns_total
    )
    daemon = Daemon(cfg, ("/nonexistent.toml", False), log=log)
    daemon.step()
    got = read(path)
    assert len(named(got, "gpuagent_gpu_temperature_celsius")) == 8
    assert one(got, "gpuagent_probe_spawns_total") == 1.0
    os.unlink(path)
    os.mkdir(path)
    daemon.step()
    problem = daemon.publisher.textfile.problem  # the next state's problems["textfile"]
    assert problem is not None and path in problem
    assert len(with_id(logs, Event.METRICS_WRITE_FAILED)) == 1
    os.rmdir(path)
    daemon.step()
    assert daemon.publisher.textfile.problem is None
    assert one(read(path), "gpuagent_probe_spawns_total") == 3.0

    moved = os.path.join(tmp_path, "elsewhere.prom")
    conf = os.path.join(tmp_path, "gpuagent.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(
            f'sysfs_root = "{host.root}"\nnvidia_smi = "{host.smi}"\n'
            f'state_file = "{cfg.state_file}"\ntextfile = "{moved}"\nsampler = "spawn"\n'
        )
    daemon.config_file = (conf, True)
    daemon.reload()
    daemon.step()
    assert not os.path.exists(path)
    assert os.path.exists(moved)
    daemon.finish("ticks")
    assert not os.path.exists(moved)


def test_families_of_an_idle_host_are_only_health() -> None:
    snap = snapshot(
        {}, state=ProbeState.IDLE, gate=Gate.NO_GPU, last_success_at=None, duration=None
    )
    got = series(metrics.render(snap))
    assert {n for n, _ in got} == {
        "gpuagent_info",
        "gpuagent_probe_up",
        "gpuagent_probe_consecutive_failures",
        "gpuagent_probe_gated",
        "gpuagent_probe_spawns_total",
        "gpuagent_pci_gpus",
        "gpuagent_interval_seconds",
        "gpuagent_last_update_timestamp_seconds",
    }


def test_a_gpu_with_a_problem_keeps_its_values(host: Host) -> None:
    sick = host.slots[2]
    host.healthy(override={sick: {"clocks_event_reasons.active": "0x0000000000000080"}})
    host.make_agent()
    host.tick(31)  # throttled once its samples cover half of throttle_window
    got = render(host)
    uuid = states.gpu(host.state, sick)["fields"]["uuid"]
    assert isinstance(uuid, str)
    labels = {"pci_slot": sick, "uuid": uuid}
    assert one(got, "gpuagent_gpu_temperature_celsius", **labels) == 52.0
    assert one(got, "gpuagent_gpu_healthy", **labels) == 0.0
    problem = {**labels, "kind": "throttled", "severity": "warning", "action": "check_host"}
    assert named(got, "gpuagent_gpu_problem") == {frozenset(problem.items()): 1.0}
    assert sum(named(got, "gpuagent_gpu_healthy").values()) == 7.0
    assert one(got, "gpuagent_probe_duration_seconds") == host.probe["duration"]


class _All(Collector):
    def __init__(self, st: State) -> None:
        self.st = st

    def collect(self) -> Iterable[Metric]:
        return metrics.families(self.st)


def test_the_exposition_is_the_librarys_text_tick_after_tick() -> None:
    """A family formatted at an earlier tick is reused only while its samples are the same:
    each tick's bytes are one ``generate_latest`` of all its families, a zero's sign too."""
    cap = replay.load(H200_LOAD)
    fields = tuple(f for f in FIELDS if replay.canonical(f) in cap.fields)
    rows = parse(replay.answer(cap, list(fields), "csv,noheader,nounits")[0], fields)
    gpus = {sysfs_slot(str(row["pci.bus_id"])): row for row in rows}
    first = sorted(gpus)[0]

    def changed(slot: str, **values: float) -> dict[str, Row]:
        return {**gpus, slot: {**gpus[slot], **values}}

    ticks = [
        snapshot(gpus),
        snapshot(gpus),
        snapshot(changed(first, **{"temperature.gpu": 51})),
        snapshot(changed(first, **{"temperature.gpu": -0.0})),
        snapshot(changed(first, **{"temperature.gpu": 0.0})),
        snapshot(changed(first, **{"temperature.gpu": 0})),
        snapshot({}),
        snapshot(gpus, spawns_total=11),
        snapshot(gpus),
    ]
    exposition = metrics.Exposition()
    for st in ticks:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_All(st))
        assert exposition.render(st) == generate_latest(registry)
    assert b"-0.0" in metrics.Exposition().render(ticks[3])
