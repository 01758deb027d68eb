"""A fake GPU host on disk: a sysfs tree, a proc tree, the replaying fake nvidia-smi and a config
file.

Used by in-process tests (``conftest.Host``), by tests that run ``gpuagent run`` as a process,
by the benchmarks and by ``scripts/demo``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

from tests import fakesysfs, replay
from tests.journalfeed import journal_remote

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_SMI = os.path.join(HERE, "fake_nvidia_smi.py")
# A probe timeout (s) that this Python fake meets on a busy machine too (tens of ms to start,
# far more under load), whatever the interval: above a short one it is a warning, no error.
PATIENT = 5.0
# The interval of a fake host given PATIENT (the demos): above it, so that check-config and the
# agent do not warn of a probe_timeout not below the interval.
PATIENT_INTERVAL = PATIENT + 1
H200_LOAD = "h200-linux-driver590.48.01-load-query-gpu-all-fields.csv"
MISMATCH = "driver-library-version-mismatch-exit18-nvml535.161.txt"
# An outage of the probe's own (smi_failing), where exit 18's is the driver's (driver_mismatch).
NOT_LOADED = "driver-not-loaded-exit9.txt"
# One entry that is not the kernel's: a journal that opens and has no kernel record.
_QUIET = (
    b"__REALTIME_TIMESTAMP=1700000000000000\n__MONOTONIC_TIMESTAMP=1\n"
    b"_BOOT_ID=0123456789abcdef0123456789abcdef\n_TRANSPORT=stdout\nMESSAGE=quiet\n\n"
)


@dataclass
class FakeHost:
    """``root`` the sysfs tree, ``proc`` the proc tree (default ``<dir>/proc``), ``smi`` the
    fake nvidia-smi, ``conf`` a config using them."""

    dir: str
    root: str
    smi: str
    conf: str
    slots: list[str]
    calls_log: str
    proc: str = ""

    def __post_init__(self) -> None:
        self.proc = self.proc or os.path.join(self.dir, "proc")

    def scenario(self, **step: Any) -> None:
        """What the fake nvidia-smi does from its next call on (see its docstring); the proc
        tree has the step's processes (:func:`write_proc`)."""
        step.setdefault("log", self.calls_log)
        write_proc(self.proc, step.get("apps", []))
        tmp = self.smi + ".json.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(step, f)
        os.replace(tmp, self.smi + ".json")

    def healthy(self, slots: list[str] | None = None, **extra: Any) -> None:
        self.scenario(capture=H200_LOAD, slots=self.slots if slots is None else slots, **extra)

    def failing(self, error: str = MISMATCH, code: int = 18) -> None:
        self.scenario(error=error, exit=code)

    def calls(self) -> list[list[str]]:
        """The fake nvidia-smi's command lines so far."""
        if not os.path.exists(self.calls_log):
            return []
        with open(self.calls_log) as f:
            return [json.loads(line) for line in f]

    @property
    def spawns(self) -> int:
        """How many times the fake nvidia-smi has run as the probe (its nvlink and processes
        reads apart)."""
        return sum(
            1
            for argv in self.calls()
            if argv[:1] != ["nvlink"] and not _apps(argv) and not serials(argv) and not wear(argv)
        )

    @property
    def serials_spawns(self) -> int:
        """How many times it has run as the boards' serials read."""
        return sum(1 for argv in self.calls() if serials(argv))

    @property
    def wear_spawns(self) -> int:
        """How many times it has run as the boards' wear read."""
        return sum(1 for argv in self.calls() if wear(argv))

    @property
    def apps_spawns(self) -> int:
        """How many times it has run as ``nvidia-smi --query-compute-apps=...``."""
        return sum(1 for argv in self.calls() if _apps(argv))

    @property
    def nvlink_spawns(self) -> int:
        """How many times it has run as ``nvidia-smi nvlink ...``."""
        return sum(1 for argv in self.calls() if argv[:1] == ["nvlink"])


def write_proc(proc: str, apps: list[dict[str, Any]] | dict[str, Any]) -> None:
    """Make ``proc`` hold ``<pid>/comm`` for each of a scenario step's ``"apps"`` (a list, or a
    capture to replay), and no other process: the entry's ``"name"`` (default ``python3``) cut
    to 15 bytes as the kernel does; a name in brackets (``[N/A]``, a process nvidia-smi could
    not name) is a process hidden from the agent, with no entry.  An ``"apps"`` that prints
    its own text has no process here."""
    if isinstance(apps, dict):
        capture = apps.get("capture")
        apps = [] if capture is None else replay.apps_capture(str(capture), str(apps["slot"]))
    shutil.rmtree(proc, ignore_errors=True)
    os.makedirs(proc)
    for app in apps:
        name = str(app.get("name", "python3"))
        if name.startswith("["):
            continue
        os.makedirs(os.path.join(proc, str(app["pid"])), exist_ok=True)
        with open(os.path.join(proc, str(app["pid"]), "comm"), "wb") as f:
            f.write(name.encode()[:15] + b"\n")


