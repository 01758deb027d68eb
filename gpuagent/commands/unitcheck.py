"""What ``gpuagent check-config`` says about a configuration: every error of every file (as
:func:`gpuagent.config.read` finds them), the names in the drop-in directory it does not read,
what works but is likely not meant, and what the packaged service could not use, though the
root running the check can.

The service runs as the system user ``gpuagent``: other users' rights, plus the supplementary groups
``video`` and ``systemd-journal`` of its unit.  A config file or drop-in of the service's own
that this user may not read is an error (exit 78): the service would not start, or not
reload.  For any other path it is a warning, as are a ``state_file`` outside
``/run/gpuagent``, a ``textfile`` whose directory does not exist and a ``journal_directory``
the user may not read: the agent runs on without them.  Only mode bits are read (no ACLs).
"""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Mapping

from gpuagent import config
from gpuagent.commands.runconfig import is_service
from gpuagent.sources.probe.probe import lookup

__all__ = ["GROUPS", "check", "unreadable"]

# systemd's PATH for a system service (the unit sets none): where the agent looks for a
# bare nvidia_smi name.
_SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
# The unit's SupplementaryGroups=.
GROUPS = ("video", "systemd-journal")
_FIX = "chmod o+r, or group video"


def _gids() -> set[int]:
    out = set()
    for name in GROUPS:
        try:
            out.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            continue
    return out


def _allowed(st: os.stat_result, bits: int, gids: set[int]) -> bool:
    """Whether the service's user has ``bits`` (of r=4, w=2, x=1) on a file of ``st``."""
    if st.st_gid in gids and (st.st_mode >> 3) & bits == bits:
        return True
    return st.st_mode & bits == bits


def unreadable(path: str, gids: set[int] | None = None) -> str | None:
    """Why the service's user could not read ``path`` (list it, for a directory), or None;
    a path that does not exist is None (that is another check's)."""
    gids = _gids() if gids is None else gids
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return None
    parent = os.path.dirname(real)
    while True:
        try:
            up = os.stat(parent)
        except OSError:
            return None
        if not _allowed(up, 1, gids):
            return f"its directory {parent} is not searchable by other users"
        if parent == "/":
            break
        parent = os.path.dirname(parent)
    need = 5 if stat.S_ISDIR(st.st_mode) else 4
    if not _allowed(st, need, gids):
        return f"other users may not read it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check(
    path: str, reading: config.Reading, env: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """Errors and warnings about ``path`` with its drop-ins, as ``reading`` found them, one
    line each, each naming the file that set the key it is about (or the path it is about):
    every error of every file, a name in the drop-in directory that is not read, what works
    but is likely not meant, and what the packaged service could not do."""
    env = os.environ if env is None else env
    errors = [str(e) for e in reading.errors]
    warnings = [
        f"{name}: ignored, not read: a drop-in's name must end in .toml" for name in reading.ignored
    ]
    warnings += config.located_warnings(reading.config, reading.sources, path)
    service_errors, service_warnings = _service(path, reading, env)
    return errors + service_errors, warnings + service_warnings


def _service(
    path: str, reading: config.Reading, env: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """What the packaged service could not do with ``path``'s files and ``reading``'s
    settings: errors and warnings, one line each."""
    cfg = reading.config

    def where(key: str) -> str:
        return reading.sources.get(key, path)

    own = is_service(env) or os.path.realpath(path) == os.path.realpath(config.DEFAULT_PATH)
    gids = _gids()
    errors: list[str] = []
    warnings: list[str] = []
    dropins = [name for name in reading.files if name != path]
    for name in [path, config.dropin_dir(path), *dropins]:
        why = unreadable(name, gids)
        if why is None:
            continue
        if own:
            errors.append(
                f"{name}: {why}, and the packaged service (user gpuagent) is one: it would "
                f"fail to start or reload ({_FIX})"
            )
        else:
            warnings.append(
                f"{name}: {why}, and the packaged service (user gpuagent) is one: it would "
                f"fail to start or reload on it ({_FIX})"
            )
    if not cfg.state_file.startswith("/run/gpuagent/"):
        warnings.append(
            f"{where('state_file')}: state_file {cfg.state_file!r} is outside /run/gpuagent, "
            "where alone the packaged service may write: it could not keep a state there for "
            "gpuagent status"
        )
    textdir = os.path.dirname(cfg.textfile)
    if cfg.textfile and cfg.textfile != config.Config().textfile and not os.path.isdir(textdir):
        # The default's directory is missing where node_exporter is not installed: no news.
        warnings.append(
            f"{where('textfile')}: textfile {cfg.textfile}: its directory {textdir} does not "
            "exist: no Prometheus metrics there until it does"
        )
    if "nvidia_smi" in reading.sources:
        found = lookup(cfg.nvidia_smi, _SERVICE_PATH)
        if found is None or not os.access(found, os.X_OK):
            said = "is not found" if found is None else f"({found}) is not executable"
            where_ = "" if "/" in cfg.nvidia_smi else f" in the service's PATH ({_SERVICE_PATH})"
            warnings.append(
                f"{where('nvidia_smi')}: nvidia_smi {cfg.nvidia_smi!r} {said}{where_}: the "
                "agent would report nvidia_smi_missing, or fail to run it, while GPUs are on "
                "the bus"
            )
    if cfg.journal_directory:
        why = unreadable(cfg.journal_directory, gids)
        if why is None and not os.path.isdir(cfg.journal_directory):
            why = "it is not a directory"
        if why is not None:
            warnings.append(
                f"{where('journal_directory')}: journal_directory {cfg.journal_directory}: "
                f"{why}: the service would read no Xid records there (the unit's groups: "
                "video, systemd-journal)"
            )
    return errors, warnings
