"""The journal's retention as a source: no view, only the agent's own trouble
``journal_retention`` (the state's ``problems``), with one warning when it starts.

It is the agent's trouble, not a host problem: a journal too short for ``history_days`` makes
no GPU unfit to run jobs (a host problem would drain the node in Slurm and page), it blinds
the agent's own evidence (recurrence, ``gpuagent history``), as an unreadable journal
(``journal``) does.  Looked at on the first tick, after a reload, then once an hour (:data:`EVERY`):
journald's cap and the oldest entry change slowly, and opening the journal maps its files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpuagent.config import Config
from gpuagent.logs import EventLog
from gpuagent.sources import Outcome, Source
from gpuagent.sources.retention import store
from gpuagent.sources.retention.judge import Store, judge
from gpuagent.views import Tick

__all__ = ["EVERY", "KIND", "Retention"]

EVERY = 3600.0
KIND = "journal_retention"


class Retention(Source):
    """The journal ``config.journal_directory`` names, its journald under ``root``; ``look``
    sees it (:func:`gpuagent.sources.retention.store.look`)."""

    name = "retention"

    def __init__(
        self,
        log: EventLog,
        *,
        root: str = "/",
        look: Callable[[str, str], Store | None] = store.look,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log, self.root, self.look, self.monotonic = log, root, look, monotonic
        self.due: float | None = None
        self.case: str | None = None
        self.said: str | None = None

    def reset(self, old: Config, new: Config) -> None:
        self.due = None

    def step(self, tick: Tick) -> Outcome:
        now = self.monotonic()
        if self.due is None or now >= self.due:
            self.due = now + EVERY
            seen = self.look(self.root, tick.config.journal_directory)
            found = None if seen is None else judge(seen, tick.config.history_days, tick.now)
            self._tell(found)
        return Outcome(trouble={KIND: self.said})

    def _tell(self, found: tuple[str, str] | None) -> None:
        case, said = found if found is not None else (None, None)
        if case is not None and case != self.case:
            self.log(logging.WARNING, None, said or "")
        elif case is None and self.case is not None:
            self.log(logging.INFO, None, "the journal holds history_days again")
        self.case, self.said = case, said
