"""gpuagent's metrics through the real node exporter into a real Prometheus, and the alert rules
under promtool.

The agent runs as a process on a fake 8-GPU host replaying a real H200 capture, writing its
textfile through a symlink the way the package installs it; Debian's prometheus-node-exporter
reads it and a Prometheus on loopback scrapes that every second.  Skipped only where the
binaries are missing and $CI is unset; in CI a missing binary fails.  Every wait has a
deadline, and every process is stopped at the end.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from gpuagent import __version__
from gpuagent.sources.bus.pciaddr import sysfs_slot
from gpuagent.sources.probe.smi import FIELDS, parse
from tests import fakehost, fakesysfs, replay
from tests.fakehost import H200_LOAD
from tests.test_metrics import EXPECTED_VALUES
from tests.test_nvidia_scenarios import COUNTERS as NVLINK_COUNTERS
from tests.test_nvidia_scenarios import STATUS as NVLINK_STATUS
from tests.test_units import PARAMETERS, mock_systemd, private_bus
from tests.tools import tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES_DIR = os.path.join(REPO, "packaging", "prometheus")
RULES = os.path.join(RULES_DIR, "gpuagent-alerts.yml")
RULE_TESTS = os.path.join(RULES_DIR, "gpuagent-alerts.test.yml")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
T = TypeVar("T")


def need(*names: str) -> list[str]:
    """The binaries' paths (Debian's prometheus and prometheus-node-exporter)."""
    return [tool(n) for n in names]


# The alert rules ----------------------------------------------------------------------------


def test_promtool_check_rules_is_clean() -> None:
    (promtool,) = need("promtool")
    proc = subprocess.run(
        [promtool, "check", "rules", RULES], check=False, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 9 rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    (promtool,) = need("promtool")
    proc = subprocess.run(
        [promtool, "test", "rules", os.path.basename(RULE_TESTS)],
        check=False,
        cwd=RULES_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    with open(RULES, encoding="utf-8") as f:
        alerts = re.findall(r"^\s+- alert: (\w+)$", f.read(), re.MULTILINE)
    with open(RULE_TESTS, encoding="utf-8") as f:
        tests = f.read()
    cases = re.findall(r"alertname: (\w+)\n\s+exp_alerts:( \[\])?", tests)
    assert len(alerts) == 9
    for alert in alerts:
        outcomes = {empty == "" for name, empty in cases if name == alert}
        assert outcomes == {True, False}, alert
    with open(RULES, encoding="utf-8") as f:
        rules = f.read()
    # The two GPU-problem alerts share their annotations (a YAML anchor).
    assert rules.count("summary:") == rules.count("description:") == 8
    assert rules.count("annotations: *problem") == 1


# node exporter + Prometheus -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# Loopback only, never through a proxy named in the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str) -> Any:
    with _OPENER.open(url, timeout=5) as response:
        return json.load(response)


class Stack:
    """The processes of one run and their logs."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopped: set[str] = set()
        self.prometheus = ""

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with open(os.path.join(self.dir, f"{name}.log"), "wb") as log:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )

    def logs(self) -> str:
        out = []
        for name in self.procs:
            with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as f:
                out.append(f"--- {name}\n{f.read()[-3000:]}")
        return "\n".join(out)

    def stop(self, name: str) -> int:
        self.stopped.add(name)
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def wait_for(self, what: str, check: Callable[[], T | None], timeout: float = 30) -> T:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None and name not in self.stopped:
                    raise AssertionError(f"{name} exited {proc.returncode}\n{self.logs()}")
            try:
                result = check()
            except (OSError, ValueError, KeyError) as e:  # not listening yet
                last = e
            else:
                if result is not None and result is not False:
                    return result
            time.sleep(0.2)
        raise AssertionError(f"not within {timeout} s: {what} (last error: {last})\n{self.logs()}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = get(f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None


@pytest.fixture
def stack(tmp_path: str) -> Iterator[Stack]:
    s = Stack(str(tmp_path))
    try:
        yield s
    finally:
        for name in reversed(list(s.procs)):
            s.stop(name)


def launch(
    stack: Stack,
    d: str,
    env: dict[str, str] | None = None,
    prepare: Callable[[fakehost.FakeHost], None] | None = None,
    throttle_window: float = 600.0,
) -> tuple[fakehost.FakeHost, str, int]:
    """Node exporter, Prometheus and the agent on a fake 8-GPU host under ``d`` (the agent's
    environment with ``env`` added; ``prepare`` the host before the agent starts; its
    ``throttle_window`` in seconds); returns the host, the node exporter's link to the
    agent's textfile and the node exporter's port."""
    node_exporter, prometheus = need("prometheus-node-exporter", "prometheus")
    # The package's layout: node exporter's directory holds a link into the agent's own.
    run = os.path.join(d, "run")
    textfiles = os.path.join(d, "node-exporter")
    os.makedirs(run)
    os.makedirs(textfiles)
    link = os.path.join(textfiles, "gpuagent.prom")
    os.symlink(os.path.join(run, "gpuagent.prom"), link)
    host = fakehost.create(
        d,
        state_file=f"{run}/state.json",
        textfile=link,
        interval=0.5,
        probe_timeout=fakehost.PATIENT,
        throttle_window=throttle_window,
    )
    if prepare is not None:
        prepare(host)

    ne_port = free_port()
    while (prom_port := free_port()) == ne_port:
        pass
    stack.start(
        "node-exporter",
        [
            node_exporter,
            f"--web.listen-address=127.0.0.1:{ne_port}",
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={textfiles}",
        ],
    )
    prom_conf = os.path.join(d, "prometheus.yml")
    with open(prom_conf, "w", encoding="utf-8") as f:
        f.write(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{json.dumps(RULES)}]\n"
            "scrape_configs:\n"
            "  - job_name: node\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{ne_port}']}}]\n"
        )
    stack.start(
        "prometheus",
        [
            prometheus,
            f"--config.file={prom_conf}",
            f"--storage.tsdb.path={os.path.join(d, 'tsdb')}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
    )
    stack.prometheus = f"http://127.0.0.1:{prom_port}"
    agent_env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    stack.start(
        "gpuagent",
        [PYTHON, "-m", "gpuagent", "--config", host.conf, "run"],
        {**agent_env, **(env or {}), "PYTHONPATH": REPO},
    )
    return host, link, ne_port


def test_metrics_reach_prometheus_and_go_stale_when_the_probe_fails(
    stack: Stack, tmp_path: str
) -> None:
    d = str(tmp_path)
    host, link, ne_port = launch(stack, d)
    slots, run = host.slots, os.path.join(d, "run")

    # Healthy: every value of the capture, in base units, for each of the 8 GPUs.
    stack.wait_for(
        "8 GPUs' temperatures in Prometheus",
        lambda: stack.value("count(gpuagent_gpu_temperature_celsius)") == 8,
    )
    assert os.path.islink(link)
    cap = replay.load(H200_LOAD)
    raw = cap.rows[0]
    stdout, _ = replay.answer(cap, list(FIELDS), "csv,noheader,nounits", slots)
    uuids = {sysfs_slot(str(r["pci.bus_id"])): str(r["uuid"]) for r in parse(stdout, FIELDS)}
    assert sorted(uuids) == sorted(slots)
    got: dict[tuple[str, str, str], float] = {}
    for sample in stack.query('{__name__=~"gpuagent_gpu_.+"}'):
        m = sample["metric"]
        assert (m["instance"], m["job"]) == (f"127.0.0.1:{ne_port}", "node")
        assert uuids[m["pci_slot"]] == m["uuid"]
        got[m["__name__"], m["pci_slot"], m["uuid"]] = float(sample["value"][1])
    expected = {("gpuagent_gpu_info", slot, uuid): 1.0 for slot, uuid in uuids.items()}
    expected.update({("gpuagent_gpu_healthy", slot, uuid): 1.0 for slot, uuid in uuids.items()})
    # No process on any GPU: 0 each, and no unit series.
    expected.update({("gpuagent_gpu_processes", slot, uuid): 0.0 for slot, uuid in uuids.items()})
    for name, (field, convert) in EXPECTED_VALUES.items():
        cell = replay.nounits(raw[cap.fields.index(replay.canonical(field))])
        if cell.startswith("["):
            continue  # [N/A]: no series
        for slot, uuid in uuids.items():
            expected[name, slot, uuid] = convert(cell)
    assert got == expected
    assert stack.value('count(gpuagent_gpu_info{name="NVIDIA H200"})') == 8
    assert stack.value('count(gpuagent_gpu_info{driver_version="590.48.01"})') == 8
    assert stack.value("gpuagent_probe_up") == 1
    assert stack.value("gpuagent_pci_gpus") == 8
    assert stack.value(f'gpuagent_info{{version="{__version__}"}}') == 1
    assert (stack.value("gpuagent_probe_spawns_total") or 0) >= 1
    assert stack.value("node_textfile_scrape_error") == 0
    # node exporter reads the link's target, rewritten every tick.
    mtime = f'node_textfile_mtime_seconds{{file="{link}"}}'
    first = stack.wait_for("the textfile's mtime", lambda: stack.value(mtime))
    stack.wait_for("a newer textfile", lambda: (stack.value(mtime) or 0) > first)
    assert stack.query("gpuagent_probe_failure_info") == []
    assert stack.query("gpuagent_gpu_missing") == []
    rules = get(f"{stack.prometheus}/api/v1/rules")["data"]["groups"]
    assert [len(g["rules"]) for g in rules] == [8, 1]

    # The probe fails: up turns 0, the class is told, and the value series go stale.
    host.failing()
    stack.wait_for("gpuagent_probe_up 0", lambda: stack.value("gpuagent_probe_up") == 0)
    # (The host's own series, pci_slot "": exit 18's driver_mismatch, no GPU's value.)
    values = '{__name__=~"gpuagent_gpu_.+", __name__!~"gpuagent_gpu_(info|healthy)", pci_slot!=""}'
    stack.wait_for("the value series to go stale", lambda: stack.query(values) == [])
    # driver_mismatch starts with the outage (backoff_after failures): waited for, not assumed.
    stack.wait_for(
        "driver_mismatch in Prometheus",
        lambda: stack.value('gpuagent_host_problem{kind="driver_mismatch"}') == 1,
    )
    assert stack.value("count(gpuagent_gpu_info)") == 8
    assert stack.value("sum(gpuagent_gpu_healthy)") == 0
    assert stack.value('gpuagent_probe_failure_info{class="version_mismatch"}') == 1
    assert (stack.value("gpuagent_probe_consecutive_failures") or 0) >= 1
    stack.wait_for(
        "GpuagentProbeDown pending",
        lambda: stack.value('ALERTS{alertname="GpuagentProbeDown", alertstate="pending"}'),
    )

    # A stopped agent removes its file: its series leave Prometheus too.
    assert stack.stop("gpuagent") == 0
    assert not os.path.exists(os.path.join(run, "gpuagent.prom"))
    stack.wait_for("gpuagent's series gone", lambda: stack.query("gpuagent_info") == [])


def test_a_stopped_agent_keeps_its_open_critical_page(stack: Stack, tmp_path: str) -> None:
    """A GPU requires a reset: GpuagentGpuProblemCritical is active; the agent stops (its
    series leave Prometheus) and the alert stays active, the same alert, not resolved."""
    host, _, _ = launch(stack, str(tmp_path))
    sick = host.slots[5]
    host.healthy(override={sick: {"power.draw": "[GPU requires reset]"}})
    alert = f'ALERTS{{alertname="GpuagentGpuProblemCritical", pci_slot="{sick}"}}'
    stack.wait_for("the GPU's critical page", lambda: stack.query(alert) or None, timeout=60)
    (page,) = stack.query(alert)
    only = stack.query('ALERTS{alertname="GpuagentGpuProblemCritical"}')
    assert [a["metric"] for a in only] == [page["metric"]]
    assert stack.stop("gpuagent") == 0
    stack.wait_for("gpuagent's series gone", lambda: stack.query("gpuagent_info") == [])
    gone = time.time()
    # Five rule evaluations (one a second) without the agent: Prometheus says when it last
    # evaluated each group.
    stack.wait_for(
        "five rule evaluations without the agent",
        lambda: min(last_evaluations(stack)) >= gone + 5,
    )
    (kept,) = stack.query(alert)
    assert kept["metric"] == page["metric"]


def last_evaluations(stack: Stack) -> list[float]:
    """When Prometheus last evaluated each rule group (Unix time)."""
    out = []
    for group in get(f"{stack.prometheus}/api/v1/rules")["data"]["groups"]:
        # RFC 3339 with nanoseconds ("2026-12-01T10:00:00.123456789Z"): microseconds will do.
        stamp = re.sub(r"(\.\d{6})\d*", r"\1", group["lastEvaluation"]).replace("Z", "+00:00")
        out.append(datetime.datetime.fromisoformat(stamp).timestamp())
    return out


# The Grafana dashboard ------------------------------------------------------------------------

DASHBOARD = os.path.join(REPO, "packaging", "grafana", "gpuagent.json")
# The fleet's processes, on its GPU BUSY: the mock systemd knows no unit for their PIDs, so
# their memory is summed under unit="".
BUSY = 3
APPS: list[dict[str, Any]] = [
    {"pid": 48213, "name": "/usr/bin/python3", "mib": 40960},
    {"pid": 48214, "name": "/usr/bin/python3", "mib": 1024},
]
# Grafana's variables, as "All" selects them.
VARIABLES = {"$job": ".+", "$instance": ".+", "$__rate_interval": "15s"}


def dashboard() -> dict[str, Any]:
    with open(DASHBOARD, encoding="utf-8") as f:
        board: dict[str, Any] = json.load(f)
    return board


def panel_queries() -> list[Any]:
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            name = f"{panel['title']} {target['refId']}"
            out.append(pytest.param(expr, id=name))
    return out


def promql(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A fake 8-GPU host behind a real node exporter and Prometheus for the module, one GPU
    slowed down by the hardware (a warning problem) and running two processes, its GPUs'
    NVLink read from a real H200's answers and NVIDIA's units from a mock systemd on a private
    bus, so that every panel has data to show."""
    s = Stack(str(tmp_path_factory.mktemp("dashboard")))
    with contextlib.ExitStack() as mocks:
        try:
            bus = mocks.enter_context(private_bus(s.dir))
            mocks.enter_context(mock_systemd(bus, PARAMETERS))
            # One GPU slowed down and busy; NVLink answered from the first read on.
            thermal = {"clocks_event_reasons.active": "0x0000000000000040"}
            nvlink = {"status": NVLINK_STATUS, "errorcounters": NVLINK_COUNTERS}

            def prepare(host: fakehost.FakeHost) -> None:
                busy = host.slots[BUSY]
                apps = [{"slot": busy, **a} for a in APPS]
                host.healthy(override={busy: thermal}, nvlink=nvlink, apps=apps)

            # Throttled once three samples cover half of throttle_window: within a second.
            launch(s, s.dir, {"DBUS_SYSTEM_BUS_ADDRESS": bus.address}, prepare, throttle_window=2)
            s.wait_for(
                "8 GPUs in Prometheus",
                lambda: s.value("count(gpuagent_gpu_temperature_celsius)") == 8,
            )
            s.wait_for(
                "the processes in Prometheus",
                lambda: s.value("sum(gpuagent_gpu_processes)") == len(APPS),
            )
            s.wait_for(
                "the slowed GPU's warning in Prometheus",
                lambda: s.value('count(gpuagent_gpu_problem{kind="throttled"})') == 1,
            )
            yield s
        finally:
            for name in reversed(list(s.procs)):
                s.stop(name)


def test_the_dashboard_covers_what_the_issue_asks() -> None:
    board = dashboard()
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p.get("targets", []))
    for series in (
        "gpuagent_pci_gpus",
        "gpuagent_gpu_info",
        "gpuagent_gpu_healthy",
        "gpuagent_gpu_problem",
        "gpuagent_host_problem",
        "gpuagent_gpu_temperature_celsius",
        "gpuagent_gpu_power_draw_watts",
        "gpuagent_gpu_utilization_ratio",
        "gpuagent_gpu_memory_used_bytes",
        "gpuagent_probe_up",
        "gpuagent_probe_consecutive_failures",
        "gpuagent_gpu_processes",
        "gpuagent_gpu_unit_memory_bytes",
        "gpuagent_gpu_nvlink_links",
        "gpuagent_gpu_nvlink_errors_total",
        "gpuagent_service_active",
        "gpuagent_service_restarts_total",
    ):
        assert series in exprs, series
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert "NVLink and NVIDIA services" in rows
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and panel["description"], panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    # No two panels on the same cell of Grafana's 24-column grid.
    taken: dict[tuple[int, int], str] = {}
    for panel in board["panels"]:
        g = panel["gridPos"]
        for cell in (
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        ):
            assert cell not in taken, (panel["title"], taken[cell])
            taken[cell] = panel["title"]


def test_every_panel_query_is_valid_promql(fleet: Stack) -> None:
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            fleet.query(promql(target["expr"]))  # asserts "success"


@pytest.mark.parametrize("expr", panel_queries())
def test_every_panel_query_returns_data(fleet: Stack, expr: str) -> None:
    fleet.wait_for(f"data for {expr}", lambda: fleet.query(promql(expr)) or None)


def test_who_is_on_the_gpu_sums_the_memory_by_unit_and_counts_every_gpu(fleet: Stack) -> None:
    """The panel's table: a row per GPU and unit with the unit's memory, beside each GPU's
    process count (0 for an idle one)."""
    (panel,) = (
        p for p in dashboard()["panels"] if p["title"] == "Who is on the GPU" and p.get("targets")
    )
    memory, count = (promql(t["expr"]) for t in panel["targets"])
    # Prometheus keeps no empty label: unit="" (no unit known) is a series without one.
    by_unit = [
        (r["metric"]["pci_slot"], r["metric"].get("unit"), float(r["value"][1]))
        for r in fleet.query(memory)
    ]
    busy = fakesysfs.gpu_slots(8)[BUSY]
    assert by_unit == [(busy, None, sum(a["mib"] for a in APPS) * 1048576)]
    counts = {r["metric"]["pci_slot"]: float(r["value"][1]) for r in fleet.query(count)}
    assert counts == {slot: 2.0 if slot == busy else 0.0 for slot in fakesysfs.gpu_slots(8)}


def test_the_dashboard_variables_find_the_host(fleet: Stack) -> None:
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
        assert m is not None, var
        found = fleet.query(promql(m.group(1)))
        assert found and all(m.group(2) in sample["metric"] for sample in found), var["name"]
