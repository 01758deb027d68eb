"""What a bundle holds, each part under its own hard timeout: ``nvidia-smi -q`` of the GPU,
the kernel's and the agent's journal since a while before the fault, the agent's state files
and ``nvidia-bug-report.sh`` where it is installed.

Every command runs through :class:`~gpuagent.edges.runner.Runner` in its own process group:
one that hangs (the bug report on a wedged GPU) is killed with its children at its timeout,
and its part says ``timeout`` (``stuck`` if it outlived SIGKILL).  Nothing a part holds is
read from the request: only the slot, checked before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
import time
from collections.abc import Callable
from typing import NamedTuple

from gpuagent.edges import safefile
from gpuagent.edges.runner import Outcome, Runner
from gpuagent.evidence.store import write_new

__all__ = ["JOURNAL_BEFORE", "PATH", "Gatherer", "Limits", "Part"]

# The journal from this long before the request: the fault and what led to it.
JOURNAL_BEFORE = 900.0
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_JOURNAL_LINES = "50000"
# At most this many of the agent's state files, each at most this big (its own are small).
_STATE_FILES = 32
_STATE_BYTES = 8 << 20
_REPORT_FILES = 4
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}", re.ASCII)


class Limits(NamedTuple):
    """Seconds a ``command`` (nvidia-smi, journalctl) and the bug ``report`` get, the bytes
    a command's output may have (``output``), and the bytes of the whole bundle (``total``:
    a bug report's file that would pass it is not kept)."""

    command: float = 60.0
    report: float = 300.0
    output: int = 64 << 20
    total: int = 512 << 20


class Part(NamedTuple):
    """One part of a bundle, for its manifest: its file ``name`` (None: nothing kept),
    ``outcome`` (a runner's outcome, ``read``, ``unreadable``, ``absent`` or ``too_big``),
    the command's ``exit_code``, the ``bytes`` kept, the ``seconds`` it took and a ``note``."""

    what: str
    name: str | None
    outcome: str
    exit_code: int | None = None
    bytes: int = 0
    seconds: float = 0.0
    note: str = ""


_LIMITS = Limits()


class Gatherer:
    """Gathers a bundle's parts into an open directory.  ``nvidia_smi`` and ``journalctl``
    are the commands to run, ``bug_report`` NVIDIA's script (None: not installed),
    ``state_directory`` and ``state_file`` the agent's."""

    def __init__(
        self,
        *,
        nvidia_smi: str,
        bug_report: str | None,
        state_directory: str,
        state_file: str,
        limits: Limits = _LIMITS,
        journalctl: str = "journalctl",
        unit: str = "gpuagent.service",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvidia_smi = nvidia_smi
        self.bug_report = bug_report
        self.state_directory = state_directory
        self.state_file = state_file
        self.limits = limits
        self.journalctl = journalctl
        self.unit = unit
        self.clock = clock
        self.env = {"PATH": PATH, "LC_ALL": "C"}

    def gather(self, into: int, slot: str, now: float) -> list[Part]:
        """Every part for the GPU at ``slot`` into the directory ``into``, at wall time
        ``now`` (s); never raises for a part that fails (its part says how)."""
        since = f"@{int(now - JOURNAL_BEFORE)}"
        journal = [self.journalctl, "--no-pager", "-o", "short-iso-precise", "--since", since]
        parts = [
            self._run(
                into, "nvidia-smi -q", "nvidia-smi-q.txt", [self.nvidia_smi, "-q", "-i", slot]
            ),
            self._run(
                into, "kernel journal", "journal-kernel.txt", [*journal, "-k", "-n", _JOURNAL_LINES]
            ),
            self._run(
                into,
                "agent journal",
                "journal-gpuagent.txt",
                [*journal, "-u", self.unit, "-n", _JOURNAL_LINES],
            ),
            *self._states(into),
        ]
        return [*parts, *self._report(into, sum(p.bytes for p in parts))]

    def _run(
        self, into: int, what: str, name: str, argv: list[str], timeout: float | None = None
    ) -> Part:
        runner = Runner(timeout=timeout or self.limits.command, max_output=self.limits.output)
        result = runner.run(argv, self.env)
        data = result.stdout.encode()[: self.limits.output]
        write_new(into, name, data)
        note = f"{result.error.strerror or result.error}" if result.error is not None else ""
        if result.outcome is Outcome.TIMEOUT:
            note = f"killed after {runner.timeout:g} s"
        elif result.outcome is Outcome.STUCK:
            note = f"outlived SIGKILL after {runner.timeout:g} s; abandoned"
        return Part(
            what,
            name,
            str(result.outcome),
            result.exit_code,
            len(data),
            round(result.duration, 3),
            note,
        )

    def _states(self, into: int) -> list[Part]:
        wanted = [("state file", self.state_file, "state-run.json")]
        with contextlib.suppress(OSError):
            names = sorted(n for n in os.listdir(self.state_directory) if n.endswith(".json"))
            for name in names[:_STATE_FILES]:
                wanted.append(
                    ("state file", os.path.join(self.state_directory, name), f"state-{name}")
                )
        return [self._copy(into, what, path, name) for what, path, name in wanted]

    def _copy(self, into: int, what: str, path: str, name: str, limit: int = _STATE_BYTES) -> Part:
        try:
            data = safefile.read_regular(path, limit)
        except FileNotFoundError:
            return Part(f"{what} {path}", None, "absent")
        except OSError as e:
            outcome = "too_big" if e.errno == errno.EFBIG else "unreadable"
            return Part(f"{what} {path}", None, outcome, note=e.strerror or str(e))
        write_new(into, name, data)
        return Part(f"{what} {path}", name, "read", bytes=len(data))

    def _report(self, into: int, used: int) -> list[Part]:
        if self.bug_report is None:
            return [Part("nvidia-bug-report.sh", None, "absent", note="not installed")]
        with tempfile.TemporaryDirectory(prefix="gpuagent-evidence-") as out:
            argv = [self.bug_report, "--output-file", os.path.join(out, "nvidia-bug-report.log")]
            ran = self._run(
                into, "nvidia-bug-report.sh", "nvidia-bug-report.out.txt", argv, self.limits.report
            )
            kept = [ran]
            left = self.limits.total - used - ran.bytes
            for name in sorted(os.listdir(out))[:_REPORT_FILES]:
                if _SAFE_NAME.fullmatch(name):
                    part = self._copy(
                        into, "nvidia-bug-report.sh's", os.path.join(out, name), name, max(left, 0)
                    )
                    left -= part.bytes
                    kept.append(part)
        return kept
