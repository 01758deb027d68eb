"""One bundle made whole: its parts gathered, its manifest written, the caps applied."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from gpuagent.evidence import plan
from gpuagent.evidence.gather import Gatherer, Part
from gpuagent.evidence.store import Store, write_new

__all__ = ["MANIFEST", "Made", "make", "manifest"]

MANIFEST = "manifest.json"


class Made(NamedTuple):
    """A bundle made: its ``name``, its ``path``, its ``parts`` and the older bundles
    ``dropped`` to keep the caps."""

    name: str
    path: str
    parts: list[Part]
    dropped: list[str]


def manifest(
    slot: str, *, trigger: str, boot: str, started: float, finished: float, parts: Sequence[Part]
) -> dict[str, Any]:
    """The manifest of a bundle of ``slot`` made by ``trigger`` (``request``: the agent's,
    ``hand``: root's) in boot ``boot`` from wall time ``started`` to ``finished`` (s): each
    part with its outcome, exit code, bytes and seconds, and the bytes of all."""
    return {
        "slot": slot,
        "trigger": trigger,
        "boot_id": boot,
        "started_at": started,
        "finished_at": finished,
        "bytes": sum(p.bytes for p in parts),
        "parts": [{k: v for k, v in p._asdict().items() if v not in ("", None)} for p in parts],
    }


def make(
    store: Store,
    gatherer: Gatherer,
    slot: str,
    *,
    trigger: str,
    boot: str,
    caps: tuple[int, int],
    wall: Callable[[], float],
) -> Made:
    """Gather a bundle of ``slot`` into ``store`` and keep at most ``caps`` (bundles,
    bytes), the oldest dropped.  Raises ``FileExistsError`` when a bundle of that name (this
    second's) exists, ``OSError`` when the directory cannot be written."""
    started = wall()
    name = plan.bundle_name(started, slot)
    into = store.begin(name)
    try:
        parts = gatherer.gather(into, slot, started)
        text = json.dumps(
            manifest(
                slot, trigger=trigger, boot=boot, started=started, finished=wall(), parts=parts
            ),
            indent=2,
        )
        write_new(into, MANIFEST, text.encode() + b"\n")
    finally:
        os.close(into)
    dropped = store.finish(name, *caps)
    return Made(name, os.path.join(store.path, name), parts, dropped)
