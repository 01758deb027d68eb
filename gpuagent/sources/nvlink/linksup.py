"""The NVLink links seen up in this boot, remembered on disk across the agent's restarts.

``nvlink_down`` says a link is down that was up earlier in this boot: a restart (an upgrade,
``systemctl restart``) must not forget that, or a link that went down while the agent was
away would look as if it had never been up.  The file is ``nvlink.json`` in the directory
systemd names in ``$STATE_DIRECTORY`` (``/var/lib/gpuagent``), beside ``gpus.json``
(:mod:`gpuagent.sources.bus.known`); it names the boot (the kernel's ``boot_id``), so that after a
reboot it says nothing: a link down from the start of a boot is the comparison's to judge
(fewer links than the other GPUs of its model).  A hand run without ``$STATE_DIRECTORY``
remembers nothing.  A file that cannot be read or written is one warning (the state's
``problems["nvlink_links"]`` while it lasts), and the agent goes on with what it sees.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from gpuagent import state
from gpuagent.condition import Condition, Edge
from gpuagent.edges import bootid, safefile
from gpuagent.logs import EventLog

__all__ = ["FILE", "LinksUp"]

FILE = "nvlink.json"
# A few bytes a link: more than this is not the agent's.
MAX_SIZE = 1024 * 1024
# NVLink numbers links from 0; no GPU has nearly this many.
_MAX_LINK = 1024


class LinksUp:
    """The links up this boot by GPU key (``nvlink.Gpu.key``), remembered in ``directory``
    (None or ``""``: not remembered); ``boot`` says which boot this is."""

    def __init__(
        self, directory: str | None, log: EventLog, *, boot: Callable[[], str] = bootid.current
    ) -> None:
        self.log = log
        self.boot = boot()
        self.path = os.path.join(directory, FILE) if directory and self.boot else None
        self.links: dict[str, set[int]] = {}
        self._trouble: Condition[str] = Condition()
        if self.path is not None and os.path.lexists(self.path):
            self.links = self._read(self.path)

    @property
    def error(self) -> str | None:
        """Why the file cannot be read or written, while it cannot (the state's
        ``problems["nvlink_links"]``)."""
        return self._trouble.value

    def _read(self, path: str) -> dict[str, set[int]]:
        try:
            boot, links = _parsed(safefile.load_json(path, MAX_SIZE))
        except (OSError, ValueError, TypeError) as e:
            self._note(f"{path}: cannot read the NVLink links up this boot: {state.why(e)}")
            return {}
        # Another boot's: a reboot forgets.
        return links if boot == self.boot else {}

    def update(self, links: Mapping[str, set[int]]) -> None:
        """The links up this boot now (all of them, by GPU key); writes the file when that
        changes what it holds."""
        if links == self.links:
            return
        self.links = {k: set(v) for k, v in links.items()}
        if self.path is None:
            return
        data = {
            "boot_id": self.boot,
            "links_up": {k: sorted(v) for k, v in sorted(self.links.items())},
        }
        try:
            state.write(self.path, data)
        except OSError as e:
            why = state.why(e)
            self._note(f"{self.path}: cannot remember the NVLink links up this boot: {why}")
            return
        self._note(None)

    def _note(self, error: str | None) -> None:
        if self._trouble.update(error) is Edge.STARTED:
            self.log(logging.WARNING, None, f"{error}; going on with the links read from now")


def _parsed(data: Any) -> tuple[str, dict[str, set[int]]]:
    """The boot and links of the file's JSON ``{"boot_id": str, "links_up": {GPU key:
    [link number, ...]}}``; raises TypeError (or ValueError) naming what is not so."""
    if not isinstance(data, dict) or not isinstance(data.get("boot_id"), str):
        raise TypeError("expected an object with a boot_id string")
    links = data.get("links_up")
    if not isinstance(links, dict):
        raise TypeError("links_up: expected an object")
    out: dict[str, set[int]] = {}
    for key, numbers in links.items():
        if not isinstance(numbers, list) or not all(
            type(n) is int and 0 <= n < _MAX_LINK for n in numbers
        ):
            raise TypeError(f"links_up[{key!r}]: expected a list of link numbers")
        out[key] = set(numbers)
    return data["boot_id"], out
