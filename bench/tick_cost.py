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
environment its unit gives it (``LC_ALL=C``).  Usage::

    /usr/bin/python3 -m bench.tick_cost [--ticks 300] [--gpus 0,1,8,16]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
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
from gpuagent.edges.cadence import every_ticks
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
from gpuagent.sources.processes import apps
from gpuagent.sources.processes.processes import ProcessesSource
from gpuagent.verdict import Tracker
from gpuagent.views import Row
from tests.fakehost import quiet_journal


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
    fns: dict[str, Callable[[], object]], n: int
) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`by_turns`, and beside it each one's children's CPU ms per call (of those it
    reaped)."""
    spent = dict.fromkeys(fns, 0.0)
    children = dict.fromkeys(fns, 0.0)
    for _ in range(n):
        for name, fn in fns.items():
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


def children_figures(own: dict[str, float], kids: dict[str, float]) -> dict[str, float]:
    """The tick's and the loop with both outputs' children's CPU ms, and each with its
    own (:func:`with_children`' two dicts)."""
    loop = "minimal loop + metrics textfile"
    return {
        "children: tick's (stand-in smi)": kids["tick"],
        "children: minimal loop + metrics": kids[loop],
        "tick + children": own["tick"] + kids["tick"],
        "minimal loop + metrics + children": own[loop] + kids[loop],
    }


def measure(gpus: int, ticks: int) -> dict[str, float]:
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
        )
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

        for _ in range(20):
            tick()
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

        loop_state = os.path.join(d, "minimal.json")
        raw = _RawValues()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(raw)
        scan = agent.source(BusScan)
        # The loops read NVLink on the ticks the agent does, counted from their own first.
        loop_links, metrics_links = nvlink_due(cfg), nvlink_due(cfg)
        floors: dict[str, Callable[[], object]] = {
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
        turns, kids = with_children({"tick": tick, **floors}, ticks)
        figures = {
            "tick": turns["tick"],
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
            **{name: turns[name] for name in floors},
        }
        figures["tick / minimal loop"] = (
            figures["tick"] / figures["minimal loop (reads+spawn+state)"]
        )
        figures["tick / minimal loop + metrics"] = (
            figures["tick"] / figures["minimal loop + metrics textfile"]
        )
        figures.update(children_figures(turns, kids))
        sink.close()
        return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=300)
    parser.add_argument("--gpus", default="0,1,8,16", help="the hosts' GPU counts, by commas")
    args = parser.parse_args()
    sizes = [int(n) for n in args.gpus.split(",")]
    # The environment the unit gives the agent (Environment=LC_ALL=C), which every child,
    # the agent's and the floors', inherits.
    os.environ["LC_ALL"] = "C"
    results = {g: measure(g, args.ticks) for g in sizes}
    print(f"{'ms of agent CPU per tick':<36}" + "".join(f"{f'{g} GPUs':>9}" for g in sizes))
    for key in results[sizes[0]]:
        print(f"{key:<36}" + "".join(f"{results[g][key]:>9.3f}" for g in sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
