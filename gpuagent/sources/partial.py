"""A partial answer: the reads beside the probe (NVLink, the processes) go on for the GPUs
nvidia-smi reports, and keep what they last read of the others as stale (pure).

One GPU missing from nvidia-smi (``missing``: bound to nvidia, not in the answer) is a
problem of its own; it must not stop the other GPUs' reads, and what was last read of it
must not be shown as current: it is carried, marked stale, until a read has it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from gpuagent.views import BusView

__all__ = ["answering", "carry", "stale"]

T = TypeVar("T")


def answering(bus: BusView, missing: Iterable[str]) -> list[str]:
    """The slots of the GPUs nvidia-smi could answer for that the last answer did not leave
    out, in bus order."""
    left_out = set(missing)
    return [g.slot for g in bus.probeable if g.slot not in left_out]


def carry(
    last: Mapping[str, T], read: Mapping[str, T], missing: Iterable[str]
) -> tuple[dict[str, T], frozenset[str]]:
    """This ``read``'s entries, and ``last``'s for the ``missing`` GPUs it has none of; the
    slots carried (stale)."""
    out = dict(read)
    carried = {slot for slot in missing if slot in last and slot not in read}
    out.update((slot, last[slot]) for slot in carried)
    return out, frozenset(carried)


def stale(shown: Iterable[str], carried: Iterable[str], missing: Iterable[str]) -> frozenset[str]:
    """The slots ``shown`` whose entries are not current: carried from an earlier read, or
    read before nvidia-smi stopped reporting the GPU (``missing`` now)."""
    return frozenset(shown) & (frozenset(carried) | frozenset(missing))
