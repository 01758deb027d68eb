"""The ``gpuagent`` command's entry point: ``gpuagent [--config PATH] status [--json]
[--wide]`` runs without click (:func:`quick`), every other command line goes to the CLI
(:mod:`gpuagent.commands.cli`).

click is a third of ``gpuagent status``'s start (docs/performance.md, section 3), which
monitoring runs every few seconds on every host.  Only a command line whose every word is
known here is taken; anything else (help, another option's spelling, a shell completion, a
usage error) is click's, so that what click says and exits with stays its own."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO, cast

__all__ = ["main", "quick"]

_FLAGS = {"--json": "as_json", "--wide": "wide"}


def quick(
    args: Sequence[str], environ: Mapping[str, str]
) -> tuple[str | None, dict[str, bool]] | None:
    """The explicit ``--config`` path (or None) and the status flags of command line
    ``args``, or None where click must read it: a word not known here, a repeated flag, an
    option's value that looks like an option, or click's shell completion asked for."""
    if any(name.startswith("_") and name.endswith("_COMPLETE") for name in environ):
        return None
    explicit = None
    if len(args) >= 2 and args[0] == "--config":
        explicit = args[1]
        if not explicit or explicit.startswith("-"):
            return None
        args = args[2:]
    if not args or args[0] != "status":
        return None
    flags = dict.fromkeys(_FLAGS.values(), False)
    for word in args[1:]:
        name = _FLAGS.get(word)
        if name is None or flags[name]:
            return None
        flags[name] = True
    return explicit, flags


def main() -> None:
    """``gpuagent``: the status command alone where :func:`quick` reads its line, else the
    CLI."""
    parsed = quick(sys.argv[1:], os.environ)
    if parsed is None:
        from gpuagent.commands.cli import main as cli  # noqa: PLC0415

        cli()
        return
    from gpuagent import config  # noqa: PLC0415
    from gpuagent.commands.statuscmd import show  # noqa: PLC0415

    explicit, flags = parsed
    # What click's standalone mode does on an interrupt and on a closed pipe, as the CLI would.
    try:
        show(config.config_path(explicit), **flags)
    except (EOFError, KeyboardInterrupt):
        print(file=sys.stderr)
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
        from click.utils import PacifyFlushWrapper  # noqa: PLC0415

        sys.stdout = cast(TextIO, PacifyFlushWrapper(sys.stdout))
        sys.stderr = cast(TextIO, PacifyFlushWrapper(sys.stderr))
        sys.exit(1)
