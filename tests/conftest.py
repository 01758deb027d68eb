"""Shared fixtures: a fake host (sysfs tree + replaying nvidia-smi) and an agent on it."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import pytest

from gpuagent.agent import Agent
from gpuagent.config import Config
from gpuagent.edges import bootid
from gpuagent.edges.runner import Outcome, Runner, RunResult
from gpuagent.logs import Event, EventLog
from gpuagent.report import Report
from gpuagent.schema import ProbeEntry, State
from gpuagent.sources.probe.probe import Prober
from tests import fakehost
from tests.fake_units import FakeUnits
from tests.fakehost import FakeHost

# The fields python-systemd's JournalHandler.emit passes itself beside a record's own: a
# record with one of them fails to send ("got multiple values for keyword argument").
JOURNAL_HANDLER_FIELDS = frozenset(
    ("PRIORITY", "LOGGER", "THREAD_NAME", "PROCESS_NAME", "CODE_FILE", "CODE_LINE", "CODE_FUNC")
)


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def unsendable(self) -> list[str]:
        """The fields of the records that journald's handler would refuse to send."""
        return sorted({k for r in self.records for k in vars(r)} & JOURNAL_HANDLER_FIELDS)


# How long a run's clock may stand waiting for the fake nvidia-smi to log its call (a
# binary that never logs one: a test's own script).
START_PATIENCE = 30.0


class CallClock:
    """The runner's clock for a fake nvidia-smi that hangs: from each run's start it stands
    still until the fake has logged that call (it runs, its SIGTERM handling is set up), for
    at most :data:`START_PATIENCE` s, then runs in real time.  A short probe timeout then
    counts from the hang, however long a busy machine takes to start a Python fake."""

    def __init__(self, host: FakeHost) -> None:
        self.host = host
        self.calls = 0
        self.lost = 0.0  # the seconds it stood, all runs together
        self.standing: float | None = None  # since when (real monotonic s), in this run

    def start(self) -> None:
        """A run begins: stand still until the fake logs one call more."""
        self.calls = len(self.host.calls())
        self.standing = time.monotonic()

    def __call__(self) -> float:
        now = time.monotonic()
        if self.standing is not None:
            waited = now - self.standing
            if len(self.host.calls()) == self.calls and waited < START_PATIENCE:
                return self.standing - self.lost
            self.lost += waited
            self.standing = None
        return now - self.lost


class Answers(Runner):
    """A runner that answers every run with ``stdout``, exit 0, and counts the runs."""

    def __init__(self, stdout: str) -> None:
        super().__init__(timeout=5)
        self.stdout = stdout
        self.runs = 0

    def run(self, argv: list[str], env: dict[str, str] | None) -> RunResult:
        self.runs += 1
        return RunResult(Outcome.EXITED, 0, self.stdout)


