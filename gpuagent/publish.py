"""The tick's outputs: the state file, the Prometheus textfile and the sd_notify STATUS, each
drawn from the tick's one :class:`~gpuagent.report.Report`.

Each output owns its write failure: one error line when it starts (or changes), one info line
when it clears, and the agent's trouble (the state's ``problems``: ``state_file``,
``textfile``) while it holds.  A bug in turning the report into the outputs is survived like
one in a tick (``internal_publish``).  That trouble (:attr:`Publisher.trouble`) is an input
of the next tick's report: the outputs of a tick say what the tick before could not write.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence

from gpuagent import metrics, state
from gpuagent.condition import Bug, Condition, Edge
from gpuagent.edges import safefile
from gpuagent.logs import Event, EventLog
from gpuagent.notify import Notifier
from gpuagent.report import STATE_FILE, Report, finished, stored
from gpuagent.schema import State

__all__ = ["Publisher", "Textfile"]


class _Failing:
    """A file that cannot be written: one error line when that starts or its reason changes;
    :attr:`reason` while it holds."""

    def __init__(self, log: EventLog, event: Event, what: str) -> None:
        self.log = log
        self.event = event
        self.what = what
        self._condition: Condition[str] = Condition()

    @property
    def reason(self) -> str | None:
        """Why it cannot be written, while it cannot."""
        return self._condition.value

    def failed(self, reason: str) -> None:
        """A write failed for ``reason``."""
        if self._condition.update(reason) is not None:
            self.log(
                logging.ERROR, self.event, f"cannot write {self.what} {reason}; sampling goes on"
            )

    def written(self) -> bool:
        """A write went through; returns whether that ended a failure."""
        return self._condition.update(None) is Edge.ENDED


class Textfile:
    """Writes each tick's state to ``path`` for node_exporter.

    ``path`` may be a symlink (the package links node_exporter's directory to
    ``/run/gpuagent``): it is resolved first, since the write goes to a temporary file beside
    the target and is renamed over it.  Only a symlink root or this user made is followed:
    node_exporter's directory is another user's, who must not choose what root's hand run
    overwrites.  A directory that does not exist is one info line
    (no node_exporter here), other errors one error line per episode; :attr:`problem` says
    what is wrong while it is.
    """

    def __init__(self, path: str, log: EventLog) -> None:
        self.path = path
        self.log = log
        self._failing = _Failing(log, Event.METRICS_WRITE_FAILED, "Prometheus metrics to")
        self._absent: Condition[str] = Condition()
        self._exposition = metrics.Exposition()

    @property
    def problem(self) -> str | None:
        """Why the file cannot be written, while it cannot."""
        return self._failing.reason

    def configure(self, path: str) -> None:
        """Use ``path`` from now on (``""``: write nothing); the old file is removed."""
        if path != self.path:
            self.remove()
            self.path = path
            self._failing.written()
            self._absent.update(None)

    def write(self, st: State) -> None:
        """Replace the file with ``st``'s series; never raises for I/O errors."""
        if not self.path:
            return
        try:
            target = safefile.resolve_trusted(self.path)
        except OSError as e:
            self._failing.failed(f"{self.path}: {e.strerror or e}")
            return
        directory = os.path.dirname(target)
        if not os.path.isdir(directory):
            if self._absent.update(directory) is not None:
                self.log(
                    logging.INFO,
                    None,
                    f"not writing Prometheus metrics to {self._name(target)}: {directory} "
                    "does not exist (is prometheus-node-exporter installed?)",
                )
            return
        try:
            safefile.write_atomic(target, self._exposition.render(st))
        except OSError as e:
            self._failing.failed(f"{self._name(target)}: {e.strerror or e}")
            return
        cleared = self._failing.written(), self._absent.update(None) is Edge.ENDED
        if any(cleared):
            self.log(logging.INFO, None, f"Prometheus metrics written to {self._name(target)}")

    def remove(self) -> None:
        """Remove the file (at exit: a stopped agent's numbers must not look live)."""
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(safefile.resolve_trusted(self.path))

    def _name(self, target: str) -> str:
        return self.path if target == self.path else f"{self.path} (-> {target})"


class Publisher:
    """Writes each report to the state file, the textfile and systemd's STATUS."""

    def __init__(
        self,
        state_file: str,
        textfile: str,
        log: EventLog,
        notifier: Notifier,
        after: Sequence[Callable[[Report], None]] = (),
    ) -> None:
        self.state_file = state_file
        # What else each report goes to once written (the evidence requests): each never raises.
        self.after = tuple(after)
        self.log = log
        self.notifier = notifier
        self.textfile = Textfile(textfile, log)
        self._state_failing = _Failing(log, Event.STATE_WRITE_FAILED, "the state file")
        self._bug = Bug(log, "writing the state and metrics")

    def configure(self, state_file: str, textfile: str) -> None:
        """Write to these paths from now on; the old files are removed (nothing updates them
        any more: a state file would read as a hung agent)."""
        if state_file != self.state_file:
            with contextlib.suppress(OSError):
                os.unlink(self.state_file)
            self.state_file = state_file
        self.textfile.configure(textfile)

    @property
    def trouble(self) -> dict[str, str]:
        """What the publisher could not do, by kind, as it stands (``internal_publish``,
        ``state_file``, ``textfile``): the next report is built with it."""
        trouble = {
            "internal_publish": self._bug.reason,
            STATE_FILE: self._state_failing.reason,
            "textfile": self.textfile.problem,
        }
        return {k: v for k, v in trouble.items() if v is not None}

    def publish(self, report: Report) -> None:
        """Write ``report`` everywhere (built with :attr:`trouble` as the tick found it);
        never raises."""
        try:
            self._write_state(stored(report))
            self.textfile.write(report.state)
            self.notifier.status(report.status)
            for then in self.after:
                then(report)
        except Exception as e:  # noqa: BLE001 - see Bug
            # As in a tick: I/O errors are handled where they happen; this is for a bug in
            # turning the report into the outputs, which must not stop the watchdog either.
            self._bug.caught(e)
        else:
            if self._bug.passed():
                # The state file just written still reports the error: write it without.
                self._write_state(stored(report, self.trouble))

    def _write_state(self, st: State) -> None:
        try:
            state.write(self.state_file, st)
        except OSError as e:
            self._state_failing.failed(f"{self.state_file}: {e.strerror or e}")
            return
        if self._state_failing.written():
            self.log(
                logging.INFO,
                Event.STATE_WRITE_RECOVERED,
                f"state file {self.state_file} written again",
            )

    def finish(self, report: Report, reason: str, now: float) -> None:
        """The agent's end (``reason`` ``ticks`` or ``signal``, at wall time ``now``): the
        textfile goes, the state file says so."""
        self.textfile.remove()
        with contextlib.suppress(OSError):
            state.write(self.state_file, finished(report, reason, now, self.trouble))
