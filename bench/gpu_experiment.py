"""What each of the agent's nvidia-smi commands costs a GPU host: one call, under 5 minutes.

For each command the agent runs (the argv taken from the modules that run them), the wall time
and the CPU (user + system, of the child, by ``os.wait4``) of one-shot runs, the median of
``--runs``, with persistence mode as it is and, as root, switched the other way (then
restored, whatever happens); then nvidia-smi's loop mode with the probe's fields
(``-lms 1000`` for ``--loop-seconds``), its CPU to the first sample (the NVML start) and per
sample after.  Each run is under a hard timeout: a wedged GPU costs that, never a hang.  The
exact outputs go to ``--out`` with ``NOTE.md`` (host, driver, date: what the corpus asks of a
capture).  Prints a markdown table for docs/performance.md §5.  Exits 0 saying so where there
is no nvidia-smi or no GPU answers; 2 for bad arguments.  Standard library only (the lent
machine has the repository, not its dependencies).  Usage::

    /usr/bin/python3 -m bench.gpu_experiment --out "$OUT/gpu-experiment" [--runs 10]
        [--loop-seconds 60] [--timeout 30] [--budget 270] [--no-toggle] [--nvidia-smi PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import re
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

from gpuagent.sources.board import serials
from gpuagent.sources.nvlink import nvlink
from gpuagent.sources.probe import smi
from gpuagent.sources.processes import apps
from gpuagent.sources.vgpu import licence
from gpuagent.sources.wear import counters

# The agent's commands: a name for the table and its files, the arguments after the binary,
# and what runs it when.  "-q -i" gets the first GPU's slot.
COMMANDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("probe", tuple(smi.command("", smi.FIELDS)[1:]), "probe, every tick"),
    ("compute-apps", apps.ARGS, "processes, every tick"),
    ("nvlink-status", nvlink.STATUS_ARGS, "NVLink, every nvlink_interval"),
    ("nvlink-errorcounters", nvlink.COUNTERS_ARGS, "NVLink, after a status with links"),
    ("serials", serials.ARGS, "boards, at a new set of GPUs"),
    ("wear", counters.args(list(counters.FIELDS)), "wear, once a boot per board"),
    ("q", licence.ARGS, "vGPU guests, every vgpu_interval"),
    ("q-i", ("-q", "-i", "SLOT"), "evidence and rma, once a verdict"),
)
LOOP_MS = 1000
# The persistence-mode query and the settings: one line a GPU, "0, Enabled".
MODES_ARGS = ("--query-gpu=index,persistence_mode", "--format=csv,noheader")
IDENTITY_ARGS = ("--query-gpu=name,driver_version,pci.bus_id", "--format=csv,noheader")


class Run(NamedTuple):
    """One child's end: wall and CPU seconds (``cpu`` None when it outlived SIGKILL), its exit
    status (None when killed), whether it was killed at the timeout."""

    wall: float
    cpu: float | None
    exit_code: int | None
    timed_out: bool


class Loop(NamedTuple):
    """The loop child: its samples, CPU seconds in all and to its first sample (None where
    /proc said nothing), wall seconds, and how it ended (``"stopped"`` or ``"exit N"``)."""

    samples: int
    cpu: float | None
    first: float | None
    wall: float
    ended: str


class Row(NamedTuple):
    """One command's figures in one persistence mode: medians in ms, the exits seen, a note."""

    name: str
    argv: str
    when: str
    persistence: str
    wall_ms: float | None
    cpu_ms: float | None
    exits: str


def median_ms(values: Sequence[float | None]) -> float | None:
    """The median of ``values`` (seconds) in ms, None without one value."""
    known = [v for v in values if v is not None]
    return statistics.median(known) * 1000 if known else None


def exits(runs: Sequence[Run]) -> str:
    """The runs' ends in words, each kind once: ``0``, ``0, timeout``."""
    seen = ["timeout" if r.timed_out else str(r.exit_code) for r in runs]
    return ", ".join(dict.fromkeys(seen)) or "not run"


def samples(lines: int, gpus: int) -> int:
    """Whole samples in ``lines`` of loop output, one line a GPU each."""
    return lines // gpus if gpus else 0


