"""The IMEX domain's readiness (issue 28): ``nvidia-imex-ctl -N`` parsed from the capture in
data/corpus/imex (an 18-tray GB200 NVL72 domain UP, AWS ParallelCluster's user guide) and
from that capture edited as a domain not ready prints it (a node's row, a cell of the
connectivity table, the state: the words of the capture's own legend); the rule over reads;
the source's gate (no spawn where nvidia-imex.service is not enabled and running), cadence
and outage with a fake nvidia-imex-ctl and the probe's Runner; the whole agent."""

from __future__ import annotations

import json
import logging
import os

import pytest

from gpuagent.config import Config
from gpuagent.edges.runner import Runner
from gpuagent.health import CRITICAL, WARNING
from gpuagent.logs import Event, EventLog
from gpuagent.sources.imex import domain
from gpuagent.sources.imex.source import CTL, ImexSource
from gpuagent.sources.services.nvservices import IMEX
from gpuagent.views import ServicesView, Tick, UnitView
from tests import fakehost
from tests.conftest import Clock, Host
from tests.fake_units import FakeUnits, unit
from tests.replay import CORPUS
from tests.test_held import BOOT
from tests.test_nvidia_scenarios import FM, PD

UP = "imex-ctl-N-gb200x72-18-nodes-up-aws-parallelcluster.txt"
FAKE_CTL = os.path.join(os.path.dirname(os.path.realpath(__file__)), "fake_nvidia_imex_ctl.py")
ROW5 = "Node #5   - 172.31.50.44    - READY"
# Node 5 left the domain: its row and the others' connections to it (its column).
GONE5 = [
    [ROW5, "Node #5   - 172.31.50.44    - UNAVAILABLE"],
    *[
        [f"{i:>8}        " + "C   " * 5 + "C", f"{i:>8}        " + "C   " * 5 + "N"]
        for i in range(18)
    ],
]


def captured() -> str:
    with open(os.path.join(CORPUS, "imex", UP), encoding="utf-8") as f:
        return f.read()


def edited(replace: list[list[str]]) -> str:
    text = captured()
    for old, new in replace:
        assert old in text
        text = text.replace(old, new)
    return text


def test_the_capture_is_a_whole_domain_up() -> None:
    d = domain.parse(captured())
    assert d is not None
    assert d.state == "UP" and len(d.nodes) == 18 and d.unconnected == frozenset()
    assert d.nodes[0] == domain.Node(0, "172.31.48.81", "READY")
    assert d.nodes[17] == domain.Node(17, "172.31.56.47", "READY")
    assert d.ready and domain.finding(d) is None


def test_a_node_gone_from_a_degraded_domain_is_a_warning_naming_it() -> None:
    d = domain.parse(edited([*GONE5, ["Domain State: UP", "Domain State: DEGRADED"]]))
    assert d is not None and d.unconnected == frozenset({5})
    f = domain.finding(d)
    assert f is not None
    assert (f.kind, f.severity, f.action) == (domain.KIND, WARNING, "check_host")
    assert "IMEX domain DEGRADED" in f.message
    assert "nodes not connected: #5 172.31.50.44 (UNAVAILABLE);" in f.message
    assert f.ends == "when nvidia-imex-ctl -N says Domain State: UP with every node connected"


def test_a_domain_down_is_critical() -> None:
    d = domain.parse(edited([*GONE5, ["Domain State: UP", "Domain State: DOWN"]]))
    assert d is not None
    f = domain.finding(d)
    assert f is not None and f.severity == CRITICAL and "IMEX domain DOWN" in f.message


def test_an_up_domain_with_a_disconnected_pair_names_the_node_connected_to() -> None:
    # Node 2's connection to node 7 lost (D), both rows READY.
    row2 = "       2        " + "   ".join("C" * 18)
    cut = "       2        " + "   ".join("C" * 7 + "D" + "C" * 10)
    d = domain.parse(edited([[row2, cut]]))
    assert d is not None and d.state == "UP" and not d.ready
    assert [n.index for n in d.not_connected] == [7]
    f = domain.finding(d)
    assert f is not None and f.severity == WARNING
    assert "#7 172.31.51.157 (READY)" in f.message


def test_an_up_domain_with_a_node_not_ready_is_not_ready() -> None:
    d = domain.parse(edited([[ROW5, "Node #5   - 172.31.50.44    - UNAVAILABLE"]]))
    assert d is not None and not d.ready and [n.index for n in d.not_connected] == [5]


