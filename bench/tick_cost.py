"""The agent's own CPU per tick (process CPU time, children excluded), with a breakdown, and
beside it its children's (``RUSAGE_CHILDREN``: here the stand-in nvidia-smi's, a floor of
what a real one costs, for which see ``bench.gpu_experiment``).

Fake sysfs trees of 200 PCI functions with 0, 1, 8 and 16 NVIDIA GPUs (with GPUs, the
loaded module's version in sysfs and the NVML library of the same version, as a driver
leaves them; without, no module); nvidia-smi is a shell script that ``cat``s a real H200
capture projected onto the query (it answers at once, so what is measured is the agent's
side of the spawn), the NVLink captures to ``nvlink --status`` and ``--errorcounters``, and
two processes per GPU to ``--query-compute-apps``.  Three floors: the same sysfs reads alone;
a minimal loop doing those reads, the same spawns (``subprocess.run``: the probe and the
processes every tick, the two NVLink reads on the agent's NVLink cadence) and a state write
of the raw output; and that loop writing the agent's second output too, a Prometheus
textfile of every numeric value through prometheus_client, the library the agent uses for
it.  The tick and the floors are measured by turns (a call of each in turn), so that their
ratios, the last lines, are of the same moments on a shared machine.  The agent runs in the
environment its unit gives it (``LC_ALL=C``).

Both samplers (``--sampler spawn,loop``, the default): by spawn, ``--ticks`` ticks back to
back with each part of the tick timed alone, as this bench always measured; then, paced, by
spawn and by nvidia-smi's loop, ``--paced-ticks`` real ticks every 0.2 s (the loop must print
between them) with every period scaled to keep its ticks (NVLink and, under the loop, the
processes read one tick in six, as at 10 s).  A paced tick finds its caches cold and costs
more than one back to back, so the loop's like is the paced spawn; in a paced run the turns
start with each of the tick and the floors in rotation.  The stand-in's loop mode is one bash
process printing the capture every ``-lms`` ms; its CPU is reaped when the agent stops at the
end (``children: loop child``: its whole life over the ticks it lived).  Each run is a process
of its own, whose peak RSS (``VmHWM``: the agent, the floors and the bench's imports) is
given.  Usage::

    /usr/bin/python3 -m bench.tick_cost [--ticks 300] [--paced-ticks 60] [--gpus 0,1,8,16]
        [--sampler spawn,loop]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import resource
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import GaugeMetricFamily, Metric

from bench.sim import instant_nvidia_smi, make_host
from gpuagent import state
from gpuagent.agent import Agent
from gpuagent.config import Config
from gpuagent.configkeys import SAMPLERS
from gpuagent.edges.cadence import every_ticks
from gpuagent.edges.loopchild import LoopChild
from gpuagent.edges.runner import Runner
from gpuagent.logs import EventLog
from gpuagent.metrics import Collector
from gpuagent.notify import Notifier
from gpuagent.publish import Textfile
from gpuagent.sources.bus import pci
from gpuagent.sources.bus.bus import BusScan
from gpuagent.sources.nvlink import nvlink, nvlinksource
from gpuagent.sources.probe import rules, smi
from gpuagent.sources.probe.probe import Prober
from gpuagent.sources.probe.source import Probe
from gpuagent.sources.processes import apps
from gpuagent.sources.processes.processes import LOOP_PERIOD, ProcessesSource
from gpuagent.verdict import Tracker
from gpuagent.views import Row
from tests.fakehost import quiet_journal

# A host's floors, by name: each one call of a minimal loop's tick.
Floors = dict[str, Callable[[], object]]


def cpu_ms(fn: Callable[[], object], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1000


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children reaped so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def by_turns(fns: dict[str, Callable[[], object]], n: int) -> dict[str, float]:
    """Each of ``fns``' CPU ms per call, measured by turns (one call of each, ``n`` times):
    a shared machine's load then weighs on them alike, and their ratios are of one moment."""
    return with_children(fns, n)[0]


