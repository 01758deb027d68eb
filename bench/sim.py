"""Simulation helpers for the benchmarks and the soak: fake hosts and a scripted runner.

The scripted runner answers like nvidia-smi (from the real captures) without spawning, so a
simulated day or 100,000 ticks take seconds; it counts what would have been spawns.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from bench.nvml import Starts
from gpuagent.agent import Agent
from gpuagent.config import Config
from gpuagent.configkeys import check_key
from gpuagent.edges.loopchild import LoopChild
from gpuagent.edges.runner import Outcome, Runner, RunResult
from gpuagent.logs import EventLog
from gpuagent.sources.board import serials
from gpuagent.sources.probe.probe import Prober
from gpuagent.sources.probe.smi import FIELDS
from gpuagent.sources.probe.source import Probe
from tests import fakesysfs, replay
from tests.fake_units import FakeUnits
from tests.fakehost import H200_LOAD, MISMATCH, quiet_journal


def make_host(root: str, gpus: int, devices: int = 200) -> list[str]:
    """A sysfs tree of ``devices`` PCI functions, ``gpus`` of them NVIDIA H200s."""
    slots = fakesysfs.gpu_host(root, gpus) if gpus else []
    if not gpus:
        fakesysfs.set_module(root, False)
    have = len(os.listdir(os.path.join(root, "bus", "pci", "devices"))) if gpus else 0
    for i in range(devices - have):
        fakesysfs.add_device(
            root, f"0001:{i // 32:02x}:{i % 32:02x}.0", 0x8086, 0x1000 + i, 0x088000, None
        )
    return slots


# NVLink as an H200 host answers: its 18 links up, and the only counters capture's (an H100's).
NVLINK_STATUS = "nvlink-status-h200-driver590.48.01-18-links.txt"
NVLINK_COUNTERS = "nvlink-errorcounters-h100-80gb-hbm3-driverUNKNOWN-placeholder-uuid-TRIMMED.txt"


def instant_nvidia_smi(directory: str, slots: list[str], processes: int = 2) -> str:
    """A real nvidia-smi stand-in that ``cat``s the H200 capture projected onto the query,
    for ``nvlink --status`` and ``--errorcounters`` the NVLink captures projected onto the
    GPUs, and for ``--query-compute-apps`` ``processes`` processes on each GPU (the real
    capture's sizes, PIDs of their own; no name: the agent reads those from /proc)."""
    answer = os.path.join(directory, "answer.csv")
    text, _ = replay.answer(replay.load(H200_LOAD), list(FIELDS), "csv,noheader,nounits", slots)
    with open(answer, "w") as f:
        f.write(text)
    status, counters = (os.path.join(directory, n) for n in ("status.txt", "counters.txt"))
    with open(status, "w") as f:
        f.write(replay.nvlink_answer(replay.nvlink_capture(NVLINK_STATUS), slots))
    with open(counters, "w") as f:
        capture = replay.nvlink_capture(NVLINK_COUNTERS)
        f.write(replay.nvlink_answer(capture, slots, counters=True))
    apps = os.path.join(directory, "apps.csv")
    with open(apps, "w") as f:
        for i, slot in enumerate(slots):
            for n in range(processes):
                pid = 10000 + i * 100 + n
                f.write(f"{replay.gpu_uuid(slot)}, {pid}, {2566 + n}\n")
    boards = os.path.join(directory, "serials.csv")
    with open(boards, "w") as f:
        f.write("".join(f"00000000:{slot[5:].upper()}, 0000000000000\n" for slot in slots))
    loop = _loop_mode(directory, answer)
    return _script(
        os.path.join(directory, "nvidia-smi"),
        "#!/bin/sh\n"
        f'case "$1 $2" in "nvlink --status") exec cat {status} ;; '
        f'"nvlink --errorcounters") exec cat {counters} ;; esac\n'
        f'case "$1" in --query-compute-apps=*) exec cat {apps} ;; '
        f"{serials.ARGS[0]}) exec cat {boards} ;; esac\n"
        # Loop mode's value is the argument after its flag; a one-shot walks no argument.
        f'case "$*" in *" -l"*) for a; do case $p in -lms) exec {loop} "$a" ;; '
        f'-l) exec {loop} "${{a}}000" ;; esac; p=$a; done ;; esac\n'
        f"exec cat {answer}\n",
    )


def _script(path: str, text: str) -> str:
    """``text`` as the executable ``path``; returns ``path``."""
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def _loop_mode(directory: str, answer: str) -> str:
    """The stand-in's loop mode (``-lms MS``, ``-l SEC``): a bash script printing ``answer``
    at once and every MS ms until it is killed, as one process that forks nothing a sample
    (a real loop is one process: one NVML start); it waits on a FIFO nothing writes to."""
    fifo = os.path.join(directory, "loop.fifo")
    os.mkfifo(fifo)
    return _script(
        os.path.join(directory, "nvidia-smi-loop"),
        "#!/bin/bash\n"
        f"IFS= read -r -d '' answer <{answer}\n"
        f"exec 3<>{fifo}\n"
        "printf -v period %d.%03d $(($1 / 1000)) $(($1 % 1000))\n"
        'while printf %s "$answer"; do read -r -t "$period" -u 3 _; done\n',
    )


@dataclass
class ScriptedRunner(Runner):
    """A :class:`Runner` whose child is a script: ``step`` says what the next run returns
    (to ``--query-compute-apps`` while it answers: one process on each GPU); ``nvlink``
    whether the GPUs answer ``nvlink`` with their 18 links (an NVSwitch host: the H200 and
    H100 captures), else with nothing (a PCIe host).

    ``spawns`` counts every run; ``starts`` the NVML starts among them, by kind.  Whatever
    stands in here for an exec of nvidia-smi calls ``starts.started(argv)`` once: a
    long-lived child, once when it starts."""

    slots: list[str] = field(default_factory=list)
    step: str = "healthy"
    nvlink: bool = False
    spawns: int = 0
    starts: Starts = field(default_factory=Starts)

    def __post_init__(self) -> None:
        super().__init__(timeout=8.0)
        cap = replay.load(H200_LOAD)
        rows, _ = replay.answer(cap, list(FIELDS), "csv,noheader,nounits", self.slots)
        with open(os.path.join(replay.CORPUS, "errors", MISMATCH), encoding="utf-8") as f:
            mismatch = f.read()
        apps = "".join(
            f"{replay.gpu_uuid(slot)}, {10000 + i}, 2566\n" for i, slot in enumerate(self.slots)
        )
        self._apps = RunResult(Outcome.EXITED, 0, apps)
        links = [
            replay.nvlink_answer(replay.nvlink_capture(NVLINK_STATUS), self.slots),
            replay.nvlink_answer(replay.nvlink_capture(NVLINK_COUNTERS), self.slots, counters=True),
        ]
        self._links = {
            arg: RunResult(Outcome.EXITED, 0, text if self.nvlink else "")
            for arg, text in zip(("--status", "--errorcounters"), links, strict=True)
        }
        # The boards' serials, as the capture's collector left them (masked: none).
        serials = "".join(f"00000000:{slot[5:].upper()}, 0000000000000\n" for slot in self.slots)
        self._serials = RunResult(Outcome.EXITED, 0, serials)
        self._answers = {
            "healthy": RunResult(Outcome.EXITED, 0, rows),
            "missing_gpu": RunResult(Outcome.EXITED, 0, rows.split("\n", 1)[1]),
            "version_mismatch": RunResult(Outcome.EXITED, 18, mismatch),
            "driver_not_loaded": RunResult(
                Outcome.EXITED,
                9,
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            ),
            "timeout": RunResult(Outcome.TIMEOUT),
            "garbage": RunResult(Outcome.EXITED, 0, "\ufffd\ufffd garbage\n"),
            "flood": RunResult(Outcome.OVERFLOW, stdout="x" * 4096),
            "gpu_lost": RunResult(
                Outcome.EXITED,
                15,
                "Unable to determine the device handle for GPU 0000:18:00.0: GPU is lost.",
            ),
        }

    def run(self, argv: list[str], env: dict[str, str] | None) -> RunResult:
        self.spawns += 1
        self.starts.started(argv)
        return self.answer(argv)

    def answer(self, argv: list[str]) -> RunResult:
        """What a run of ``argv`` returns now, counting nothing."""
        if argv[1:2] == ["nvlink"] and self.step in ("healthy", "missing_gpu"):
            # A PCIe host's: drivers before 595 print nothing for a GPU without NVLink.
            return self._links[argv[2]]
        if argv[1:2] == ["nvlink"]:
            return RunResult(Outcome.EXITED, 0, "")
        if argv[1:2] == [serials.ARGS[0]] and self.step in ("healthy", "missing_gpu"):
            return self._serials
        if any(a.startswith("--query-compute-apps=") for a in argv) and self.step in (
            "healthy",
            "missing_gpu",
        ):
            return self._apps  # a process on each GPU
        return self._answers[self.step]


class ScriptedLoop(LoopChild):
    """A :class:`LoopChild` whose child is ``runner``'s script in nvidia-smi's loop mode: from
    its start it "prints" one sample per ``-lms`` interval elapsed on ``clock`` (the first at
    once), each what ``runner`` answers its query then.  An answer that is an error is printed
    and ends the loop with its status, a timeout is a loop that stalls, an overflow a line too
    long.  A start counts one spawn and one NVML start in ``runner``."""

    def __init__(self, runner: ScriptedRunner, clock: Callable[[], float]) -> None:
        super().__init__(clock=clock)
        self.runner = runner
        self._argv: list[str] = []
        self._period = 1.0
        self._started = 0.0
        self._printed = 0
        self._code: int | None = None
        self._on = False

    @property
    def running(self) -> bool:
        return self._on

    def start(self, argv: list[str], env: dict[str, str] | None) -> OSError | None:
        self.runner.spawns += 1
        self.runner.starts.started(argv)
        self.overflowed, self._on, self._code = False, True, None
        self._argv = argv[: argv.index("-lms")]
        self._period = int(argv[argv.index("-lms") + 1]) / 1000
        self._started, self._printed = self.clock(), 0
        return None

    def lines(self) -> list[str]:
        if not self._on or self._code is not None:
            return []
        due = int((self.clock() - self._started) // self._period) + 1
        out: list[str] = []
        while self._printed < due and self._code is None:
            self._printed += 1
            answer = self.runner.answer(self._argv)
            if answer.outcome is Outcome.TIMEOUT:
                break  # stalled: prints nothing more
            if answer.outcome is Outcome.OVERFLOW:
                self.overflowed = True
                break
            out += answer.stdout.splitlines()
            if answer.exit_code != 0:
                self._code = answer.exit_code
        return out[-self.keep :]

    def exit_code(self) -> int | None:
        return self._code if self._on else None

    def stop(self, grace: float) -> subprocess.Popen[bytes] | None:
        self._on = False
        return None


class CountingHandler(logging.Handler):
    """Counts log lines by level (what journald would store at the default level)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.by_level: dict[int, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.by_level[record.levelno] = self.by_level.get(record.levelno, 0) + 1

    def at_least(self, level: int) -> int:
        return sum(n for lvl, n in self.by_level.items() if lvl >= level)


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


class Sim(NamedTuple):
    """A scripted agent: its runner, the counter of its log lines, its fake monotonic clock
    and the log it writes to (for the outputs the bench writes beside it)."""

    agent: Agent
    runner: ScriptedRunner
    counter: CountingHandler
    clock: FakeClock
    log: EventLog


def scripted_agent(
    root: str,
    smi: str | None,
    slots: list[str],
    interval: float = 10.0,
    *,
    which: Callable[[str], str | None] | None = None,
    nvlink: bool = False,
    settings: Mapping[str, object] | None = None,
) -> Sim:
    """An agent on ``root`` whose nvidia-smi is scripted; ``smi=None`` means not installed.
    ``which`` looks nvidia-smi up instead (default: it is always ``smi``); ``nvlink`` as
    :class:`ScriptedRunner`'s; ``settings`` config keys by name, as a config file gives
    them (``{"nvlink_interval": 30}``).  Raises ConfigError naming a bad key or value."""
    runner = ScriptedRunner(slots=slots, nvlink=nvlink)
    clock = FakeClock()
    # The loop sampler's stall and its kill grace on the fake clock, as its child's samples.
    runner.clock = clock
    counter = CountingHandler()
    logger = logging.getLogger(f"bench.{id(runner)}")
    logger.handlers[:] = [counter]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    cfg = Config(
        interval=interval,
        sysfs_root=root,
        nvidia_smi=smi or "/nonexistent/nvidia-smi",
        state_file=os.path.join(root, "state.json"),
        # The fake hosts' journal, without kernel records: this machine may have no system
        # journal, and an unreadable one is a warning the day's counts would include.
        journal_directory=quiet_journal(),
    )._replace(**{k: check_key("bench", k, v) for k, v in (settings or {}).items()})
    log = EventLog(logger)
    # NVIDIA's units as systemd on a host without them answers: watched, none installed.
    agent = Agent(
        cfg,
        Prober(runner),
        log,
        monotonic=clock,
        which=which or (lambda name: smi),
        units=FakeUnits,
    )
    # nvidia-smi's loop (sampler = "loop") is the script too, on the fake clock.
    agent.source(Probe).probing.sampler.child = ScriptedLoop(runner, clock)
    return Sim(agent, runner, counter, clock, log)