def test_many_nodes_are_counted_past_eight() -> None:
    text = captured().replace("- READY   ", "- UNAVAILABLE")
    d = domain.parse(text.replace("Domain State: UP", "Domain State: DOWN"))
    assert d is not None and len(d.not_connected) == 18
    f = domain.finding(d)
    assert f is not None
    assert "#7 172.31.51.157 (UNAVAILABLE) and 10 more;" in f.message
    assert "#8 " not in f.message


@pytest.mark.parametrize(
    "bad",
    [
        "\u00b2",  # a digit to str.isdigit, no number to int()
        "\u0663",  # an Arabic-Indic three: \\d takes it
        "9" * 5000,  # more digits than int() takes
    ],
)
def test_a_node_index_that_is_no_ascii_number_is_no_node(bad: str) -> None:
    # Issue 40: each was an internal error at every read; the domain was never judged.
    text = edited(
        [
            ["Nodes From\\To  0   1 ", f"Nodes From\\To  0   {bad}   1 "],
            [ROW5, f"Node #{bad}   - 172.31.50.44    - READY"],
            ["Domain State: UP", "Domain State: DOWN"],
        ]
    )
    d = domain.parse(text + f"  {bad}      C   C\n")
    assert d is not None and d.state == "DOWN"
    assert len(d.nodes) == 17 and 5 not in {n.index for n in d.nodes}
    f = domain.finding(d)
    assert f is not None and f.severity == CRITICAL


def test_a_long_address_is_cut_in_the_message() -> None:
    # Issue 40: a 200,000-character address made a 1.2 MB problems.json, refused at the start.
    long = "a" * 200_000
    text = edited([*GONE5, [ROW5.replace("READY", "UNAVAILABLE"), f"Node #5   - {long} - DOWN"]])
    d = domain.parse(text)
    assert d is not None and d.nodes[5].address == long
    f = domain.finding(d)
    assert f is not None and len(f.message) < 1000
    assert "#5 " + "a" * 199 + "\u2026 (DOWN)" in f.message


@pytest.mark.parametrize(
    "text",
    ["", "Connectivity Table Legend:\n", "IMEX daemon status:\nREADY\n", captured()[:-20]],
)
def test_an_answer_without_a_domain_state_is_none(text: str) -> None:
    assert domain.parse(text) is None


def test_a_domain_state_alone_is_a_domain_without_nodes() -> None:
    d = domain.parse("Domain State: UP\n")
    assert d == domain.Domain("UP") and d.ready


def test_one_read_not_ready_is_a_domain_coming_up() -> None:
    ready = domain.parse(captured())
    down = domain.parse(edited([*GONE5, ["Domain State: UP", "Domain State: DOWN"]]))
    assert ready is not None and down is not None
    r = domain.Readiness()
    assert r.update(down) is None  # the first read: coming up, what held before holds
    found = r.update(down)
    assert found is not None
    (f,) = found
    assert f.severity == CRITICAL
    assert r.update(down) == [f]
    assert r.update(ready) == []
    assert r.update(down) is None  # one read again after a ready one
    r.reset()
    assert r.update(down) is None
    assert r.update(down) == [f]


# The source, with the fake nvidia-imex-ctl.