def serials(argv: list[str]) -> bool:
    """Whether a command line is the board source's serials read."""
    return argv[:1] == ["--query-gpu=pci.bus_id,serial"]


def wear(argv: list[str]) -> bool:
    """Whether a command line is the wear source's read."""
    return bool(argv) and argv[0].startswith("--query-gpu=pci.bus_id,remapped_rows.")


def _apps(argv: list[str]) -> bool:
    return any(a.startswith("--query-compute-apps=") for a in argv)


def _toml(value: object) -> str:
    return json.dumps(value) if isinstance(value, str | bool) else str(value)


def write_config(path: str, settings: dict[str, object]) -> None:
    """Write ``settings`` (strings, booleans and numbers) to ``path`` as a TOML config file."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{key} = {_toml(value)}\n" for key, value in settings.items())


def quiet_journal() -> str:
    """A journal directory without kernel records, shared by the fake hosts of this user
    (a journal file is 8 MiB); ``""`` (the system journal) without systemd-journal-remote."""
    remote = journal_remote()
    if remote is None:
        return ""
    top = os.path.join(tempfile.gettempdir(), f"gpuagent-tests-{os.getuid()}")
    final = os.path.join(top, "quiet-journal")
    if os.path.exists(os.path.join(final, "x.journal")):
        return final
    os.makedirs(top, exist_ok=True)
    work = tempfile.mkdtemp(dir=top)
    subprocess.run(
        [remote, f"--output={work}/x.journal", "-"],
        input=_QUIET,
        check=True,
        capture_output=True,
        timeout=60,
    )
    try:
        os.rename(work, final)
    except OSError:
        shutil.rmtree(work)  # another test run made it first
    return final


def create(directory: str, gpus: int = 8, **config: object) -> FakeHost:
    """Build a host of ``gpus`` H200s under ``directory``, answering healthy, with no process.

    The config points at it (its sysfs and proc trees, its nvidia-smi) and at a journal
    without kernel records, keeps its state and metrics in ``directory`` and adds
    ``config``'s keys.
    """
    root = os.path.join(directory, "sys")
    proc = os.path.join(directory, "proc")
    slots = fakesysfs.gpu_host(root, gpus)
    smi = os.path.join(directory, "nvidia-smi")
    os.symlink(FAKE_SMI, smi)
    settings: dict[str, object] = {
        "sysfs_root": root,
        "proc_root": proc,
        "nvidia_smi": smi,
        "state_file": os.path.join(directory, "state.json"),
        "textfile": os.path.join(directory, "gpuagent.prom"),
        "journal_directory": quiet_journal(),
        **config,
    }
    conf = os.path.join(directory, "gpuagent.toml")
    write_config(conf, settings)
    host = FakeHost(directory, root, smi, conf, slots, os.path.join(directory, "calls.log"), proc)
    host.healthy()
    return host


def _field(name: str, value: str) -> bytes:
    """One field in the journal export format (systemd.io/JOURNAL_EXPORT_FORMATS): a value
    with a newline in the binary form."""
    data = value.encode()
    if b"\n" in data:
        return name.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
    return name.encode() + b"=" + data + b"\n"


def kernel_journal(out: str, messages: list[str], *, boot: str, start_usec: int) -> bool:
    """Write ``messages`` to the journal file ``out`` (a name ending in ``.journal``) as the
    kernel's records of boot ``boot`` as journald stores them, one a second from
    ``start_usec`` (realtime, µs) on: the entries ``../shared/tools/make-test-journal``
    writes, through Debian's systemd-journal-remote (package systemd-journal-remote).
    Returns False, writing nothing, where that is not installed."""
    remote = journal_remote()
    if remote is None:
        return False
    stream = bytearray()
    for n, message in enumerate(messages, 1):
        mono = str(n * 1_000_000)
        for name, value in (
            ("__REALTIME_TIMESTAMP", str(start_usec + n * 1_000_000)),
            ("__MONOTONIC_TIMESTAMP", mono),
            ("_BOOT_ID", boot),
            ("_MACHINE_ID", "f" * 32),
            ("_HOSTNAME", "testhost"),
            ("_TRANSPORT", "kernel"),
            ("PRIORITY", "4"),
            ("SYSLOG_FACILITY", "0"),
            ("SYSLOG_IDENTIFIER", "kernel"),
            ("_SOURCE_MONOTONIC_TIMESTAMP", mono),
            ("MESSAGE", message),
        ):
            stream += _field(name, value)
        stream += b"\n"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(out)  # journal-remote appends to a file that is there
    subprocess.run(
        [remote, f"--output={out}", "-"],
        input=bytes(stream),
        check=True,
        capture_output=True,
        timeout=60,
    )
    os.chmod(out, 0o644)  # journal-remote makes it 0640: any test user may read it
    return True
