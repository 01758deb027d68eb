"""The IMEX domain as ``nvidia-imex-ctl -N`` prints it, and when it is a problem (pure).

``-N`` ("Gets the full status of the entire IMEX domain", NVIDIA's IMEX guide, "The
nvidia-imex-ctl Tool") prints a legend, one row per node of ``nodes_config.cfg``, a
connectivity table and the domain's state (tests/data/corpus/imex)::

    Node #0   - 172.31.48.81    - READY                - Version: 570.172
     Nodes From\\To  0   1
           0        C   C
    Domain State: UP

A node is connected where its row says ``READY`` and every cell of its column (the others'
connections to it) is ``C`` ("Connected - Ready for operation"; ``N`` never connected, ``D``
disconnected, ``R`` recovering, ``I`` invalid, ``A`` authenticating, ``!V!``/``!M!``
version or node map mismatch).  The domain is ready when its state is ``UP`` and every node
is connected.  ``DOWN`` is no quorum: no memory is shared, critical; any other state
(``DEGRADED``: some nodes missing) or an UP domain with a node not connected is a warning,
since jobs on the nodes that are connected still run.  One read not ready is a domain coming
up (its daemons start within seconds of each other): :class:`Readiness` opens
``imex_domain_not_ready`` only on the second read in a row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuagent.health import CRITICAL, WARNING
from gpuagent.untrusted import capped, whole
from gpuagent.views import Finding

__all__ = ["ARGS", "KIND", "Domain", "Node", "Readiness", "finding", "parse"]

ARGS = ("-N",)
KIND = "imex_domain_not_ready"

_STATE = re.compile(r"Domain State:\s*(\S+)")
# Node indexes by ASCII digits and a length (``\d`` takes ``٣``; ``int`` no ``²``, nor more
# than 4,300 digits): nodes_config.cfg lists a few hundred nodes at most.
_INDEX = "[0-9]{1,6}"
_NODE = re.compile(rf"Node #({_INDEX})\s+-\s+(\S+)\s+-\s+(\S+)")
_TABLE = "Nodes From\\To"
_ROW = re.compile(rf"\s*({_INDEX})\s+(\S.*)")
_SHOWN = 8  # nodes named in a message; the rest are counted
_ENDS = "when nvidia-imex-ctl -N says Domain State: UP with every node connected"


@dataclass(frozen=True)
class Node:
    """One node's row: its ``index``, ``address`` (as ``nodes_config.cfg`` has it) and
    ``status`` (``READY`` where it is)."""

    index: int
    address: str
    status: str


@dataclass(frozen=True)
class Domain:
    """One ``-N`` answer: the domain's ``state``, its ``nodes`` and, by the index of the node
    connected to, the cells of the connectivity table that are not ``C``."""

    state: str
    nodes: tuple[Node, ...] = ()
    unconnected: frozenset[int] = frozenset()

    @property
    def not_connected(self) -> tuple[Node, ...]:
        """The nodes not READY, or not connected to from some node, in their order."""
        return tuple(n for n in self.nodes if n.status != "READY" or n.index in self.unconnected)

    @property
    def ready(self) -> bool:
        """Whether the domain is UP with every node connected."""
        return self.state == "UP" and not self.not_connected


def parse(text: str) -> Domain | None:
    """The domain in ``-N`` output; None where it has no ``Domain State`` line (not an
    answer to read: the caller says so as a failed read)."""
    state = ""
    nodes: list[Node] = []
    columns: list[int] = []
    unconnected: set[int] = set()
    for line in text.splitlines():
        stripped = line.strip()
        if (m := _STATE.match(stripped)) is not None:
            state = m[1]
        elif (m := _NODE.match(stripped)) is not None:
            nodes.append(Node(int(m[1]), m[2], m[3]))
        elif stripped.startswith(_TABLE):
            heads = stripped.removeprefix(_TABLE).split()
            columns = [n for c in heads if (n := whole(c, 6)) is not None]
        elif columns and (m := _ROW.fullmatch(line)) is not None:
            cells = m[2].split()
            unconnected.update(c for c, cell in zip(columns, cells, strict=False) if cell != "C")
    return Domain(state, tuple(nodes), frozenset(unconnected)) if state else None


def finding(domain: Domain) -> Finding | None:
    """``imex_domain_not_ready`` for a domain not ready (None: ready); the caller holds it
    back on the first such read (:class:`Readiness`)."""
    if domain.ready:
        return None
    missing = domain.not_connected
    named = ", ".join(
        f"#{n.index} {capped(n.address)} ({capped(n.status)})" for n in missing[:_SHOWN]
    )
    more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
    nodes = f"nodes not connected: {named}{more}" if missing else "every node connected"
    severity = CRITICAL if domain.state == "DOWN" else WARNING
    return Finding(
        KIND,
        severity,
        "check_host",
        f"IMEX domain {capped(domain.state)} on two reads in a row, {nodes}; memory shared over "
        "NVLink between trays fails for jobs that need those nodes; see nvidia-imex-ctl -N "
        "and journalctl -u nvidia-imex on them",
        ends=_ENDS,
    )


class Readiness:
    """The domain's readiness over reads: a problem only from the second read in a row that
    finds it not ready."""

    def __init__(self) -> None:
        self._not_ready = 0

    def update(self, domain: Domain) -> list[Finding] | None:
        """This read's findings: none when ready, the problem from the second read in a row
        not ready; None on the first (not known yet: what held before holds, so a problem
        held over a restart neither ends nor starts again on it)."""
        found = finding(domain)
        self._not_ready = 0 if found is None else self._not_ready + 1
        if found is None:
            return []
        return [found] if self._not_ready >= 2 else None

    def reset(self) -> None:
        """The domain is no longer read (the unit stopped or was disabled): start over."""
        self._not_ready = 0
