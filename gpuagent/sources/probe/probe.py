"""One nvidia-smi probe: run, retry on a rejected field, parse, classify."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace

from gpuagent.edges import smirun
from gpuagent.edges.runner import Outcome, Runner
from gpuagent.sources.probe.smi import (
    FALLBACKS,
    FIELDS,
    ParseError,
    classify,
    command,
    invalid_field,
    parse_output,
)
from gpuagent.views import Failure, Row

__all__ = ["ProbeResult", "Prober", "lookup"]

# The NVML version-mismatch message is two lines; nothing useful comes after that.
_ERROR_LINES = 2
_ERROR_CHARS = 300


def lookup(binary: str, path: str | None = None) -> str | None:
    """Resolve the configured nvidia-smi: a path containing ``/`` if it exists, else ``$PATH``.

    A stat, never a spawn; an existing path that cannot be executed is returned so that the
    probe reports ``permission_denied`` instead of pretending the binary is absent.
    """
    if "/" in binary:
        return binary if os.path.lexists(binary) else None
    return shutil.which(binary, path=path)


@dataclass(frozen=True)
class ProbeResult:
    """What one probe gave: ``rows`` on success, else ``failure`` and a one-line ``error``.

    ``detail`` is the offending output line of an unparseable answer (for the debug log),
    ``warnings`` lines nvidia-smi printed beside valid data (infoROM) and one for each row
    or value the parse left out as malformed (smi.Output.malformed), ``spawns`` the number
    of processes started, ``rejected`` the fields nvidia-smi refused on the way.  Beside the
    rows: ``gpu_errors`` the error text of each GPU nvidia-smi could not answer for, by sysfs
    slot (a partial success), ``requires_reset`` the fields reading ``[GPU requires reset]``
    by slot, ``inforom`` the slots warned about.  ``duration`` is the wall time of the last
    run (s).
    """

    rows: list[Row] | None = None
    failure: Failure | None = None
    error: str = ""
    exit_code: int | None = None
    detail: str = ""
    spawns: int = 0
    warnings: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    interrupted: bool = False
    fields: tuple[str, ...] = field(default=FIELDS)
    gpu_errors: dict[str, str] = field(default_factory=dict)
    requires_reset: dict[str, tuple[str, ...]] = field(default_factory=dict)
    inforom: tuple[str, ...] = ()
    duration: float = 0.0
    # Per row, the bracketed text nvidia-smi gave instead of a value (smi.Output.reasons).
    reasons: tuple[dict[str, str], ...] = ()


def _first_lines(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " ".join(lines[:_ERROR_LINES])[:_ERROR_CHARS]


def _failed(code: int | None, stdout: str) -> ProbeResult:
    """A run that exited ``code`` with ``stdout`` and gave no rows to use."""
    return ProbeResult(
        failure=classify(code or 0, stdout),
        error=f"exit {code}: {_first_lines(stdout) or '(no output)'}",
    )


class Prober:
    """Runs ``nvidia-smi --query-gpu`` through a :class:`Runner` with ``LC_ALL=C``.

    The field list shrinks when nvidia-smi rejects a field (``Field "X" is not a valid field
    to query.``, exit 2): the field's older name is tried, or the field dropped, and the query
    runs again at once.  It is restored in full after an outage, since a driver upgrade may
    accept the fields again.
    """

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.fields = FIELDS
        self._tried_fallbacks: set[str] = set()

    def configure(self, timeout: float) -> None:
        """Give each probe ``timeout`` seconds from now on."""
        self.runner.timeout = timeout

    def busy(self) -> bool:
        """Whether an abandoned probe is still alive (no new probe may start)."""
        return self.runner.busy()

    def probe(self, binary: str) -> ProbeResult:
        """Run one probe of ``binary``; never raises for anything nvidia-smi does."""
        env = smirun.environment()
        spawns = 0
        rejected: list[str] = []
        while True:
            result = self.runner.run(command(binary, self.fields), env)
            spawns += result.outcome is not Outcome.SPAWN_FAILED
            bad = invalid_field(result.stdout) if result.exit_code not in (None, 0) else None
            if bad is not None and bad in self.fields and len(self.fields) > 1:
                rejected.append(bad)
                self._replace(bad)
                continue
            out = self._judge(result.outcome, result.exit_code, result.stdout, result.error)
            if out.failure is not None:
                self.fields = FIELDS
                self._tried_fallbacks.clear()
            return replace(
                out,
                exit_code=result.exit_code,
                spawns=spawns,
                rejected=tuple(rejected),
                fields=self.fields,
                duration=result.duration,
            )

    def read(self, stdout: str) -> ProbeResult:
        """What ``stdout`` says as an answer of this query that exited 0 (one sample of
        nvidia-smi's loop): rows, or the failure of an unreadable one."""
        return replace(self._judge(Outcome.EXITED, 0, stdout, None), fields=self.fields)

    def _replace(self, bad: str) -> None:
        fallback = FALLBACKS.get(bad)
        if fallback and fallback not in self._tried_fallbacks:
            self._tried_fallbacks.add(fallback)
            self.fields = tuple(fallback if f == bad else f for f in self.fields)
        else:
            self.fields = tuple(f for f in self.fields if f != bad)

    def _judge(
        self, outcome: Outcome, code: int | None, stdout: str, error: OSError | None
    ) -> ProbeResult:
        if outcome is Outcome.SPAWN_FAILED:
            failure = Failure.OTHER
            if isinstance(error, FileNotFoundError):
                failure = Failure.NOT_FOUND
            elif isinstance(error, PermissionError):
                failure = Failure.PERMISSION_DENIED
            return ProbeResult(failure=failure, error=f"cannot run: {error}")
        if outcome is Outcome.INTERRUPTED:
            return ProbeResult(interrupted=True)
        if outcome in (Outcome.TIMEOUT, Outcome.STUCK):
            suffix = "; it did not exit after SIGKILL" if outcome is Outcome.STUCK else ""
            return ProbeResult(
                failure=Failure.TIMEOUT,
                error=f"no answer within {self.runner.timeout:g} s{suffix}",
            )
        if outcome is Outcome.OVERFLOW:
            return ProbeResult(
                failure=Failure.UNPARSEABLE,
                error=f"more than {self.runner.max_output} bytes of output",
                detail=stdout[:_ERROR_CHARS],
            )
        # infoROM corruption (14) is a warning printed beside valid data.
        try:
            out = parse_output(stdout, self.fields)
        except ParseError as e:
            if e.csv:
                # Rows of the wrong shape, whatever the exit code and whatever a cell says.
                return ProbeResult(
                    failure=Failure.UNPARSEABLE,
                    error=f"exit {code}: {e}",
                    detail=e.line[:_ERROR_CHARS],
                )
            if code not in (0, 14):
                return _failed(code, stdout)
            failure = classify(code or 0, stdout)
            if failure is Failure.OTHER:
                failure = Failure.UNPARSEABLE
            text = f"exit {code}: {e}" if failure is Failure.UNPARSEABLE else _first_lines(stdout)
            return ProbeResult(failure=failure, error=text, detail=e.line[:_ERROR_CHARS])
        # An error naming a GPU (exit 255, 15) is that GPU's problem, not an outage: the
        # other GPUs' rows, if any, are used.
        if code not in (0, 14) and not out.gpu_errors:
            return _failed(code, stdout)
        return ProbeResult(
            rows=out.rows,
            warnings=out.warnings + out.malformed,
            gpu_errors=out.gpu_errors,
            requires_reset=out.requires_reset,
            inforom=out.inforom,
            reasons=out.reasons,
        )
