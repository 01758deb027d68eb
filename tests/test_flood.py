"""A flood of kernel records naming PCI addresses of no GPU ("stray" addresses), read from
real journal files (make-test-journal, this boot): bounded cost, lines and memory; READY=1,
the watchdog and SIGTERM during the boot read."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuagent.config import Config
from gpuagent.daemon import Daemon
from gpuagent.logs import EventLog
from gpuagent.notify import Notifier
from gpuagent.sources.kernel import kernel
from gpuagent.sources.kernel.kernel import KernelRecords
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.sources.kernel.source import Kernel
from gpuagent.sources.kernel.xidcount import MAX_STRAYS
from gpuagent.views import BusView
from tests import test_kernlog
from tests.conftest import Host, ListHandler
from tests.journalfeed import this_boot

make = test_kernlog.make


def flood(n: int, code: int = 48) -> str:
    """``n`` Xid records (make-test-journal's input), each naming another address of no GPU
    (domains 0100 on: no host has them)."""
    lines = []
    for i in range(n):
        domain, bus, device = 0x100 + i // (256 * 32), (i // 32) % 256, i % 32
        where = f"{domain:04x}:{bus:02x}:{device:02x}"
        lines.append(f"[ {100 + i / 1000:.6f}] NVRM: Xid (PCI:{where}): {code}, pid=1, DBE\n")
    return "".join(lines)


class Ticking:
    """A monotonic clock that moves on ``step`` s each time it is read, and calls ``at``
    once when it has been read ``when`` times: the boot read's pace made exact."""

    def __init__(self, step: float = 0.001, when: int = 0, at: Callable[[], None] = print) -> None:
        self.now, self.step, self.reads, self.when, self.at = 0.0, step, 0, when, at

    def __call__(self) -> float:
        self.reads += 1
        if self.reads == self.when:
            self.at()
        self.now += self.step
        return self.now


def read_all(source: KernelRecords) -> None:
    """Read the boot to its end, a slice at a time, within a deadline."""
    end = time.monotonic() + 120
    while source.reading:
        assert time.monotonic() < end, "the boot read never ended"
        source.read()


def boot_read_time(journal: str) -> float:
    source = KernelRecords(journal, EventLog(logging.getLogger("test.flood.quiet")))
    t0 = time.perf_counter()
    source.poll(BusView())
    read_all(source)
    source.poll(BusView())
    return time.perf_counter() - t0


def test_ten_thousand_stray_addresses_cost_each_record_the_same(make: Any) -> None:
    small, large = make(flood(1000), "small"), make(flood(10_000), "large")
    boot_read_time(small)  # the first read pays for the imports and the page cache
    # Ten times the records in ten times the time, not a hundred (each new address used to
    # rebuild every count): a ratio within one run, never an absolute time.
    ratio = boot_read_time(large) / boot_read_time(small)
    assert ratio < 25, ratio


def test_ten_thousand_stray_addresses_log_at_most_twenty_lines(host: Host, make: Any) -> None:
    agent = host.make_agent(journal_directory=make(flood(10_000)))
    host.tick()
    read_all(agent.source(Kernel).records)
    snap = host.tick().state
    assert len(host.logs.records) <= 20, [r.getMessage() for r in host.logs.records]
    # Memory: a boot holds a bounded number of addresses that are no GPU, the rest counted.
    assert len(agent.source(Kernel).records.xids.counts(host.slots)) <= MAX_STRAYS
    assert agent.source(Kernel).records.xids.overflow == 10_000 - MAX_STRAYS
    host_problems = snap["host_problems"]
    assert len(host_problems) <= 6
    (others,) = [p for p in host_problems if "counted, not kept" in p["message"]]
    assert f"{10_000 - MAX_STRAYS} records named PCI addresses that are no GPU" in others["message"]
    assert others["action"] == "check_host"
    assert all(g["health"] == "ok" for g in snap["gpus"])
    assert "journal" not in snap["problems"]


class Recorder(Notifier):
    def __init__(self) -> None:
        super().__init__({})
        self.sent: list[str] = []

    def _send(self, message: str) -> None:
        self.sent.append(message)


def daemon_on(host: Host, journal: str, clock: Ticking) -> tuple[Daemon, Recorder, ListHandler]:
    logs = ListHandler()
    logger = logging.getLogger(f"test.flood.{id(host)}")
    logger.handlers[:] = [logs]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    cfg = Config(
        nvidia_smi=host.smi,
        sysfs_root=host.root,
        state_file=os.path.join(host.dir, "state.json"),
        textfile="",
        probe_timeout=5.0,
        journal_directory=journal,
    )
    notifier = Recorder()
    daemon = Daemon(cfg, ("/nonexistent.toml", False), notifier=notifier, log=EventLog(logger))
    # The journal read on a clock that moves 1 ms a record: 100 records a slice, anywhere.
    daemon.agent.source(Kernel).records.journal = KernelLog(
        journal, clock=clock, kernel_boot=this_boot
    )
    return daemon, notifier, logs


def test_ready_comes_before_a_flooded_boot_read_ends(
    host: Host, make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    daemon, notifier, _ = daemon_on(host, make(flood(10_000)), Ticking())
    pings: list[bool] = []
    real_ping = daemon.watchdog.ping_if_due

    def ping() -> None:
        pings.append(daemon.agent.backlog)
        real_ping()

    monkeypatch.setattr(daemon.watchdog, "ping_if_due", ping)
    assert daemon.start(install_signals=False) is None
    report = daemon.step()
    assert notifier.sent[0].startswith("READY=1\nSTATUS=")
    assert daemon.agent.backlog
    # The state does not pass a half-read boot off as all of it.
    assert "agent problem: journal" in notifier.sent[0]
    assert report.state["problems"]["journal"].startswith("reading this boot's kernel records (")
    assert daemon._read_boot()
    assert pings.count(True) >= 10  # fed between the slices of the read
    report = daemon.step()
    assert "journal" not in report.state["problems"]
    assert any("counted, not kept" in p["message"] for p in report.state["host_problems"])
    daemon.finish("ticks")


def test_sigterm_during_a_flooded_boot_read_stops_the_run_at_once(
    host: Host, make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder: list[Daemon] = []
    clock = Ticking(when=1000, at=lambda: holder[0].signals._on_signal(signal.SIGTERM, None))
    daemon, notifier, _ = daemon_on(host, make(flood(10_000)), clock)
    holder.append(daemon)
    monkeypatch.setattr(daemon.signals, "install", lambda: None)
    deadline = time.monotonic() + 60
    assert daemon.run() == 0
    assert time.monotonic() < deadline
    # Stopped within the slice the signal came in (SLICE at 1 ms a clock read), long before
    # the read's end.
    assert clock.reads <= 1000 + kernel.SLICE / clock.step + 2
    assert daemon.agent.backlog
    assert "STOPPING=1" in notifier.sent