def modes(text: str) -> dict[str, bool]:
    """Each GPU's persistence mode by index from :data:`MODES_ARGS`' answer; lines that are not
    ``INDEX, Enabled|Disabled`` are left out."""
    found = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\s*(\d+),\s*(Enabled|Disabled)\s*", line)
        if m:
            found[m[1]] = m[2] == "Enabled"
    return found


def mode_word(state: dict[str, bool]) -> str:
    """Persistence mode across the GPUs in one word: on, off or mixed."""
    values = set(state.values())
    return "mixed" if len(values) > 1 else "on" if values == {True} else "off"


def shown(args: Sequence[str]) -> str:
    """The arguments as the table shows them: the probe's long field list by its count."""
    out = []
    for arg in args:
        key, sep, fields = arg.partition("=")
        long = sep and key == "--query-gpu" and fields.count(",") > 6
        out.append(f"{key}=<the probe's {fields.count(',') + 1} fields>" if long else arg)
    return " ".join(out)


def _cell(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:,.1f}"


def table(rows: Sequence[Row], loop: Loop | None, loop_args: str, runs: int) -> str:
    """The markdown for docs/performance.md §5: the one-shot commands, then the loop."""
    lines = [
        f"| nvidia-smi … | run by | persistence | wall ms, median of {runs} "
        "| CPU ms (user+sys), median | exits |",
        "| --- | --- | --- | ---: | ---: | --- |",
    ]
    lines += [
        f"| `{r.argv}` | {r.when} | {r.persistence} | {_cell(r.wall_ms)} | {_cell(r.cpu_ms)} "
        f"| {r.exits} |"
        for r in rows
    ]
    if loop is not None:
        first = None if loop.first is None else loop.first * 1000
        later = (
            (loop.cpu - loop.first) / (loop.samples - 1) * 1000
            if loop.cpu is not None and loop.first is not None and loop.samples > 1
            else None
        )
        average = loop.cpu / loop.samples * 1000 if loop.cpu is not None and loop.samples else None
        lines += [
            "",
            "| loop mode | seconds | samples | CPU ms in all | to the first sample "
            "| per later sample | per sample, all | ended |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
            f"| `{loop_args}` | {loop.wall:.1f} | {loop.samples} "
            f"| {_cell(None if loop.cpu is None else loop.cpu * 1000)} | {_cell(first)} "
            f"| {_cell(later)} | {_cell(average)} | {loop.ended} |",
        ]
    return "\n".join(lines)


def a_minute(rows: Sequence[Row], loop: Loop) -> str:
    """The host's CPU a minute at the agent's 10 s interval: today's spawns (the probe and the
    processes read, 6 a minute each, as bench.day counts) against a loop's 6 later samples."""
    spawns = [r.cpu_ms for r in rows[:2]]
    today = None if None in spawns else 6 * sum(s or 0 for s in spawns)
    later = (
        None
        if loop.cpu is None or loop.first is None or loop.samples < 2
        else 6 * (loop.cpu - loop.first) / (loop.samples - 1) * 1000
    )
    return (
        f"CPU ms a minute at a 10 s interval ({rows[0].persistence}): spawns as today "
        f"(6 probes, 6 processes reads) {_cell(today)}; the probe's loop (6 samples) {_cell(later)}"
    )


def _wait(pid: int, deadline: float) -> tuple[int, resource.struct_rusage] | None:
    """The child's wait status and rusage once it ends before ``deadline`` (monotonic)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        fd = None
    try:
        while True:
            got, status, usage = os.wait4(pid, os.WNOHANG)
            if got:
                return status, usage
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if fd is not None:
                select.select([fd], [], [], left)
            else:
                time.sleep(min(left, 0.005))
    finally:
        if fd is not None:
            os.close(fd)


def _kill(pid: int) -> tuple[int, resource.struct_rusage] | None:
    """SIGKILL the child's group; its wait status and rusage if it ends within 5 s (a child
    in the driver may not: it is left, never waited for)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return _wait(pid, time.monotonic() + 5)


def _cpu(usage: resource.struct_rusage) -> float:
    return float(usage.ru_utime + usage.ru_stime)


