"""One nvidia-smi subcommand (or another NVIDIA tool) beside the probe, through the probe's
:class:`Runner`.

The NVLink, processes, vGPU and IMEX reads run their own commands between probes; all read an
answer the same way: stdout of an exit 0, ``None`` when the run was interrupted (shutdown),
and for anything else a :class:`Failed` whose text is one line saying how.
"""

from __future__ import annotations

import os

from gpuagent.edges.runner import Outcome, Runner

__all__ = ["Failed", "environment", "run"]

_ERROR_CHARS = 300


def environment() -> dict[str, str] | None:
    """The environment an NVIDIA tool runs in: this process's, in the C locale, for its
    words are parsed; ``None`` (inherit it) where this process's already is.  The unit sets
    ``LC_ALL=C``, so that the service's children do not each get a copy of the environment
    to encode, a twentieth of an 8-GPU tick (docs/performance.md)."""
    return None if os.environ.get("LC_ALL") == "C" else {**os.environ, "LC_ALL": "C"}


class Failed(Exception):
    """One run that gave no answer to read; ``str()`` is the one-line reason, ``spawned``
    whether a child ran at all."""

    def __init__(self, reason: str, *, spawned: bool = True) -> None:
        super().__init__(reason)
        self.spawned = spawned


def run(
    runner: Runner,
    binary: str,
    args: tuple[str, ...],
    *,
    name: str = "nvidia-smi",
    answers: frozenset[int] = frozenset({0}),
) -> str | None:
    """Run ``binary`` with ``args`` (:func:`environment`); its stdout, ``None`` when interrupted.
    Raises :class:`Failed`, its reason naming the tool ``name``, unless it exited with one of
    ``answers``."""
    what = f"{name} {' '.join(args)}"
    result = runner.run([binary, *args], environment())
    if result.outcome is Outcome.SPAWN_FAILED:
        raise Failed(f"{what}: cannot run: {result.error}", spawned=False)
    if result.outcome is Outcome.INTERRUPTED:
        return None
    if result.outcome in (Outcome.TIMEOUT, Outcome.STUCK):
        raise Failed(f"{what}: no answer within {runner.timeout:g} s")
    if result.outcome is Outcome.OVERFLOW:
        raise Failed(f"{what}: more than {runner.max_output} bytes of output")
    if result.exit_code not in answers:
        first = " ".join(ln.strip() for ln in result.stdout.splitlines() if ln.strip())
        raise Failed(f"{what}: exit {result.exit_code}: {first[:_ERROR_CHARS] or '(none)'}")
    return result.stdout
