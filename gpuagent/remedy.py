"""The host's remedy (pure): the one thing to do with this host now, and what it fixes.

A host's problems each name an action (:data:`gpuagent.health.ACTIONS`); three criticals
asking ``reset_gpu``, ``reset_gpu`` and ``reboot`` ask one thing, a reboot, which ends all
three.  :func:`remedy` says it, from the problems worst first in the one order of
:func:`gpuagent.health.rank` (the order the Slurm drain reason takes its action from):

* its action is the worst problem's, so that the STATUS line, ``gpuagent status``, the
  state's ``remedy`` and the drain reason name one action (a problem folded under a cause,
  ``cause`` set, and one asking ``none`` are left out: the cause is what to act on, and
  ``none`` is nothing to do);
* it *fixes* each problem whose action it :func:`covers`, where the action reaches: the host's
  actions (:data:`HOST_WIDE`) the whole host, a GPU's action the GPUs whose problems ask for
  it (every GPU where the host's own problem asks for it);
* it *leaves* the others, worst first, for after it.

Which action covers which, on what it reaches (row: the action done; column: the action a
problem asks for, in :data:`~gpuagent.health.ACTIONS` order, ``none`` left out: ``app``
restart_app, ``svc`` restart_service, ``p2p`` drain_p2p, ``host`` check_host, ``reset``
reset_gpu, ``d+rst`` drain_and_reset, ``boot`` reboot, ``rma`` drain_and_rma; ``x``: it
ends that problem)::

    done, asked:     app  svc  p2p  host reset d+rst boot rma
    restart_app       x    .    .    .    .     .     .    .
    restart_service   .    x    .    .    .     .     .    .
    drain_p2p         .    .    x    .    .     .     .    .
    check_host        .    .    .    x    .     .     .    .
    reset_gpu         x    .    x    .    x     x     .    .
    drain_and_reset   x    .    x    .    x     x     .    .
    reboot            x    x    x    .    x     x     x    .
    drain_and_rma     x    x    x    .    x     x     x    x

Why, row by row:

* ``restart_app`` restarts a job; the GPU, its links, the host and its services are untouched
  by it, so it ends only the problems that ask for it.
* ``restart_service`` starts a service again (nvidia-fabricmanager, nvidia-imex,
  nvidia-persistenced); it restarts no job (the job that failed for want of it must be
  started again by its owner), resets no GPU, mends nothing on the host.
* ``drain_p2p`` stops the GPU's peer-to-peer work and nothing else: a failed job is another
  job, a reset still a reset.
* ``check_host`` is a look and a repair of the host (a slot, a cable, the BIOS, the
  driver's install); it resets no GPU and restarts nothing by itself.
* ``reset_gpu`` moves the GPU's work away and resets it: its jobs start again after
  (``restart_app``), its peer-to-peer work is stopped and its links' state cleared
  (``drain_p2p``), and the drain and the reset ``drain_and_reset`` asks for are done.  It
  is no boot (``reboot``: a hung driver, a GPU gone from the bus, a driver to load), starts
  no service, mends no host, and a bad board stays bad (``drain_and_rma``).
* ``drain_and_reset`` does what ``reset_gpu`` does, and the same reasons hold.
* ``reboot`` drains the host and boots it: every job, P2P work and GPU starts afresh, and
  a service starts again at boot; a host fix outlives a reboot (``check_host``: the slot or
  the BIOS is as it was), and a board that needs replacing stays bad (``drain_and_rma``).
* ``drain_and_rma`` takes the board out: every problem of that board leaves with it (its
  replacement is a power-off, a boot), save the host's (``check_host``: the slot, riser or
  cable the board sat in stays).  It reaches only the boards that ask for it: the other
  GPUs' problems are what it leaves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from gpuagent.health import ACTIONS, named, ranked

if TYPE_CHECKING:
    # Annotations only: `gpuagent status` imports this module.
    from gpuagent.schema import RemedyEntry, State

__all__ = [
    "COVERS",
    "HOST_WIDE",
    "SAYS",
    "Ailment",
    "covers",
    "of_state",
    "places",
    "plan",
    "remedy",
]

# What each action says to do, in a few words (the STATUS line's room is short).
SAYS = {
    "restart_app": "restart the app",
    "restart_service": "restart the service",
    "drain_p2p": "drain P2P work",
    "check_host": "check the host",
    "reset_gpu": "reset the GPU",
    "drain_and_reset": "drain and reset",
    "reboot": "drain and reboot",
    "drain_and_rma": "drain and RMA",
}
# The actions done to the whole host, whichever problem asks: the others are a GPU's.
HOST_WIDE = frozenset({"restart_service", "check_host", "reboot"})
_RESET = frozenset({"restart_app", "drain_p2p", "reset_gpu", "drain_and_reset"})
# Each action and the actions whose problems it ends, where it reaches (the docstring's
# table, row by row).
COVERS: dict[str, frozenset[str]] = {
    "none": frozenset(),
    "restart_app": frozenset({"restart_app"}),
    "restart_service": frozenset({"restart_service"}),
    "drain_p2p": frozenset({"drain_p2p"}),
    "check_host": frozenset({"check_host"}),
    "reset_gpu": _RESET,
    "drain_and_reset": _RESET,
    "reboot": _RESET | {"restart_service", "reboot"},
    "drain_and_rma": frozenset(ACTIONS) - {"none", "check_host"},
}
# One problem as the rule takes it: its slot ("": the host's), its name (``Xid 79``,
# ``gpu_count``), its action, and whether it is folded under a cause.
Ailment = tuple[str, str, str, bool]


def covers(done: str, asked: str) -> bool:
    """Whether doing action ``done`` ends a problem asking for ``asked``, on what ``done``
    reaches (the table above; an action this version does not know covers nothing and is
    covered by nothing but itself)."""
    return asked in COVERS.get(done, frozenset()) or (done == asked and done != "none")


def remedy(ailments: Iterable[Ailment]) -> RemedyEntry | None:
    """The host's remedy from its problems, worst first (:func:`gpuagent.health.rank`):
    ``action`` (the worst problem's), ``says`` (:data:`SAYS`), ``fixes`` and ``leaves``
    (each problem named ``SLOT NAME``, ``host NAME`` for the host's, worst first); None when
    no problem asks for anything (a healthy host)."""
    steps = plan(ailments)
    return steps[0] if steps else None


def plan(ailments: Iterable[Ailment]) -> list[RemedyEntry]:
    """:func:`remedy` of ``ailments`` (worst first), then the remedy of what it leaves, and so
    on until nothing is left: each step fixes at least the problem that names its action."""
    left = [a for a in ailments if a[2] != "none" and not a[3]]
    steps: list[RemedyEntry] = []
    while left:
        action = left[0][2]
        asking = {slot for slot, _, asked, _ in left if asked == action}
        fixed: list[Ailment] = []
        kept: list[Ailment] = []
        for ailment in left:
            slot, _, asked, _ = ailment
            reached = action in HOST_WIDE or "" in asking or slot in asking
            (fixed if reached and covers(action, asked) else kept).append(ailment)
        steps.append(
            {
                "action": action,
                "says": SAYS.get(action, action),
                "fixes": _names(fixed),
                "leaves": _names(kept),
            }
        )
        left = kept
    return steps


def of_state(st: State) -> list[RemedyEntry]:
    """:func:`plan` of the problems in the state ``st`` (an older agent's too, which wrote no
    ``remedy``): its first step is the state's remedy."""
    return plan(
        (slot, named(p["kind"], p.get("xid")), p["action"], bool(p.get("cause")))
        for slot, p in ranked(st)
    )


def places(names: Sequence[str]) -> tuple[str, ...]:
    """Where the problems ``names`` (``SLOT NAME``, ``host NAME``) are, each once, in their
    order: a GPU by its slot, the host's problem by its name (``gpu_count``: "host" alone
    would not tell its problems apart, and no slot reads as a name)."""
    return tuple(dict.fromkeys(n.split(" ", 1)[n.startswith("host ")] for n in names))


def _names(ailments: Iterable[Ailment]) -> list[str]:
    return [f"{slot or 'host'} {name}" for slot, name, _, _ in ailments]
