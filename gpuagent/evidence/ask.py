"""The agent's side: ask root for evidence at the first critical problem of a GPU.

An empty file named by the slot in the request directory under the agent's runtime
directory is the whole request (``gpuagent-evidence.path`` watches it).  Each slot is asked
for once in this agent's life; root's ledger holds the limit (one bundle per GPU per boot, a
few an hour) whatever is asked, so a restarted agent asking again costs nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

from gpuagent.condition import Bug
from gpuagent.evidence import plan
from gpuagent.logs import EventLog
from gpuagent.report import Report
from gpuagent.schema import State

__all__ = ["SUBDIRECTORY", "Asker", "critical_slots", "for_runtime"]

SUBDIRECTORY = "evidence-requests"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def critical_slots(state: State) -> list[str]:
    """The slots of the GPUs with a critical problem in ``state``."""
    return [
        g["pci_slot"]
        for g in state["gpus"]
        if any(p["severity"] == "critical" for p in g["problems"])
    ]


class Asker:
    """Writes a request for each GPU's first critical problem into ``directory`` (made if
    absent, 0700); a failure is one warning line, and asked again at the next report."""

    def __init__(self, directory: str, log: EventLog) -> None:
        self.directory = directory
        self.log = log
        self.asked: set[str] = set()
        self._bug = Bug(log, "asking for evidence")

    def __call__(self, report: Report) -> None:
        """Ask for each GPU of ``report`` with a new critical problem; never raises."""
        try:
            self.ask(critical_slots(report.state))
        except Exception as e:  # noqa: BLE001 - see Bug
            self._bug.caught(e)
        else:
            self._bug.passed()

    def ask(self, slots: Iterable[str]) -> None:
        """Write a request for each of ``slots`` not asked for yet."""
        for slot in slots:
            if slot in self.asked or not plan.is_slot(slot):
                continue
            try:
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
                fd = os.open(os.path.join(self.directory, slot), _CREATE, 0o600)
            except FileExistsError:
                pass  # root has not taken the last one yet: it is the same request
            except OSError as e:
                self.log(
                    logging.WARNING,
                    None,
                    f"cannot ask for GPU {slot}'s evidence in {self.directory}: {e.strerror or e}",
                )
                continue
            else:
                os.close(fd)
            self.asked.add(slot)


def for_runtime(environ: Mapping[str, str], log: EventLog) -> list[Asker]:
    """The asker for the service's runtime directory (``$RUNTIME_DIRECTORY``); none in a
    run by hand, which has no root unit to answer."""
    runtime = environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return [Asker(os.path.join(runtime, SUBDIRECTORY), log)] if runtime else []
