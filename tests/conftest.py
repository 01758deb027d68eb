"""Shared fixtures: a fake host (sysfs tree + replaying nvidia-smi) and an agent on it."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from gpuagent.agent import Agent
from gpuagent.config import Config
from gpuagent.logs import Event, EventLog
from gpuagent.probe import Prober
from gpuagent.runner import Runner
from tests import fakesysfs

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_SMI = os.path.join(HERE, "fake_nvidia_smi.py")
H200_LOAD = "h200-linux-driver590.48.01-load-query-gpu-all-fields.csv"
MISMATCH = "driver-library-version-mismatch-exit18-nvml535.161.txt"


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Host:
    """A fake machine: ``root`` sysfs, ``smi`` the fake nvidia-smi, ``slots`` its GPUs."""

    dir: str
    root: str
    smi: str
    slots: list[str]
    calls_log: str
    logs: ListHandler
    clock: Clock = field(default_factory=Clock)
    agent: Agent | None = None

    def scenario(self, **step: Any) -> None:
        step.setdefault("log", self.calls_log)
        tmp = self.smi + ".json.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(step, f)
        os.replace(tmp, self.smi + ".json")

    def healthy(self, slots: list[str] | None = None, **extra: Any) -> None:
        self.scenario(capture=H200_LOAD, slots=self.slots if slots is None else slots, **extra)

    def failing(self, error: str = MISMATCH, code: int = 18) -> None:
        self.scenario(error=error, exit=code)

    @property
    def spawns(self) -> int:
        if not os.path.exists(self.calls_log):
            return 0
        with open(self.calls_log) as f:
            return sum(1 for _ in f)

    def config(self, **overrides: Any) -> Config:
        base = Config(
            interval=10.0,
            probe_timeout=5.0,
            nvidia_smi=self.smi,
            sysfs_root=self.root,
            state_file=os.path.join(self.dir, "state.json"),
            textfile=os.path.join(self.dir, "gpuagent.prom"),
        )
        return replace(base, **overrides)

    def make_agent(self, **overrides: Any) -> Agent:
        logger = logging.getLogger(f"test.{id(self)}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.handlers[:] = [self.logs]
        cfg = self.config(**overrides)
        runner = Runner(timeout=cfg.probe_timeout, kill_grace=0.3)
        self.agent = Agent(cfg, Prober(runner), EventLog(logger), monotonic=self.clock)
        return self.agent

    def tick(self, n: int = 1) -> Agent:
        assert self.agent is not None
        for _ in range(n):
            self.agent.tick()
            self.clock.now += self.agent.config.interval
        return self.agent

    def events(self, event: Event) -> list[logging.LogRecord]:
        return [r for r in self.logs.records if getattr(r, "MESSAGE_ID", None) == event.value]

    def lines(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.logs.records if r.levelno == level]


@pytest.fixture
def host(tmp_path: str) -> Iterator[Host]:
    d = str(tmp_path)
    root = os.path.join(d, "sys")
    slots = fakesysfs.gpu_host(root, 8)
    smi = os.path.join(d, "bin", "nvidia-smi")
    os.makedirs(os.path.dirname(smi))
    os.symlink(FAKE_SMI, smi)
    h = Host(d, root, smi, slots, os.path.join(d, "calls.log"), ListHandler())
    h.healthy()
    yield h
    if h.agent is not None:
        stuck = h.agent.prober.runner.stuck
        if stuck is not None:
            stuck.kill()
            stuck.wait()
