"""What ``gpuagent run`` makes of its configuration, at start and on every reload: which
Prometheus textfile it writes, and a lock on it, so that two agents never write one textfile.

The service — started by systemd, which sets ``$NOTIFY_SOCKET`` or ``$INVOCATION_ID`` — with
the packaged unit's ``RuntimeDirectory=gpuagent`` writes its metrics to
``/run/gpuagent/gpuagent.prom`` whenever ``textfile`` is set: the unit links ``textfile`` to
that file (``gpuagent link-textfile``), and its sandbox could not write node_exporter's
directory anyway.  So a node_exporter installed while the agent runs brings no error: its
directory appears, the agent goes on writing its own file, and the package's trigger links it.

A run by hand writes a textfile only where its configuration names one.  The default path is
the service's link: followed, it would overwrite the service's metrics and remove them when
the hand run exits.

A run's first line names the files it read (:func:`files_line`): a hand run with ``--config
FILE`` reads ``FILE.d``, not the service's drop-ins, and the line shows it.

The service starts on a bad file all the same, on the settings :func:`config.read` can use of
it (those ``gpuagent status`` reads: the state file it looks for is the one written), with
the errors as the agent problem ``config`` (:func:`config_problem`): a typo and a restart
must not turn monitoring off.  A run by hand refuses the file; so does every reload.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from gpuagent import config
from gpuagent.edges import textlink
from gpuagent.edges.lock import StateLock
from gpuagent.logs import EventLog

__all__ = [
    "RunConfig",
    "config_problem",
    "files_line",
    "is_service",
    "state_dir_problem",
    "textfile_for",
]

SERVICE_DIR = os.path.dirname(textlink.RUN_FILE)


def is_service(env: Mapping[str, str]) -> bool:
    """Whether systemd started this process (as a service, or with ``systemd-run``)."""
    return bool(env.get("NOTIFY_SOCKET") or env.get("INVOCATION_ID"))


def textfile_for(
    cfg: config.Config, sources: Mapping[str, str], env: Mapping[str, str]
) -> tuple[str, str | None]:
    """The textfile this run writes (``""``: none), and the line that says why it differs
    from ``cfg.textfile`` where an operator would want to know (or None)."""
    if not cfg.textfile:
        return "", None
    if is_service(env):
        if SERVICE_DIR not in env.get("RUNTIME_DIRECTORY", "").split(":"):
            return cfg.textfile, None
        if not os.path.isdir(os.path.dirname(cfg.textfile)):
            return textlink.RUN_FILE, (
                f"Prometheus metrics go to {textlink.RUN_FILE}; {cfg.textfile} is linked to it "
                f"once {os.path.dirname(cfg.textfile)} exists (is prometheus-node-exporter "
                "installed?)"
            )
        return textlink.RUN_FILE, None
    if "textfile" in sources:
        return cfg.textfile, None
    return "", (
        f"not started by systemd, and no textfile set: writing no Prometheus metrics "
        f"({cfg.textfile} is the service's; set textfile to write some)"
    )


def files_line(path: str, reading: config.Reading, service_dropins: Sequence[str]) -> str:
    """The line a run starts with: the files of config file ``path`` that ``reading`` read,
    in order, and what it did not read — ``path`` where it is missing, the drop-ins where
    there are none, the names in ``PATH.d`` that do not end in ``.toml``, and the service's
    drop-ins ``service_dropins`` where the run reads other files (``--config FILE``)."""
    if reading.files:
        line = f"configuration read from {', '.join(reading.files)}"
    else:
        line = "configuration: the defaults"
    if path not in reading.files:
        line += f"; {path}: no such file"
    if all(name == path for name in reading.files):
        line += f"; no drop-ins in {config.dropin_dir(path)}"
    if reading.ignored:
        line += f"; not read (a drop-in's name must end in .toml): {', '.join(reading.ignored)}"
    if service_dropins:
        n = len(service_dropins)
        line += (
            f"; not the service's {n} drop-in{'s' if n > 1 else ''} in "
            f"{os.path.dirname(service_dropins[0])}"
        )
    return line


def config_problem(errors: Sequence[config.ConfigError]) -> str | None:
    """The agent problem ``config`` of a run on a bad file's valid settings: the first error
    (its file and key) and how many more; None without errors."""
    if not errors:
        return None
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return (
        f"{errors[0]}{more}; running on the valid settings: fix the file, "
        "`gpuagent check-config`, then reload"
    )


def state_dir_problem(cfg: config.Config, env: Mapping[str, str]) -> str | None:
    """Why a run by hand cannot keep its state file, or None."""
    directory = os.path.dirname(cfg.state_file)
    if is_service(env) or os.path.isdir(directory):
        return None
    if cfg.state_file == config.Config().state_file:
        return (
            f"{directory}, the service's state directory, is not there (systemd makes it "
            "while gpuagent.service runs): start the service, or run by hand with "
            '--config FILE, FILE setting another state_file (state_file = "/tmp/gpuagent/'
            'state.json", say)'
        )
    return f"state_file {cfg.state_file}: {directory} does not exist"


def _service_dropins(path: str) -> list[str]:
    """The packaged service's drop-ins where ``path`` is another file, else none."""
    if os.path.realpath(path) == os.path.realpath(config.DEFAULT_PATH):
        return []
    try:
        return config.dropins(config.DEFAULT_PATH)
    except config.ConfigError:
        return []


