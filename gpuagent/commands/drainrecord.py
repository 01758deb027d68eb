"""``slurm-check``'s record of the drains it made: the file that lets it skip slurmctld.

slurmd runs its HealthCheckProgram as root, outside the agent's unit (no
``$STATE_DIRECTORY``), also before it registers, when ``scontrol`` may hang (mej/nhc#159):
with no critical problem and no drain of its own recorded, the check has nothing to ask.  The
record is one JSON object, ``{"drained": {NODE: REASON}}``: each node the check drained with
the reason it set.  It lives in the agent's ``StateDirectory=`` (``/var/lib/gpuagent``, made by
systemd, or here when the agent never ran under its unit); root reads it without following
a link and replaces it atomically, mode 0644 (:mod:`gpuagent.edges.safefile`).

A record that claims more than the truth costs one question to slurmctld; one that claims
less would leave gpuagent's drain in place for ever.  So a missing or damaged file means "ask",
a drain is recorded before its ``scontrol update`` and forgotten only after the resume, and a
record that cannot be written is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping

from gpuagent import state
from gpuagent.edges import safefile

__all__ = ["LIMIT", "PATH", "read", "write"]

PATH = "/var/lib/gpuagent/slurm-drains.json"
# A few nodes' names and reasons; anything bigger is not this file.
LIMIT = 64 * 1024


def read(path: str) -> tuple[dict[str, str] | None, str]:
    """The recorded drains (node -> reason) in ``path``, or None and why not (``""``: there
    is no record yet)."""
    try:
        raw = safefile.load_json(path, LIMIT)
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError) as e:
        return None, f"{path}: cannot read the record of its drains: {state.why(e)}"
    drained = raw.get("drained") if isinstance(raw, dict) else None
    if not isinstance(drained, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in drained.items()
    ):
        return None, f'{path}: not a record of drains: no "drained" object of node names'
    return dict(drained), ""


def write(path: str, drained: Mapping[str, str]) -> str:
    """Replace ``path`` with ``drained`` (node -> reason); ``""``, else why it failed (the file
    is then removed where it can be, so that the next check asks slurmctld)."""
    data = json.dumps({"drained": dict(drained)}, sort_keys=True).encode()
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        safefile.write_atomic(path, data, mode=0o644)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return f"{path}: cannot record its drains: {state.why(e)}"
    return ""