class CallRunner(Runner):
    """A :class:`Runner` on a :class:`CallClock`."""

    def __init__(self, clock: CallClock, *, timeout: float, kill_grace: float) -> None:
        super().__init__(timeout=timeout, kill_grace=kill_grace, clock=clock)
        self.call_clock = clock

    def run(self, argv: list[str], env: dict[str, str] | None) -> RunResult:
        self.call_clock.start()
        return super().run(argv, env)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Host(FakeHost):
    """A fake host with an agent driven tick by tick on a fake monotonic clock; ``report``
    is the last tick's."""

    logs: ListHandler = field(default_factory=ListHandler)
    clock: Clock = field(default_factory=Clock)
    agent: Agent | None = None
    runner: Runner | None = None
    report: Report | None = None
    units: FakeUnits = field(default_factory=FakeUnits)

    def config(self, **overrides: Any) -> Config:
        base = Config(
            interval=10.0,
            probe_timeout=fakehost.PATIENT,
            nvidia_smi=self.smi,
            sysfs_root=self.root,
            proc_root=self.proc,
            state_file=os.path.join(self.dir, "state.json"),
            textfile=os.path.join(self.dir, "gpuagent.prom"),
            journal_directory=fakehost.quiet_journal(),
            # The fake answers its scenario per run: a test that changes it expects the next
            # tick's probe to be a run.  Tests of the loop set sampler="loop" and the fake's
            # loop_ms (tests/test_loop.py).
            sampler="spawn",
        )
        return base._replace(**overrides)

    def make_agent(
        self,
        units: FakeUnits | None = None,
        state_directory: str | None = None,
        boot: Callable[[], str] | None = None,
        wall: Callable[[], float] | None = None,
        hang: bool = False,
        **overrides: Any,
    ) -> Agent:
        """An agent on this host; ``state_directory`` is the unit's $STATE_DIRECTORY, ``boot``
        gives this boot's id (the machine's by default), ``wall`` the wall clock (the real
        one by default); ``hang``: its runner's timeouts count from the fake's logged call
        (:class:`CallClock`), for a test of a hang."""
        logger = logging.getLogger(f"test.{id(self)}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.handlers[:] = [self.logs]
        cfg = self.config(**overrides)
        if hang:
            self.runner = CallRunner(CallClock(self), timeout=cfg.probe_timeout, kill_grace=0.3)
        else:
            self.runner = Runner(timeout=cfg.probe_timeout, kill_grace=0.3)
        self.units = units or FakeUnits()
        self.agent = Agent(
            cfg,
            Prober(self.runner),
            EventLog(logger),
            monotonic=self.clock,
            units=lambda: self.units,
            state_directory=state_directory,
            boot=boot or bootid.current,
            wall=wall or time.time,
        )
        return self.agent

    def patient(self) -> None:
        """From now on the fake nvidia-smi gets this host's usual probe timeout to answer, the
        agent's config unchanged: after a hang test's short timeout, an answer the test waits
        for must not depend on how fast a busy machine starts a Python fake."""
        assert self.runner is not None
        self.runner.timeout = self.config().probe_timeout

    def tick(self, n: int = 1) -> Report:
        """Run ``n`` ticks, an interval apart on the fake clock; returns the last report."""
        assert self.agent is not None
        for _ in range(n):
            self.report = self.agent.tick()
            self.clock.now += self.agent.config.interval
        assert self.report is not None
        return self.report

    @property
    def state(self) -> State:
        """The last tick's state."""
        assert self.report is not None
        return self.report.state

    @property
    def probe(self) -> ProbeEntry:
        """The last tick's probe."""
        return self.state["probe"]

    def events(self, event: Event) -> list[logging.LogRecord]:
        return [r for r in self.logs.records if getattr(r, "MESSAGE_ID", None) == event.value]

    def lines(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.logs.records if r.levelno == level]


@pytest.fixture
def host(tmp_path: str) -> Iterator[Host]:
    made = fakehost.create(str(tmp_path))
    h = Host(**{f.name: getattr(made, f.name) for f in fields(FakeHost)})
    yield h
    assert h.logs.unsendable() == [], "fields the journal handler sets itself"
    if h.runner is not None:
        stuck = h.runner.stuck
        if stuck is not None:
            stuck.kill()
            stuck.wait()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The booted-systemd tests build root file systems and boot containers: they get
    pyproject's per-test timeout six times over."""
    for item in items:
        if item.get_closest_marker("system") is not None:
            item.add_marker(pytest.mark.timeout(1800))


@pytest.fixture
def public_dir() -> Iterator[str]:
    """A directory every user may search, as /etc/gpuagent is (pytest's tmp_path lies below a
    0700 directory, which check-config rightly reports: the service's user could not enter)."""
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    path = tempfile.mkdtemp(prefix="gpuagent-test-")
    os.chmod(path, 0o755)  # noqa: S103 - the point: every user may search it
    yield path
    shutil.rmtree(path)


@pytest.fixture(autouse=True)
def _no_system_bus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees a host without a system bus (as a container without systemd), whatever
    the machine running them has: the agent's units source then says so once and reads
    nothing.  Tests of the units give their own bus or reader."""
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/system_bus_socket")
