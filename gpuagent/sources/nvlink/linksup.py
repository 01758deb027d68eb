"""The NVLink links seen up in this boot, remembered on disk across the agent's restarts.

``nvlink_down`` says a link is down that was up earlier in this boot: a restart (an upgrade,
``systemctl restart``) must not forget that, or a link that went down while the agent was
away would look as if it had never been up.  The file is ``nvlink.json`` in the directory
systemd names in ``$STATE_DIRECTORY`` (:class:`gpuagent.edges.statedir.StateFile`), beside
``gpus.json`` (:mod:`gpuagent.sources.bus.known`); it names the boot (the kernel's
``boot_id``, as the agent is given it), so that after a reboot it says nothing: a link down
from the start of a boot is the comparison's to judge (fewer links than the other GPUs of
its model).  A hand run without ``$STATE_DIRECTORY``
remembers nothing.  A file that cannot be read or written is one warning (the state's
``problems["nvlink_links"]`` while it lasts), and the agent goes on with what it sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuagent.edges.statedir import StateFile
from gpuagent.logs import EventLog

__all__ = ["FILE", "LinksUp"]

FILE = "nvlink.json"
# A few bytes a link: more than this is not the agent's.
MAX_SIZE = 1024 * 1024
# NVLink numbers links from 0; no GPU has nearly this many.
_MAX_LINK = 1024
_WHAT = "the NVLink links up this boot"


class LinksUp:
    """The links up this boot by GPU key (``nvlink.Gpu.key``), remembered in ``directory``
    (None or ``""``: not remembered); ``boot`` is this boot's id (``""``: unknown, nothing is
    remembered, since the file could not say which boot it is of)."""

    def __init__(self, directory: str | None, log: EventLog, *, boot: str) -> None:
        self.boot = boot
        self.file = StateFile(
            directory if boot else None,
            FILE,
            log,
            limit=MAX_SIZE,
            otherwise="the links read from now",
        )
        self.links: dict[str, set[int]] = self.file.read_boot(_parsed, _WHAT, boot) or {}

    @property
    def error(self) -> str | None:
        """Why the file cannot be read or written, while it cannot (the state's
        ``problems["nvlink_links"]``)."""
        return self.file.error

    def update(self, links: Mapping[str, set[int]]) -> None:
        """The links up this boot now (all of them, by GPU key); writes the file when that
        changes what it holds."""
        if links == self.links:
            return
        self.links = {k: set(v) for k, v in links.items()}
        data = {
            "boot_id": self.boot,
            "links_up": {k: sorted(v) for k, v in sorted(self.links.items())},
        }
        self.file.write(data, _WHAT)


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
