"""What the host pays for the agent's nvidia-smi: one NVML start for each exec (pure).

Every exec of nvidia-smi starts NVML (opens every GPU, initialises the driver's state for it)
and stops it when it exits, whatever it was asked; a long-lived child in nvidia-smi's loop
mode (``-l``, ``-lms``) is one exec, so one start for all the samples it prints.  The kinds
are the agent's own commands, named after the module that runs them, so that a day's count
says which read costs what.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence

from gpuagent.sources.board import serials
from gpuagent.sources.probe import smi

__all__ = ["LOOP_FLAGS", "Starts", "kind"]

# nvidia-smi's loop mode: -l/--loop=SEC, -lms/--loop-ms=MS (the value is the next argument
# or after "=").
LOOP_FLAGS = ("-l", "-lms", "--loop", "--loop-ms")
_PROBE = smi.command("nvidia-smi", smi.FIELDS)[1]


def _loops(args: Sequence[str]) -> bool:
    return any(a in LOOP_FLAGS or a.split("=", 1)[0] in LOOP_FLAGS for a in args)


def kind(argv: Sequence[str]) -> str | None:
    """The kind of the exec ``argv`` (a program and its arguments): ``"probe --query-gpu"``,
    ``"serials --query-gpu"``, ``"wear --query-gpu"`` (any other field list),
    ``"--query-compute-apps"``, ``"nvlink --status"``, ``"-q"``, ``"-q -i"`` …, with
    ``" loop"`` after it for a loop-mode child; ``None`` for a program that is not
    nvidia-smi (it starts no NVML: ``nvidia-imex-ctl`` asks the IMEX daemon)."""
    if not argv or os.path.basename(argv[0]) != "nvidia-smi":
        return None
    args = [a for a in argv[1:] if not a.startswith("--format=")]
    loop = _loops(args)
    first = args[0] if args else ""
    if first.startswith("--query-gpu="):
        named = "probe" if first == _PROBE else "serials" if first == serials.ARGS[0] else "wear"
        name = f"{named} --query-gpu"
    elif first.startswith("--query-"):
        name = first.split("=", 1)[0]
    else:
        # A subcommand and its first option (nvlink --status), or the options themselves
        # (-q -i, without the slot).
        words = [a for a in args[:2] if a.startswith("-") or a == first]
        name = " ".join(words) if words else "(no arguments)"
    return f"{name} loop" if loop else name


class Starts:
    """NVML starts counted by :func:`kind`, one for each exec; the other programs' execs
    apart (``others``)."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        self.others = 0

    def started(self, argv: Sequence[str]) -> None:
        """One exec of ``argv``: a long-lived child is counted once, when it starts."""
        name = kind(argv)
        if name is None:
            self.others += 1
        else:
            self.by_kind[name] += 1

    @property
    def total(self) -> int:
        """Every NVML start so far."""
        return sum(self.by_kind.values())
