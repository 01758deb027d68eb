"""gpuagent.events and the event step: news between ticks (a kernel record in a real journal
file written while the agent runs, a unit's change on a mock systemd) on every surface at once,
off the grid, spawning nothing; a storm of records coalesced.

Bounded in time: every wait has a deadline, nothing sleeps to let time pass.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from gpuagent import config
from gpuagent.daemon import Daemon
from gpuagent.events import GAP, Pace, Waits
from gpuagent.logs import EventLog
from gpuagent.report import Report
from gpuagent.sources import Outcome, Source
from gpuagent.sources.kernel.kernel import KernelRecords
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.sources.services.nvservices import PERSISTENCED
from gpuagent.views import BusView, Tick
from tests import fakehost, journalfeed
from tests.conftest import Host, ListHandler
from tests.test_kernlog import remote

# The grid's interval in these tests: no tick falls in a test's waits.
INTERVAL = 60.0


# Pace (pure) -----------------------------------------------------------------------------


def test_news_runs_a_step_at_once_then_at_most_one_a_gap() -> None:
    pace = Pace()

    def at(now: float) -> tuple[float | None, bool]:
        return pace.listen(now), pace.ready(now)

    assert at(0.0) == (None, False)
    pace.news()
    assert pace.ready(0.0)
    pace.ran(10.0)
    assert at(10.0) == (None, False)
    pace.news()
    assert at(10.0 + GAP / 2) == (10.0 + GAP, False)  # not listened to until the step
    assert at(10.0 + GAP) == (None, True)
    pace.ticked()  # a tick read the news
    assert at(11.0) == (None, False)
    pace.news()
    assert at(11.0) == (None, True)


def test_a_wake_up_without_news_rests_the_descriptors_a_gap() -> None:
    pace = Pace()
    pace.woke(20.0)
    assert pace.listen(20.0 + GAP / 2) == 20.0 + GAP
    assert pace.listen(20.0 + GAP) is None
    # News heard on a wake-up just after a step: the later of the two rests.
    pace.ran(30.0)
    pace.woke(30.1)
    pace.news()
    assert pace.listen(30.1) == 30.1 + GAP


@pytest.mark.parametrize("news", [False, True])
def test_a_storm_of_wake_ups_costs_one_take_in_and_one_step_a_gap(news: bool) -> None:
    # The loop's decisions (as Daemon._wait_until makes them) on an injected clock, a
    # descriptor readable every 0.1 ms for 2 s: anyone's tiny signals (no news), or
    # systemd's UnitNew for a watched unit (news each time).
    pace = Pace()
    taken: list[float] = []
    steps: list[float] = []
    for i in range(20_000):
        now = i * 1e-4
        if pace.ready(now):
            steps.append(now)
            pace.ran(now)
        if pace.listen(now) is None:
            taken.append(now)
            pace.woke(now)
            if news:
                pace.news()
    assert len(taken) <= 2 / GAP + 1, len(taken)
    assert len(steps) <= (2 / GAP + 1 if news else 0), len(steps)
    for got in (taken, steps):
        assert all(b - a >= GAP - 1e-9 for a, b in itertools.pairwise(got))


@dataclass
class Piped(Source):
    """A source waiting on a pipe; ``answer`` its news."""

    name: str
    answer: bool
    asked: int = 0
    fds: tuple[int, int] = field(default_factory=os.pipe)

    def step(self, tick: Tick) -> Outcome:
        return Outcome()

    def waits_on(self) -> int | None:
        return self.fds[0]

    def news(self) -> bool:
        self.asked += 1
        os.read(self.fds[0], 1)
        return self.answer


def test_each_readable_source_is_asked_its_news() -> None:
    quiet, loud, none = Piped("kernel", False), Piped("services", True), Piped("scan", False)
    none.waits_on = lambda: None  # type: ignore[method-assign]
    waits = Waits([quiet, loud, none], lambda s: s.news())
    waited = waits.fds()
    assert waited == {quiet.fds[0]: quiet, loud.fds[0]: loud}
    for s in (quiet, loud):
        os.write(s.fds[1], b"x")
    # The one with news first: the other is still asked (it takes in what came).
    assert waits.news([loud.fds[0], quiet.fds[0], 999], waited)
    assert (quiet.asked, loud.asked, none.asked) == (1, 1, 0)
    os.write(quiet.fds[1], b"x")
    assert not waits.news([quiet.fds[0]], waited)
    for s in (quiet, loud, none):
        for fd in s.fds:
            os.close(fd)


# The agent's event step -------------------------------------------------------------------


def spawns(host: fakehost.FakeHost) -> int:
    """The fake nvidia-smi's runs so far."""
    try:
        with open(host.calls_log, encoding="utf-8") as f:
            return len(f.readlines())
    except FileNotFoundError:
        return 0