class RunConfig:
    """Loads the configuration for ``gpuagent run``: :func:`config.read` (its first error
    raised), with the
    textfile of :func:`textfile_for`, and holds that textfile's lock (``TEXTFILE.lock`` beside
    the file the path resolves to).  The daemon calls it again on each reload.
    """

    def __init__(self, log: EventLog, env: Mapping[str, str] | None = None) -> None:
        self.log = log
        self.env = os.environ if env is None else env
        self.lock = StateLock()
        self._said: str | None = None
        # What the last resolve read, for the run's first line (:func:`files_line`).
        self.files = ""
        # The errors of the files the last resolve ran on the valid settings of (``salvage``).
        self.errors: tuple[config.ConfigError, ...] = ()

    def __call__(self, path: str, required: bool) -> config.Config:
        """Load, lock and say what differs; raises :class:`config.ConfigError`, and
        :class:`~gpuagent.edges.lock.AlreadyRunning` when another agent writes the same textfile
        (then the lock held so far is kept)."""
        cfg, note = self.resolve(path, required)
        self.lock_textfile(cfg)
        self.say(note)
        return cfg

    def resolve(
        self, path: str, required: bool, *, salvage: bool = False
    ) -> tuple[config.Config, str | None]:
        """The configuration this run uses, and what to say about it (nothing locked); sets
        :attr:`files` and :attr:`errors`.  A bad file raises its first error, unless
        ``salvage`` (the service's start): then its valid settings are used."""
        reading = config.read(path, required=required)
        self.files = files_line(path, reading, _service_dropins(path))
        if reading.errors and not salvage:
            raise reading.errors[0]
        self.errors = reading.errors
        cfg, sources = reading.config, reading.sources
        textfile, note = textfile_for(cfg, sources, self.env)
        return cfg._replace(textfile=textfile), note

    def lock_textfile(self, cfg: config.Config) -> None:
        """Hold the lock of ``cfg.textfile`` (none for ``""``); raises AlreadyRunning."""
        if cfg.textfile:
            # A lock that cannot be made (no directory, not ours to write) protects nothing:
            # the textfile cannot be written there either.
            self.lock.acquire(os.path.realpath(cfg.textfile))
        else:
            self.lock.release()

    def say(self, note: str | None) -> None:
        """Log ``note`` unless it was the last one said."""
        if note is not None and note != self._said:
            self.log(logging.INFO, None, note)
        self._said = note