def with_children(
    fns: dict[str, Callable[[], object]], n: int, pace: Callable[[], object] | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`by_turns`, and beside it each one's children's CPU ms per call (of those it
    reaped); ``pace``, where given, is called before each turn, unmeasured, and the turns
    begin with each of ``fns`` in rotation: what runs first after a wait finds the caches
    cold."""
    spent = dict.fromkeys(fns, 0.0)
    children = dict.fromkeys(fns, 0.0)
    names = list(fns)
    for _ in range(n):
        if pace is not None:
            pace()
            names = names[1:] + names[:1]
        for name in names:
            fn = fns[name]
            start, reaped = time.process_time(), children_cpu()
            fn()
            spent[name] += time.process_time() - start
            children[name] += children_cpu() - reaped
    return (
        {name: total / n * 1000 for name, total in spent.items()},
        {name: total / n * 1000 for name, total in children.items()},
    )


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 64)
    finally:
        os.close(fd)


def floor(root: str) -> None:
    """The same sysfs reads, nothing else."""
    base = os.path.join(root, "bus", "pci", "devices")
    for slot in os.listdir(base):
        if _read(os.path.join(base, slot, "vendor")) == b"0x10de\n":
            _read(os.path.join(base, slot, "class"))
            _read(os.path.join(base, slot, "device"))


def minimal_loop(root: str, nvsmi: str, state_file: str, links: bool = False) -> str:
    """The same sysfs reads, the agent's two spawns of nvidia-smi (the probe, the processes),
    where ``links`` its two NVLink reads (status, counters), and a state file of their raw
    lines; returns the probe's output."""
    floor(root)
    out = subprocess.run(
        smi.command(nvsmi, smi.FIELDS), capture_output=True, check=False
    ).stdout.decode()
    procs = subprocess.run([nvsmi, *apps.ARGS], capture_output=True, check=False).stdout
    raw = {"rows": out.splitlines(), "apps": procs.decode().splitlines()}
    for args in (nvlink.STATUS_ARGS, nvlink.COUNTERS_ARGS) if links else ():
        answer = subprocess.run([nvsmi, *args], capture_output=True, check=False).stdout
        raw[args[1]] = answer.decode().splitlines()
    tmp = state_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump(raw, f)
    os.replace(tmp, state_file)
    return out


class _RawValues(Collector):
    """Every numeric cell of nvidia-smi's raw lines as a gauge per field, by slot and UUID."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def collect(self) -> list[Metric]:
        families = {
            f: GaugeMetricFamily("minimal_" + f.replace(".", "_"), f, labels=["pci_slot", "uuid"])
            for f in smi.FIELDS
        }
        at = {f: i for i, f in enumerate(smi.FIELDS)}
        for line in self.lines:
            cells = line.split(", ")
            labels = [cells[at["pci.bus_id"]], cells[at["uuid"]]]
            for f, family in families.items():
                with contextlib.suppress(ValueError):
                    family.add_metric(labels, float(cells[at[f]]))
        return list(families.values())


def minimal_loop_with_metrics(
    root: str,
    nvsmi: str,
    state_file: str,
    registry: CollectorRegistry,
    raw: _RawValues,
    *,
    links: bool = False,
) -> None:
    """:func:`minimal_loop`, then the values in a textfile as the agent writes its own."""
    raw.lines = minimal_loop(root, nvsmi, state_file, links).splitlines()
    write_to_textfile(state_file + ".prom", registry)


def nvlink_due(config: Config) -> Iterator[bool]:
    """Whether each tick in turn reads NVLink, on the agent's cadence (every
    ``nvlink_interval`` in whole ticks, the first tick's included)."""
    every = every_ticks(nvlinksource.period(config), config.interval)
    return itertools.cycle([True] + [False] * (every - 1))


def installed_driver(root: str, directory: str, version: str) -> str:
    """The driver of a GPU host: the loaded module's ``version`` in ``root`` (sysfs) and the
    NVML library of the same version in ``directory``, as the driver installs it; returns
    the library's link (``Config.nvml_library``)."""
    with open(os.path.join(root, "module", "nvidia", "version"), "w") as f:
        f.write(version + "\n")
    real = os.path.join(directory, f"libnvidia-ml.so.{version}")
    with open(real, "wb"):
        pass
    link = os.path.join(directory, "libnvidia-ml.so.1")
    os.symlink(real, link)
    return link


def processes(agent: Agent, nvsmi: str, rows: dict[str, Row]) -> None:
    """The processes read of a tick, made due whatever its cadence."""
    reader = agent.source(ProcessesSource)
    reader.expedite()
    reader.read(nvsmi, rows.values())


# The agent's state file and textfile are in /run/gpuagent, a tmpfs: the host's files and the
# writes go to one here too where there is one, so that an fsync costs what it does there.
TMPFS = "/dev/shm" if os.path.isdir("/dev/shm") else None


def children_figures(
    own: dict[str, float], kids: dict[str, float], looped: float = 0.0
) -> dict[str, float]:
    """The tick's and the loop with both outputs' children's CPU ms, and each with its
    own (:func:`with_children`' two dicts); ``looped`` the loop child's ms a tick."""
    loop = "minimal loop + metrics textfile"
    return {
        "children: tick's (stand-in smi)": kids["tick"],
        "children: loop child (reaped at stop)": looped,
        "children: minimal loop + metrics": kids[loop],
        "tick + children": own["tick"] + kids["tick"] + looped,
        "minimal loop + metrics + children": own[loop] + kids[loop],
    }


# Paced runs (the loop's, and the spawn's beside it) tick in real time at this interval, their
# cadences scaled to it (:func:`scaled`), after these warm ticks (the loop's first starts it).
LOOP_INTERVAL = 0.2
LOOP_WARM = 6
# What the agent's time-driven reads are timed by, scaled with the interval.
_PERIODS = ("nvlink_window", "throttle_window", "vgpu_interval", "imex_interval")
DEFAULT_INTERVAL = Config().interval


def scaled(config: Config, interval: float) -> Config:
    """``config`` ticking every ``interval`` s with every period in the same ticks as at
    :data:`DEFAULT_INTERVAL` (NVLink's reads and, under the loop, the processes read on the
    ticks of their periods at 10 s), so that a tick does what it does there."""
    factor = interval / DEFAULT_INTERVAL
    periods = {key: getattr(config, key) * factor for key in _PERIODS}
    periods["nvlink_interval"] = nvlinksource.period(config) * factor
    if config.sampler == "loop":
        periods["processes_interval"] = LOOP_PERIOD * factor
    return config._replace(interval=interval, **periods)


def peak_rss_mib() -> float:
    """This process's peak resident set (``VmHWM`` in /proc/self/status), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Pace:
    """Called before each turn of :func:`with_children`: waits for the next tick's time
    (every ``interval`` s), and notes the loop child then running (``child``' process)."""

    def __init__(self, interval: float, child: LoopChild) -> None:
        self.interval = interval
        self.child = child
        self.pids: set[int] = set()
        self._next = time.monotonic()

    def __call__(self) -> None:
        if self.child.proc is not None:
            self.pids.add(self.child.proc.pid)
        self._next += self.interval
        time.sleep(max(0.0, self._next - time.monotonic()))


def floors_of(root: str, nvsmi: str, directory: str, cfg: Config, gpus: int) -> Floors:
    """The three floors of a host (none spawns without a GPU: the agent does not either)."""
    loop_state = os.path.join(directory, "minimal.json")
    raw = _RawValues()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(raw)
    # The loops read NVLink on the ticks the agent does, counted from their own first.
    loop_links, metrics_links = nvlink_due(cfg), nvlink_due(cfg)
    return {
        "floor (same sysfs reads)": lambda: floor(root),
        "minimal loop (reads+spawn+state)": lambda: (
            minimal_loop(root, nvsmi, loop_state, next(loop_links)) if gpus else floor(root)
        ),
        "minimal loop + metrics textfile": lambda: (
            minimal_loop_with_metrics(
                root, nvsmi, loop_state, registry, raw, links=next(metrics_links)
            )
            if gpus
            else floor(root)
        ),
    }


def breakdown(
    agent: Agent, text: str, gpus: int, outputs: tuple[Textfile, Notifier], ticks: int
) -> dict[str, float]:
    """Each part of a tick alone, ``ticks`` calls each (``text``: nvidia-smi's answer)."""
    cfg = agent.config
    textfile, notifier = outputs
    # configure() without a config builds the report without a tick (its "look now"
    # changes nothing on a host that answers).
    snap = agent.configure().state
    prober = Prober(Runner(timeout=8))
    out = smi.parse_output(text, smi.FIELDS) if gpus else None
    rows = {str(i): r for i, r in enumerate(out.rows)} if out else {}
    tracker = Tracker()

    def health() -> None:
        tracker.report("smi", rules.smi_findings(rows, {}, {}, ()))
        tracker.settle(0.0)

    scan = agent.source(BusScan)
    nvsmi, root = cfg.nvidia_smi, cfg.sysfs_root
    return {
        "pci scan (the tick's, remembering)": cpu_ms(lambda: scan.step(agent.last), ticks),
        "pci scan from cold (detect)": cpu_ms(lambda: pci.scan(root), ticks),
        "probe (spawn+read+parse)": cpu_ms(lambda: prober.probe(nvsmi), ticks) if gpus else 0,
        "processes (spawn+read+parse+units)": (
            cpu_ms(lambda: processes(agent, nvsmi, rows), ticks) if gpus else 0
        ),
        "parse": cpu_ms(lambda: smi.parse_output(text, smi.FIELDS), ticks) if gpus else 0,
        "health rules + tracker": cpu_ms(health, ticks),
        "report (state + status)": cpu_ms(agent.configure, ticks),
        "state write": cpu_ms(lambda: state.write(cfg.state_file, snap), ticks),
        "metrics write": cpu_ms(lambda: textfile.write(snap), ticks),
        "notify": cpu_ms(notifier.watchdog, ticks),
    }


def measure(gpus: int, ticks: int, sampler: str = "spawn", paced: bool = False) -> dict[str, float]:
    """The figures of one host of ``gpus`` GPUs under ``sampler``: ``ticks`` ticks back to
    back and each part of the tick alone; or, ``paced`` (the loop always), ``ticks`` real
    ticks every :data:`LOOP_INTERVAL` s after :data:`LOOP_WARM`, and a loop child's CPU,
    reaped when the agent stops at the end (its whole life over the ticks it lived)."""
    paced = paced or sampler == "loop"
    with tempfile.TemporaryDirectory(dir=TMPFS) as d:
        root = os.path.join(d, "sys")
        slots = make_host(root, gpus)
        nvsmi = instant_nvidia_smi(d, slots)
        with open(os.path.join(d, "answer.csv")) as f:
            text = f.read()
        sock_path = os.path.join(d, "notify")
        sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sink.bind(sock_path)
        logger = logging.getLogger(f"bench.tick.{gpus}")
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
        cfg = Config(
            sysfs_root=root,
            nvidia_smi=nvsmi,
            state_file=os.path.join(d, "state.json"),
            textfile=os.path.join(d, "gpuagent.prom"),
            journal_directory=quiet_journal(),
            nvml_library=installed_driver(root, d, "590.48.01") if gpus else "libnvidia-ml.so.1",
            sampler=sampler,
        )
        if paced:
            cfg = scaled(cfg, LOOP_INTERVAL)
        log = EventLog(logger)
        agent = Agent(cfg, Prober(Runner(timeout=8)), log)
        notifier = Notifier({"NOTIFY_SOCKET": sock_path})
        textfile = Textfile(cfg.textfile, log)
        n = 0

        def tick() -> None:
            nonlocal n
            n += 1
            report = agent.tick()
            state.write(cfg.state_file, report.state)
            textfile.write(report.state)
            notifier.status(f"{report.status} {n}")  # a changed STATUS every tick: worst case

        pace = Pace(LOOP_INTERVAL, agent.source(Probe).probing.sampler.child)
        for _ in range(LOOP_WARM if paced else 20):
            if paced:
                pace()
            tick()
        floors = floors_of(root, nvsmi, d, cfg, gpus)
        turns, kids = with_children({"tick": tick, **floors}, ticks, pace if paced else None)
        figures = {"tick": turns["tick"]}
        if not paced:
            figures |= breakdown(agent, text, gpus, (textfile, notifier), ticks)
        figures |= {name: turns[name] for name in floors}
        figures["tick / minimal loop"] = turns["tick"] / turns["minimal loop (reads+spawn+state)"]
        figures["tick / minimal loop + metrics"] = (
            turns["tick"] / turns["minimal loop + metrics textfile"]
        )
        # The agent stops as the daemon does: the loop child is stopped and reaped here.
        reaped = children_cpu()
        agent.close()
        lived = (LOOP_WARM + ticks) if paced else ticks
        figures.update(children_figures(turns, kids, (children_cpu() - reaped) / lived * 1000))
        figures["loop children started"] = len(pace.pids)
        figures["peak RSS of the run, MiB"] = peak_rss_mib()
        sink.close()
        return figures


def measured(gpus: int, ticks: int, sampler: str, paced: bool) -> dict[str, float]:
    """:func:`measure` in a process of its own, forked from this one, so that its peak RSS
    and its children are its run's alone."""
    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(measure, (gpus, ticks, sampler, paced))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=300, help="ticks by spawn, back to back")
    parser.add_argument(
        "--paced-ticks", type=int, default=60, help=f"paced ticks, every {LOOP_INTERVAL} s"
    )
    parser.add_argument("--gpus", default="0,1,8,16", help="the hosts' GPU counts, by commas")
    parser.add_argument("--sampler", default="spawn,loop", help="spawn, loop or both, by commas")
    args = parser.parse_args()
    sizes = [int(n) for n in args.gpus.split(",")]
    samplers = args.sampler.split(",")
    if not samplers or any(s not in SAMPLERS for s in samplers):
        parser.error(f"--sampler: {args.sampler!r} is not a list of {', '.join(SAMPLERS)}")
    # The environment the unit gives the agent (Environment=LC_ALL=C), which every child,
    # the agent's and the floors', inherits.
    os.environ["LC_ALL"] = "C"
    # By spawn back to back, as this bench always measured it; paced, by loop, and by spawn
    # beside it where both are asked for (a paced tick finds its caches cold: only a paced
    # spawn is the loop's like).
    modes = [("spawn", False)] if "spawn" in samplers else []
    modes += [(s, True) for s in SAMPLERS[::-1] if "loop" in samplers and s in samplers]
    runs = [(g, s, paced) for g in sizes for s, paced in modes]
    results = {
        run: measured(run[0], args.paced_ticks if run[2] else args.ticks, run[1], run[2])
        for run in runs
    }
    keys = list(dict.fromkeys(k for figures in results.values() for k in figures))
    heads = (f"{g} {s}{'@' if paced else ''}" for g, s, paced in runs)
    print(f"{'ms of CPU per tick':<36}" + "".join(f"{h:>10}" for h in heads))
    for key in keys:
        cells = (results[run].get(key) for run in runs)
        print(f"{key:<36}" + "".join("-".rjust(10) if c is None else f"{c:>10.3f}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
