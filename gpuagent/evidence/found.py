"""The agent's side of the bundles: which ones root's unit wrote, for the problems to name.

The evidence directory is root's, mode 0755 (:mod:`gpuagent.evidence.store`): its names are
readable by the agent's user, the bundles themselves not.  The agent lists the names only
(nothing is asked of root, and nothing written); a name that is no bundle's is left out, so
that the state holds only ``<UTC time>-<slot>`` names.  It is listed again only when its
mtime changed (a bundle renamed whole, or one dropped), or while that change is under a
second old (a coarse mtime may not move for a second change within its tick).
"""

from __future__ import annotations

import logging
import os
import time

from gpuagent.evidence import plan
from gpuagent.evidence.plan import NO_BUNDLES
from gpuagent.health import CRITICAL
from gpuagent.logs import EventLog
from gpuagent.statusline import Problems

__all__ = ["NO_BUNDLES", "SCAN", "SUBDIRECTORY", "Found"]

# Under the state directory (root's store.DEFAULT is /var/lib/gpuagent/evidence).
SUBDIRECTORY = "evidence"

# Names read from the directory at most: a directory of millions is not read whole (the
# caps keep a few dozen bundles).
SCAN = 10_000
_SETTLED_NS = 1_000_000_000


class Found:
    """The bundles in ``directory`` (``$STATE_DIRECTORY/evidence``); a directory that cannot
    be listed is no bundle, and one warning line until it can."""

    def __init__(self, directory: str, log: EventLog) -> None:
        self.directory = directory
        self.log = log
        self._mtime: int | None = None
        self._bundles = plan.Bundles(directory)
        self._error: str | None = None

    def named(self, problems: Problems) -> plan.Bundles:
        """The bundles for ``problems`` (the verdict's, by slot) to name: listed only while a
        GPU has a critical one, none otherwise."""
        critical = any(
            p.finding.severity == CRITICAL for slot, mine in problems.items() if slot for p in mine
        )
        return self.bundles() if critical else NO_BUNDLES

    def bundles(self) -> plan.Bundles:
        """The bundles as the directory has them now (none where it is absent)."""
        try:
            mtime = os.stat(self.directory).st_mtime_ns
            if mtime != self._mtime or time.time_ns() - mtime < _SETTLED_NS:
                self._bundles = plan.Bundles(self.directory, self._list())
                self._mtime = mtime
        except FileNotFoundError:
            self._mtime, self._bundles = None, plan.Bundles(self.directory)
        except OSError as e:
            why = f"cannot list the evidence bundles in {self.directory}: {e.strerror or e}"
            if why != self._error:
                self.log(logging.WARNING, None, why)
            self._error = why
            self._mtime, self._bundles = None, plan.Bundles(self.directory)
            return self._bundles
        self._error = None
        return self._bundles

    def _list(self) -> tuple[str, ...]:
        names = []
        with os.scandir(self.directory) as entries:
            for n, entry in enumerate(entries):
                if n >= SCAN:
                    break
                if plan.is_bundle(entry.name):
                    names.append(entry.name)
        return tuple(sorted(names))