def run_once(argv: Sequence[str], timeout: float, out: str | None = None) -> Run:
    """Run ``argv`` (in its own session, stdout and stderr to ``out`` or nowhere) to its end or
    ``timeout`` seconds."""
    start = time.monotonic()
    with open(out or os.devnull, "wb") as sink:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            sink.write(f"cannot run: {e}\n".encode())
            return Run(0.0, None, None, False)
    ended = _wait(proc.pid, start + timeout)
    timed_out = ended is None
    if ended is None:
        ended = _kill(proc.pid)
    wall = time.monotonic() - start
    # Reaped here (or abandoned in the driver): Popen must not wait for it again.
    proc.returncode = -signal.SIGKILL
    if ended is None:
        return Run(wall, None, None, True)
    code = None if timed_out else os.waitstatus_to_exitcode(ended[0])
    return Run(wall, _cpu(ended[1]), code, timed_out)


def _proc_cpu(pid: int) -> float | None:
    """The CPU seconds /proc says ``pid`` has spent so far (None where it cannot say)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def run_loop(argv: Sequence[str], seconds: float, gpus: int, out: str) -> Loop:
    """Run the loop child ``argv`` for ``seconds``, its output to ``out``; then SIGTERM (and
    SIGKILL 5 s later) its group."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    first, data, eof = None, b"", False
    end = start + seconds
    while not eof and (left := end - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            eof = not chunk
            data += chunk
            if first is None and data.count(b"\n") >= max(gpus, 1):
                first = _proc_cpu(proc.pid)
    wall = time.monotonic() - start
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    ended = _wait(proc.pid, time.monotonic() + 5) or _kill(proc.pid)
    proc.returncode = -signal.SIGTERM  # reaped here: Popen must not wait for it again
    proc.stdout.close()
    with open(out, "wb") as f:
        f.write(data)
    lines = sum(1 for ln in data.decode(errors="replace").splitlines() if ln.strip())
    how = "stopped" if not eof else f"exit {ended and os.waitstatus_to_exitcode(ended[0])}"
    cpu = None if ended is None else _cpu(ended[1])
    return Loop(samples(lines, gpus), cpu, first, wall, how)


def _read(binary: str, args: Sequence[str], timeout: float) -> tuple[Run, str]:
    """One run's end and its output (through a file in /tmp: no pipe to fill)."""
    path = f"/tmp/gpu-experiment-{os.getpid()}.txt"
    try:
        result = run_once([binary, *args], timeout, path)
        with open(path, encoding="utf-8", errors="replace") as f:
            return result, f.read()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


class Budget:
    """The seconds the experiment may still take (monotonic)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def measure_all(
    binary: str, slot: str, mode: str, args: argparse.Namespace, budget: Budget
) -> list[Row]:
    """Every command of :data:`COMMANDS`, ``args.runs`` times each (the first's output kept)."""
    rows = []
    for name, cmd, when in COMMANDS:
        argv = [binary, *(slot if a == "SLOT" else a for a in cmd)]
        runs = []
        for n in range(args.runs):
            if budget.left() < args.timeout:
                break
            out = os.path.join(args.out, f"{name}.persistence-{mode}.txt") if n == 0 else None
            runs.append(run_once(argv, args.timeout, out))
        rows.append(
            Row(
                name,
                shown(cmd),
                when,
                mode,
                median_ms([r.wall for r in runs]),
                median_ms([r.cpu for r in runs]),
                exits(runs) + ("" if len(runs) == args.runs else f" ({len(runs)} runs: time)"),
            )
        )
    return rows


def set_modes(binary: str, wanted: dict[str, bool], timeout: float) -> None:
    """Each GPU's persistence mode as ``wanted`` (root only)."""
    for index, on in wanted.items():
        run_once([binary, "-i", index, "-pm", "1" if on else "0"], timeout)


def note(args: argparse.Namespace, identity: str, said: list[str]) -> str:
    """NOTE.md: where and when the outputs were made, and how."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    gpus = "\n".join(f"    {line}" for line in identity.strip().splitlines())
    return (
        "# nvidia-smi outputs from bench/gpu_experiment.py\n\n"
        f"- date: {now}\n- host: {platform.node()}, Linux {platform.release()}, "
        f"{platform.machine()}\n- nvidia-smi: {args.nvidia_smi}, run as uid {os.geteuid()}\n"
        f"- GPUs (name, driver_version, pci.bus_id):\n\n{gpus}\n\n"
        f"- {args.runs} runs a command, the first run's stdout+stderr kept as "
        "`NAME.persistence-MODE.txt`; the loop's as `loop.txt`\n"
        + "".join(f"- {s}\n" for s in said)
    )


def experiment(args: argparse.Namespace) -> int:
    """The experiment with its arguments parsed: prints and writes what it found."""
    budget = Budget(args.budget)
    binary = args.nvidia_smi
    probe_args = COMMANDS[0][1]
    first, text = _read(binary, probe_args, args.timeout)
    try:
        gpus = len(smi.parse_output(text, smi.FIELDS).rows) if first.exit_code == 0 else 0
    except smi.ParseError:
        gpus = 0
    if not gpus:
        how = "timed out" if first.timed_out else f"exit {first.exit_code}"
        line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "no output")
        print(f"No GPU answers here ({binary}: {how}: {line[:200]}); nothing measured.")
        return 0
    os.makedirs(args.out, exist_ok=True)
    _, identity = _read(binary, IDENTITY_ARGS, args.timeout)
    # The first GPU's pci.bus_id, for "-q -i"; index 0 where the identity did not answer.
    slot = next((ln.rsplit(",", 1)[1].strip() for ln in identity.splitlines() if "," in ln), "0")
    original = modes(_read(binary, MODES_ARGS, args.timeout)[1])
    said = [f"persistence mode as found: {mode_word(original) if original else 'unknown'}"]
    rows = measure_all(binary, slot, mode_word(original) if original else "as found", args, budget)
    loop_args = [*probe_args, "-lms", str(LOOP_MS)]
    seconds = min(args.loop_seconds, max(budget.left() - 30, 1))
    loop = run_loop([binary, *loop_args], seconds, gpus, os.path.join(args.out, "loop.txt"))
    said.append(f"loop: {shown(loop_args)} for {seconds:g} s, {gpus} GPU(s)")
    if args.no_toggle or os.geteuid() != 0 or not original:
        why = "--no-toggle" if args.no_toggle else "not root" if original else "mode unknown"
        said.append(f"persistence mode not switched ({why}): measured as found only")
    else:
        flipped = {i: not on for i, on in original.items()}
        try:
            set_modes(binary, flipped, args.timeout)
            now = modes(_read(binary, MODES_ARGS, args.timeout)[1])
            if now == flipped:
                rows += measure_all(binary, slot, mode_word(now), args, budget)
            else:
                said.append(f"persistence mode did not switch (still {mode_word(now)})")
        finally:
            set_modes(binary, original, args.timeout)
            back = modes(_read(binary, MODES_ARGS, args.timeout)[1])
            said.append(
                "persistence mode restored"
                if back == original
                else f"persistence mode NOT restored: {back} (was {original})"
            )
    report = table(rows, loop, shown(loop_args), args.runs)
    said.append(a_minute(rows, loop))
    with open(os.path.join(args.out, "NOTE.md"), "w", encoding="utf-8") as f:
        f.write(note(args, identity, said) + "\n" + report + "\n")
    print(report)
    print()
    print("\n".join(f"- {s}" for s in said))
    print(f"- outputs and NOTE.md in {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-experiment", help="directory for the outputs")
    parser.add_argument("--runs", type=int, default=10, help="one-shot runs a command")
    parser.add_argument("--loop-seconds", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a run may take")
    parser.add_argument("--budget", type=float, default=270.0, help="seconds for everything")
    parser.add_argument("--no-toggle", action="store_true", help="leave persistence mode")
    parser.add_argument("--nvidia-smi", default=shutil.which("nvidia-smi"))
    args = parser.parse_args(argv)
    if args.runs < 1 or args.timeout <= 0 or args.loop_seconds <= 0:
        print("gpu_experiment: --runs, --timeout and --loop-seconds must be positive")
        return 2
    if not args.nvidia_smi:
        print("No GPU here: nvidia-smi is not on PATH; nothing measured.")
        return 0
    return experiment(args)


if __name__ == "__main__":
    sys.exit(main())