class _Keep(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


class Ctl:
    """The fake nvidia-imex-ctl at ``path``: its scenario and the calls it had."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, CTL)
        os.symlink(FAKE_CTL, self.path)
        self.answer(capture=UP)

    def answer(self, **step: object) -> None:
        with open(self.path + ".json", "w", encoding="utf-8") as f:
            json.dump(step, f)

    def calls(self) -> list[list[str]]:
        try:
            with open(self.path + ".log", encoding="utf-8") as f:
                return [json.loads(line) for line in f]
        except FileNotFoundError:
            return []


@pytest.fixture
def ctl(tmp_path: str) -> Ctl:
    return Ctl(str(tmp_path))


def source(
    ctl: Ctl | None, every: float = 30.0, timeout: float = fakehost.PATIENT
) -> tuple[ImexSource, list[logging.LogRecord], list[str]]:
    records: list[logging.LogRecord] = []
    logger = logging.getLogger(f"test.imex.{id(records)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.handlers[:] = [_Keep(records)]
    cfg = Config(interval=10.0, imex_interval=every, backoff_after=3)
    looked: list[str] = []

    def which(name: str) -> str | None:
        looked.append(name)
        return ctl.path if ctl is not None else None

    runner = Runner(timeout=timeout, kill_grace=0.3)
    return ImexSource(cfg, runner, EventLog(logger), which=which), records, looked


def imex(file_state: str = "enabled", active: str = "active") -> Tick:
    sub = "running" if active == "active" else "dead"
    units = {IMEX: UnitView("loaded", active, sub, "success", 0, file_state)}
    return Tick(0.0, 0.0, Config(interval=10.0), services=ServicesView(units))


def message_id(record: logging.LogRecord) -> str:
    return str(record.__dict__.get("MESSAGE_ID"))


@pytest.mark.parametrize(
    "tick",
    [
        imex("", "inactive"),  # its UnitFileState not known (not installed)
        imex("disabled", "inactive"),  # aicr#2641: installed, disabled (the package's default)
        imex("disabled", "active"),  # started by hand or by a job, not enabled
        imex("enabled", "failed"),  # imex_down's: its daemon down
        imex("masked", "inactive"),
    ],
)
def test_no_spawn_where_the_host_does_not_run_imex(ctl: Ctl, tick: Tick) -> None:
    s, records, looked = source(ctl, every=10.0)
    for _ in range(50):
        out = s.step(tick)
        assert out.view is None and out.findings == {"imex": {}}
    assert ctl.calls() == [] and looked == [] and s.spawns_total == 0 and records == []


def test_units_not_known_spawn_nothing_and_end_nothing(ctl: Ctl) -> None:
    """No system bus, or it failed: nothing is read, and a problem held holds."""
    s, records, looked = source(ctl, every=10.0)
    unknown = Tick(0.0, 0.0, Config(interval=10.0))
    assert all(s.step(unknown).findings == {} for _ in range(20))
    assert ctl.calls() == [] and looked == [] and records == []


def test_an_enabled_running_unit_reads_the_domain_on_its_own_cadence(ctl: Ctl) -> None:
    s, records, _ = source(ctl)
    assert s.step(imex()).findings == {"imex": {"": []}}
    # Every 30 s at a 10 s tick: two ticks hold the last findings, the third reads.
    assert [s.step(imex()).findings for _ in range(3)] == [{}, {}, {"imex": {"": []}}]
    assert ctl.calls() == [["-N"], ["-N"]] and s.spawns_total == 2 and records == []


def test_a_domain_not_ready_on_two_reads_is_a_host_problem_that_ends(ctl: Ctl) -> None:
    ctl.answer(capture=UP, replace=[*GONE5, ["Domain State: UP", "Domain State: DEGRADED"]])
    s, _, _ = source(ctl, every=10.0)
    assert s.step(imex()).findings == {}  # coming up: what held before holds
    (f,) = s.step(imex()).findings["imex"][""]
    assert (f.kind, f.severity) == (domain.KIND, WARNING) and "#5 172.31.50.44" in f.message
    ctl.answer(capture=UP)
    assert s.step(imex()).findings == {"imex": {"": []}}
    # The unit stopped: imex_down's, and this one starts over.
    ctl.answer(capture=UP, replace=[["Domain State: UP", "Domain State: DOWN"]])
    s.step(imex())
    assert s.step(imex("enabled", "failed")).findings == {"imex": {}}
    assert s.step(imex()).findings == {}  # running again: one read down is coming up
    assert [f.severity for f in s.step(imex()).findings["imex"][""]] == [CRITICAL]


def test_the_tool_missing_is_one_warning_per_outage_never_a_problem(ctl: Ctl) -> None:
    s, records, looked = source(None, every=10.0)
    outs = [s.step(imex()).findings for _ in range(3)]
    assert outs == [{}, {}, {}] and looked == [CTL] * 3
    (warning,) = records
    assert warning.levelno == logging.WARNING
    assert message_id(warning) == Event.IMEX_READ_FAILED.value
    assert warning.getMessage() == "IMEX domain not read: nvidia-imex-ctl not found on $PATH"
    for _ in range(20):  # backed off: no more lines
        s.step(imex())
    assert len(records) == 1 and s.spawns_total == 0
    s.which = lambda name: ctl.path
    s.expedite()
    assert s.step(imex()).findings == {"imex": {"": []}}
    assert [message_id(r) for r in records[1:]] == [Event.IMEX_READ_RECOVERED.value]


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        (
            {"stdout": "Failed to connect to IMEX\n", "exit": 1},
            "nvidia-imex-ctl -N: exit 1: Failed to connect to IMEX",
        ),
        ({"stdout": "Connectivity Table Legend:\n"}, "nvidia-imex-ctl -N: no Domain State"),
    ],
)
def test_a_failing_tool_is_one_warning(ctl: Ctl, step: dict[str, object], reason: str) -> None:
    ctl.answer(**step)
    s, records, _ = source(ctl, every=10.0)
    assert [s.step(imex()).findings for _ in range(3)] == [{}, {}, {}]
    (warning,) = records
    assert warning.getMessage().startswith(f"IMEX domain not read: {reason}")
    assert s.spawns_total == 3


def test_a_hanging_tool_is_cut_off_by_the_runner(ctl: Ctl) -> None:
    ctl.answer(hang=30)
    s, records, _ = source(ctl, every=10.0, timeout=0.3)
    assert s.read() is None
    assert s.spawns_total == 1 and s.cadence.failures == 1 and records == []


# The whole agent on the fake host.


def test_a_tray_whose_domain_stays_down_has_one_host_problem(host: Host, tmp_path: str) -> None:
    ctl = Ctl(str(tmp_path))
    ctl.answer(capture=UP, replace=[*GONE5, ["Domain State: UP", "Domain State: DOWN"]])
    units = FakeUnits()
    units.set(unit(FM), unit(PD), unit(IMEX, file_state="enabled"))
    agent = host.make_agent(units=units, imex_interval=1.0)
    agent.source(ImexSource).which = lambda name: ctl.path
    st = host.tick(3).state
    assert [(p["kind"], p["severity"], p["action"]) for p in st["host_problems"]] == [
        (domain.KIND, "critical", "check_host")
    ]
    assert all(not g["problems"] for g in st["gpus"])
    (line,) = host.events(Event.PROBLEM_IMEX_DOMAIN_NOT_READY)
    assert "#5 172.31.50.44 (UNAVAILABLE)" in line.getMessage()
    ctl.answer(capture=UP)
    assert host.tick(2).state["host_problems"] == []


def test_a_tray_with_imex_installed_and_disabled_never_looks_for_the_tool(host: Host) -> None:
    units = FakeUnits()
    units.set(unit(FM), unit(PD), unit(IMEX, "inactive", "dead", file_state="disabled"))
    agent = host.make_agent(units=units, imex_interval=1.0)
    looked: list[str] = []

    def which(name: str) -> str | None:
        looked.append(name)
        return None

    agent.source(ImexSource).which = which
    st = host.tick(5).state
    assert looked == [] and st["host_problems"] == []
    assert [r for r in host.logs.records if r.levelno >= logging.WARNING] == []


def test_a_restart_neither_ends_nor_starts_again_a_domain_down(host: Host, tmp_path: str) -> None:
    """The first read after a restart is held back as any first one not ready: the problem
    held before it holds on, its first ``since`` kept, no line cleared or started again."""
    directory, wall = os.path.join(str(tmp_path), "state"), Clock(1_800_000_000.0)
    os.mkdir(directory)
    ctl = Ctl(str(tmp_path))
    ctl.answer(capture=UP, replace=[*GONE5, ["Domain State: UP", "Domain State: DOWN"]])
    units = FakeUnits()
    units.set(unit(FM), unit(PD), unit(IMEX, file_state="enabled"))

    def agent() -> None:
        a = host.make_agent(
            units=units, state_directory=directory, boot=lambda: BOOT, wall=wall, imex_interval=1.0
        )
        a.source(ImexSource).which = lambda name: ctl.path

    agent()
    (first,) = host.tick(3).state["host_problems"]
    wall.now += 60
    agent()
    for _ in range(3):
        (p,) = host.tick().state["host_problems"]
        assert (p["kind"], p["since"]) == (domain.KIND, first["since"])
    assert len(host.events(Event.PROBLEM_IMEX_DOMAIN_NOT_READY)) == 1
    assert host.events(Event.PROBLEM_CLEARED) == []
    assert len(host.events(Event.STILL_HOLDS)) == 1