def test_an_event_step_spawns_nothing_and_is_no_tick(host: Host) -> None:
    agent = host.make_agent()
    ticked = host.tick()
    before = spawns(host)
    assert before > 0
    stepped = agent.event(published={})
    assert spawns(host) == before
    assert stepped.ticks == ticked.ticks == 1
    assert stepped.state["probe"] == ticked.state["probe"]
    assert [g["fields"] for g in stepped.state["gpus"]] == [
        g["fields"] for g in ticked.state["gpus"]
    ]
    assert host.tick().ticks == 2


def test_an_event_steps_bug_is_the_internal_trouble(host: Host) -> None:
    agent = host.make_agent()
    host.tick()
    kernel = next(s for s in agent.sources if s.name == "kernel")

    def broken(_: Tick) -> Outcome:
        raise RuntimeError("boom")

    kernel.step = broken  # type: ignore[assignment, method-assign]
    assert agent.event().state["problems"]["internal"] == "RuntimeError: boom"
    del kernel.step  # the class's again
    assert "internal" not in agent.event().state["problems"]

    # A source's news that fails is news: the step publishes the trouble.
    def failing() -> bool:
        raise ZeroDivisionError("division by zero")

    kernel.news = failing  # type: ignore[method-assign]
    assert agent.news(kernel)
    assert "ZeroDivisionError" in agent.event().state["problems"]["internal"]
    assert sum("internal error" in line for line in host.lines(logging.ERROR)) == 2


# A daemon on a real journal ---------------------------------------------------------------


@dataclass
class Running:
    """A daemon on a fake host whose journal is ``journal`` (a directory), its first tick
    run; ``steps`` each event step's end (monotonic s) and report."""

    daemon: Daemon
    host: fakehost.FakeHost
    journal: str
    logs: ListHandler
    steps: list[tuple[float, Report]] = field(default_factory=list)

    def wait(self, seconds: float) -> None:
        """Run the loop between ticks for ``seconds``."""
        assert not self.daemon._wait_until(time.monotonic() + seconds)

    def first(self, after: float, done: Callable[[Report], bool]) -> float:
        """How long after ``after`` (monotonic s) the first event step whose report is
        ``done`` ended."""
        for at, report in self.steps:
            if at >= after and done(report):
                return at - after
        raise AssertionError(f"no such event step: {[r.status for _, r in self.steps]}")

    def state(self) -> dict[str, Any]:
        with open(self.daemon.config.state_file, encoding="utf-8") as f:
            return dict(json.load(f))

    def textfile(self) -> str:
        with open(self.daemon.config.textfile, encoding="utf-8") as f:
            return f.read()


