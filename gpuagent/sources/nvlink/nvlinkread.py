"""Reading NVLink with nvidia-smi on its own cadence, through the probe's :class:`Runner`.

Every ``nvlink_interval`` (in whole ticks, by its :class:`~gpuagent.edges.cadence.Cadence`)
one ``nvidia-smi nvlink --status`` runs, and ``--errorcounters`` after it when some GPU has
links.  A failing read is retried on the cadence's backoff, counted in those reads.  Nothing
runs while the nvidia module is not loaded
(nvidia-smi would load it), while an abandoned child of the runner lives, or once the GPUs on
the bus are known to have no NVLink: that is learnt from one ``--status`` per set of GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuagent.edges import smirun
from gpuagent.edges.cadence import Cadence
from gpuagent.edges.runner import Runner
from gpuagent.edges.smirun import Failed
from gpuagent.sources.bus import pci
from gpuagent.sources.nvlink.nvlink import (
    COUNTERS_ARGS,
    STATUS_ARGS,
    Parsed,
    parse_counters,
    parse_status,
)

__all__ = ["Read", "Reader"]

_ERROR_CHARS = 300


@dataclass(frozen=True)
class Read:
    """What one tick of the reader did.

    ``ran``: it was due and tried.  On success ``status`` (and ``counters`` when some GPU has
    links); on failure a one-line ``failure``.  ``warn`` is true on the failure that starts an
    outage worth one warning (the cadence's, at ``backoff_after`` failures in a row),
    ``recovered`` on the first success after that.  ``warnings``: lines nvidia-smi printed
    that could not be read, each said once, by the first of them in an answer.
    ``no_nvlink``: the GPUs on the bus have no NVLink (learnt now or before; nothing more runs
    for this set of GPUs).  ``skipped``: why a due read did not run (``busy``, ``module``).
    """

    ran: bool = False
    status: Parsed | None = None
    counters: Parsed | None = None
    failure: str = ""
    warn: bool = False
    recovered: bool = False
    warnings: tuple[str, ...] = ()
    no_nvlink: bool = False
    skipped: str = ""
    spawns: int = 0


class Reader:
    """The NVLink read of each tick: call :meth:`tick` exactly once per executed tick."""

    def __init__(self, runner: Runner, *, cadence: Cadence, sysfs_root: str = "/sys") -> None:
        self.runner = runner
        self.cadence = cadence
        self.sysfs_root = sysfs_root
        self._no_nvlink: frozenset[str] | None = None
        self._warned: set[tuple[tuple[str, ...], str]] = set()
        self._spawns = 0
        # Each command's last answer and what it parsed to.
        self._answers: dict[tuple[str, ...], tuple[str, Parsed]] = {}

    def expedite(self) -> None:
        """Read on the next tick, whatever the cadence and the backoff had counted (reload)."""
        self.cadence.expedite()

    def tick(self, binary: str | None, gpus: Iterable[str]) -> Read:
        """This tick's read with nvidia-smi at ``binary`` (None: not found) for the GPUs on
        the bus (their slots)."""
        gpu_set = frozenset(gpus)
        if self._no_nvlink is not None and self._no_nvlink == gpu_set:
            return Read(no_nvlink=True)
        if not self.cadence.due():
            return Read()
        if binary is None or not gpu_set:
            return Read()  # the agent's gates say why; nothing to read with or for
        if not pci.module_loaded(self.sysfs_root):
            return Read(ran=True, skipped="module")
        if self.runner.busy():
            return Read(ran=True, skipped="busy")  # due again on the next tick
        if not self.cadence.start():
            return Read()
        return self._read(binary, gpu_set)

    def _read(self, binary: str, gpu_set: frozenset[str]) -> Read:
        self._spawns = 0
        try:
            text = self._run(binary, STATUS_ARGS)
            if text is None:
                return Read(ran=True, spawns=self._spawns)
            status = self._parsed(STATUS_ARGS, text, parse_status)
            counters = None
            if status.has_links:
                text = self._run(binary, COUNTERS_ARGS)
                if text is None:
                    return Read(ran=True, spawns=self._spawns)
                counters = self._parsed(COUNTERS_ARGS, text, parse_counters)
        except Failed as e:
            warn = self.cadence.failed()
            return Read(ran=True, failure=str(e), warn=warn, spawns=self._spawns)
        recovered = self.cadence.succeeded()
        if status.no_nvlink:
            self._no_nvlink = gpu_set
        return Read(
            ran=True,
            status=status,
            counters=counters,
            recovered=recovered,
            warnings=self._new_warnings(status, counters),
            no_nvlink=status.no_nvlink,
            spawns=self._spawns,
        )

    def _parsed(self, args: tuple[str, ...], text: str, parse: Callable[[str], Parsed]) -> Parsed:
        """``parse`` of the answer ``text`` to ``args``; the last answer's own (the same
        object) where it is the same text, as on a quiet host read after read: a GPU's links
        and their error counters seldom change, and an 8-GPU answer of counters is 600 lines
        to parse."""
        last = self._answers.get(args)
        if last is not None and last[0] == text:
            return last[1]
        parsed = parse(text)
        self._answers[args] = (text, parsed)
        return parsed

    def _new_warnings(self, *answers: Parsed | None) -> tuple[str, ...]:
        # Keyed on an answer's first unreadable line: the same answer read every minute is
        # one warning, and an answer that changes (a driver upgrade) is said again.
        out = []
        for args, answer in zip((STATUS_ARGS, COUNTERS_ARGS), answers, strict=True):
            if answer is None or not answer.unreadable:
                continue
            line = answer.unreadable[0]
            if (args, line) not in self._warned:
                self._warned.add((args, line))
                extra = len(answer.unreadable) - 1
                more = f" (and {extra} more)" if extra else ""
                out.append(
                    f"nvidia-smi {' '.join(args)}: cannot read the line "
                    f"{line[:_ERROR_CHARS]!r}{more}; the rest is read"
                )
        return tuple(out)

    def _run(self, binary: str, args: tuple[str, ...]) -> str | None:
        """Run one nvlink command: its stdout, None when interrupted (shutdown), or
        :class:`Failed`."""
        try:
            text = smirun.run(self.runner, binary, args)
        except Failed as e:
            self._spawns += e.spawned
            raise
        self._spawns += 1
        return text