def run_daemon(directory: str, **settings: object) -> Running:
    journal = os.path.join(directory, "journal")
    os.makedirs(journal)
    journalfeed.append(journal, ["Linux version 6.1.0 (the boot's first record)"])
    host = fakehost.create(directory, 2, interval=INTERVAL, journal_directory=journal, **settings)
    logs = ListHandler()
    logger = logging.getLogger(f"test.events.{id(host)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.handlers[:] = [logs]
    daemon = Daemon(config.load(host.conf, required=True), (host.conf, True), log=EventLog(logger))
    running = Running(daemon, host, journal, logs)
    step = daemon.event_step

    def noted() -> Report:
        report = step()
        running.steps.append((time.monotonic(), report))
        return report

    daemon.event_step = noted  # type: ignore[method-assign]
    assert daemon.start(install_signals=False) is None
    daemon.step()
    return running


@pytest.fixture
def running(tmp_path: str) -> Iterator[Running]:
    remote()
    r = run_daemon(str(tmp_path))
    yield r
    r.daemon.finish("ticks")


def xid_79(report: Report) -> bool:
    return any(p.get("xid") == 79 for g in report.state["gpus"] for p in g["problems"])


def test_an_appended_record_is_on_every_surface_within_a_second(running: Running) -> None:
    slot = running.host.slots[0]
    before = spawns(running.host)
    journalfeed.append(running.journal, [journalfeed.xid(slot)])
    written = time.monotonic()
    running.wait(1.5)
    assert running.first(written, xid_79) < 1.0
    state = running.state()
    assert state["ticks"] == 1  # no tick: an event step
    assert any(p.get("xid") == 79 for p in state["gpus"][0]["problems"])
    assert f'slot="{slot}"' in running.textfile()
    assert 'kind="xid"' in running.textfile()
    assert any("Xid 79" in r.getMessage() for r in running.logs.records)
    assert spawns(running.host) == before


def test_a_journal_file_moved_in_is_read_at_once(running: Running, tmp_path: str) -> None:
    # Its entries carry this boot's current monotonic stamps: stamped earlier than the
    # reader's position, sd-journal would order them before it and skip them.
    made = os.path.join(tmp_path, "elsewhere.journal")
    journalfeed.write_file(
        made, journalfeed.kernel_records([journalfeed.xid(running.host.slots[1])])
    )
    os.rename(made, os.path.join(running.journal, "moved.journal"))
    moved = time.monotonic()
    running.wait(1.5)
    assert running.first(moved, xid_79) < 1.0
    assert running.state()["ticks"] == 1


def test_a_file_vacuumed_away_is_no_news_and_no_trouble(running: Running, tmp_path: str) -> None:
    made = os.path.join(tmp_path, "old.journal")
    journalfeed.write_file(
        made, journalfeed.kernel_records([journalfeed.xid(running.host.slots[1])])
    )
    os.rename(made, os.path.join(running.journal, "old.journal"))
    running.wait(0.5)
    steps = len(running.steps)
    assert steps == 1
    asked: list[bool] = []
    news = running.daemon.waits._news

    def counting(source: Source) -> bool:
        asked.append(news(source))
        return asked[-1]

    running.daemon.waits._news = counting
    # What journald's vacuum does: the oldest file goes (a rotation adds one: moved in above).
    os.remove(os.path.join(running.journal, "old.journal"))
    running.wait(1.0)
    assert len(running.steps) == steps
    assert 1 <= len(asked) <= 3, asked  # woken by the deletion, then quiet: no spin
    assert not any(asked)
    assert "journal" not in running.daemon.agent.tick().state["problems"]


@dataclass
class Stormy(Piped):
    """A source whose descriptor stays readable (nothing is read from it: a storm without
    end); ``times`` when it was asked its news (``clock``'s time)."""

    clock: Callable[[], float] = time.monotonic
    times: list[float] = field(default_factory=list)

    def news(self) -> bool:
        self.times.append(self.clock())
        return self.answer


@pytest.mark.parametrize("news", [False, True])
def test_the_loop_takes_a_storm_in_once_a_gap_on_an_injected_clock(
    running: Running, monkeypatch: pytest.MonkeyPatch, news: bool
) -> None:
    import gpuagent.daemon  # noqa: PLC0415

    now = [1000.0]
    storm = Stormy("services", news, clock=lambda: now[0])
    os.write(storm.fds[1], b"x")
    daemon = running.daemon
    daemon.monotonic = lambda: now[0]
    daemon.pace = Pace()
    daemon.waits = Waits([storm], lambda s: s.news())
    steps: list[float] = []

    def step() -> Report:
        steps.append(now[0])
        daemon.pace.ran(now[0])
        assert daemon.report is not None  # the first tick's
        return daemon.report

    daemon.event_step = step  # type: ignore[method-assign]

    def select(r: list[int], w: list[int], x: list[int], timeout: float) -> tuple[list[int], ...]:
        # The storm's descriptor is readable 0.1 ms after it is waited on; without it the
        # wait lasts its whole timeout, on the injected clock alone.
        if storm.fds[0] in r:
            now[0] += 1e-4
            return [storm.fds[0]], [], []
        now[0] += timeout
        return [], [], []

    monkeypatch.setattr(gpuagent.daemon, "select", SimpleNamespace(select=select))
    try:
        assert not daemon._wait_until(now[0] + 2.0)
    finally:
        for fd in storm.fds:
            os.close(fd)
    # 2 s of wake-ups: one take-in, and one step for news, each gap (was one each 0.1 ms).
    assert len(storm.times) <= 2 / GAP + 1, len(storm.times)
    assert len(steps) <= (2 / GAP + 1 if news else 0), len(steps)
    for got in (storm.times, steps):
        assert all(b - a >= GAP - 1e-9 for a, b in itertools.pairwise(got)), got


def test_a_storm_coalesces_and_a_record_after_it_is_seen_at_once(running: Running) -> None:
    slot = running.host.slots[0]
    record = journalfeed.xid(slot, 13, "Graphics Exception")

    def storm() -> None:
        # 10,000 records in batches back to back, each stamped as it is written: about a
        # second of them on this machine, more on a slower one.
        for _ in range(10):
            journalfeed.append(running.journal, [record] * 1000)

    # What reading those records costs anyway: a reader of the same journal, past what the
    # agent read before the storm, reads them in one poll after it.
    reader = KernelRecords(running.journal, EventLog(logging.getLogger("test.events.quiet")))
    reader.poll(BusView())
    writer = threading.Thread(target=storm)
    # The loop's CPU alone (this thread's): the writer's thread is the storm's, not the agent's.
    cpu = time.thread_time()
    writer.start()
    end = time.monotonic() + 120
    while writer.is_alive():
        assert time.monotonic() < end, "the storm was never written"
        running.wait(0.5)
    writer.join()
    running.wait(1.0)
    agent_cpu = time.thread_time() - cpu
    cpu = time.thread_time()
    reader.poll(BusView())
    read_cpu = time.thread_time() - cpu
    reader.journal.close()
    ends = [at for at, _ in running.steps]
    assert len(ends) >= 2, "the storm was read in one step: not spread over time"
    # Each step ends at least a gap after the one before it (and takes time itself).
    assert min(b - a for a, b in itertools.pairwise(ends)) >= GAP
    counts = [x["count"] for x in running.steps[-1][1].state["gpus"][0]["xids"] if x["xid"] == 13]
    assert counts == [10_000]
    assert running.state()["ticks"] == 1
    assert agent_cpu <= 2 * read_cpu, (agent_cpu, read_cpu)
    journalfeed.append(running.journal, [journalfeed.xid(slot)])
    written = time.monotonic()
    running.wait(1.5)
    assert running.first(written, xid_79) < 1.0


class Unreliable:
    """A journal reader that says its descriptor cannot be relied on (a network file
    system's files, which inotify does not see change)."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def reliable_fd(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


def test_a_journal_that_cannot_be_waited_on_is_said_once_and_read_each_tick(
    tmp_path: str,
) -> None:
    remote()
    from systemd import journal  # noqa: PLC0415

    directory = os.path.join(tmp_path, "journal")
    os.mkdir(directory)
    journalfeed.append(directory, ["Linux version 6.1.0"])
    logs = ListHandler()
    logger = logging.getLogger("test.events.unreliable")
    logger.handlers[:] = [logs]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False

    def unreliable(d: str) -> KernelLog:
        return KernelLog(d, open_reader=lambda p: Unreliable(journal.Reader(path=p)))

    records = KernelRecords(directory, EventLog(logger), open_log=unreliable)
    assert records.waits_on() is None  # not open yet: nothing to say
    records.poll(BusView())
    assert records.waits_on() is None
    assert records.waits_on() is None
    said = [r.getMessage() for r in logs.records if "cannot be waited on" in r.getMessage()]
    assert said == [
        f"{directory} cannot be waited on (its files are on a file system whose changes "
        "inotify does not see): the kernel's records are read at each tick"
    ]
    assert logs.records[-1].levelno == logging.INFO
    journalfeed.append(directory, [journalfeed.xid("0000:41:00.0")])
    records.poll(BusView())
    assert records.view([]).told == {("0000:41:00.0", "xid", 79)}
    # The same journal can be waited on.
    plain = KernelRecords(directory, EventLog(logger))
    plain.poll(BusView())
    assert plain.waits_on() is not None
    plain.journal.close()
    records.journal.close()


# A unit's change on a mock systemd ---------------------------------------------------------


def test_a_unit_stopping_is_seen_within_a_second(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import test_units  # noqa: PLC0415

    remote()
    parameters = {
        **test_units.PARAMETERS,
        "units": {
            **test_units.PARAMETERS["units"],
            PERSISTENCED: {"LoadState": "loaded", "ActiveState": "active", "SubState": "running"},
        },
    }
    with (
        test_units.private_bus(str(tmp_path)) as bus,
        test_units.mock_systemd(bus, parameters),
    ):
        monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", bus.address)
        running = run_daemon(os.path.join(tmp_path, "host"))
        try:
            running.wait(0.5)  # the UnitNew signals of the units the first read loaded

            def down(report: Report) -> bool:
                return any(p["kind"] == "persistenced_down" for p in report.state["host_problems"])

            assert not down(running.daemon.report)  # type: ignore[arg-type]
            test_units.set_unit(
                bus, PERSISTENCED, LoadState="loaded", ActiveState="inactive", SubState="dead"
            )
            stopped = time.monotonic()
            running.wait(1.5)
            assert running.first(stopped, down) < 1.0
            assert running.state()["ticks"] == 1
        finally:
            running.daemon.finish("ticks")


# `gpuagent run` as a real process ----------------------------------------------------------


def test_gpuagent_run_says_an_appended_record_in_its_status_line_at_once(tmp_path: str) -> None:
    from tests import test_daemon  # noqa: PLC0415

    remote()
    journal = os.path.join(tmp_path, "journal")
    os.mkdir(journal)
    journalfeed.append(journal, ["Linux version 6.1.0"])
    host = fakehost.create(str(tmp_path), 2, interval=INTERVAL, journal_directory=journal)
    notify = test_daemon.Notify(os.path.join(tmp_path, "notify.sock"), abstract=False)
    proc = test_daemon.start(host, notify)
    try:
        notify.wait_for("READY=1", 30)
        notify.wait_for("STATUS=2 GPUs, sampling", 30)
        journalfeed.append(journal, [journalfeed.xid(host.slots[0])])
        written = time.monotonic()
        # Xid 79 asks for a reboot: the line leads with it.
        fixes = f"drain and reboot: fixes {host.slots[0]}"
        notify.wait_for(fixes, 5)
        said = next(at for at, text in notify.messages if fixes in text)
        assert said - written < 1.0
        with open(os.path.join(host.dir, "state.json"), encoding="utf-8") as f:
            assert json.load(f)["ticks"] == 1
    finally:
        code, _ = test_daemon.stop(proc)
        notify.sock.close()
    assert code == 0
