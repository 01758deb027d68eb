"""Configuration: the TOML file and its drop-ins, their defaults and validation.

The file ``PATH`` is read first, then each drop-in ``PATH.d/*.toml`` in lexical order, a later
key overriding an earlier one: edits go into drop-ins, so that the shipped file stays as
shipped and an upgrade never asks about it.  Every error is a :class:`ConfigError` whose
message is one line naming the file (the main one or a drop-in), the key and what was
expected; the daemon exits 78 (EX_CONFIG) on it at start and keeps its old configuration on
it at reload.  :func:`salvage` is for the commands that must work whatever the files say
(``status``, ``detect``, ``link-textfile``): it keeps what can be used.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpuagent.configkeys import MIN_INTERVAL, ConfigError, check_key
from gpuagent.sources.kernel.xidcatalog import Override

__all__ = [
    "DEFAULT_PATH",
    "EX_CONFIG",
    "MIN_INTERVAL",
    "Config",
    "ConfigError",
    "config_path",
    "dropin_dir",
    "dropins",
    "load",
    "load_sources",
    "salvage",
    "warnings",
    "with_interval",
]

DEFAULT_PATH = "/etc/gpuagent/gpuagent.toml"
EX_CONFIG = 78


@dataclass(frozen=True)
class Config:
    """The agent's settings; durations are in seconds."""

    interval: float = 10.0
    probe_timeout: float = 8.0
    backoff_after: int = 3
    retry_max: float = 60.0
    nvidia_smi: str = "nvidia-smi"
    sysfs_root: str = "/sys"
    state_file: str = "/run/gpuagent/state.json"
    load_driver: bool = False
    log_level: str = "info"
    # Prometheus metrics for node_exporter's textfile collector; "" disables them.
    textfile: str = "/var/lib/prometheus/node-exporter/gpuagent.prom"
    # Where the kernel's Xid records are read: "" is the local system journal, a path a
    # directory of journal files.
    journal_directory: str = ""

    # NVIDIA GPUs this host should have on its PCI bus; fewer is a gpu_count problem.  Unset
    # (None, the default): no check.
    expected_gpus: int | None = None
    # How long GPUs may wait for the nvidia module before it is a no_driver_module problem: a
    # driver upgrade unloads it for about 80 s.
    driver_absent_grace: float = 600.0
    # The NVML library whose file name carries the installed driver's version
    # (libnvidia-ml.so.1 -> libnvidia-ml.so.<version>): a name looked up in the system's
    # library directories, or an absolute path.
    nvml_library: str = "libnvidia-ml.so.1"
    # A warning-class Xid problem (a Nonfatal NVLink 145, an ECC 63) ends this long after
    # its last record.
    xid_warning_hold: float = 3600.0
    # Earlier boots read from the journal at start, for recurrence (days back), and in how
    # many of them the same critical problem must have hit a GPU to ask for its RMA.
    history_days: int = 30
    recurrence_boots: int = 2
    # A GPU is throttled when the hardware slows it down in at least this fraction of the
    # samples of the last throttle_window seconds.
    throttle_fraction: float = 0.1
    throttle_window: float = 600.0
    # The site's own severity and action of Xid codes ([xid] 94 = { severity = "none" }).
    xid: Mapping[int, Override] = field(default_factory=dict)

    # NVLink: links and error counters are read every nvlink_interval (rounded up to whole
    # ticks); a counter that rises within nvlink_window by more than its budget is a problem.
    nvlink_interval: float = 60.0
    nvlink_window: float = 600.0
    nvlink_recovery_budget: int = 0
    nvlink_replay_budget: int = 16

    # Who is on each GPU: nvidia-smi --query-compute-apps every processes_interval (rounded up
    # to whole ticks; None, the default, or less than a tick: every tick).
    processes_interval: float | None = None
    # Where their names are read: <proc_root>/<pid>/comm.
    proc_root: str = "/proc"


# A config file is a few hundred bytes; this keeps /dev/zero-like mistakes from eating memory.
_MAX_SIZE = 64 * 1024
# Without a probe_timeout of its own, a short interval gets this fraction of it: a probe must
# end before the next tick is due, or ticks are skipped and every sample turns stale.
TIMEOUT_FRACTION = 0.8


def config_path(explicit: str | None) -> tuple[str, bool]:
    """Return the config path to read and whether it was asked for explicitly.

    ``--config`` wins over ``$GPUAGENT_CONFIG``, which wins over the default path.  Only the
    default path may be absent.
    """
    if explicit:
        return explicit, True
    env = os.environ.get("GPUAGENT_CONFIG")
    if env:
        return env, True
    return DEFAULT_PATH, False


def dropin_dir(path: str) -> str:
    """The drop-in directory of config file ``path``: ``PATH.d``."""
    return f"{path}.d"


def dropins(path: str) -> list[str]:
    """The drop-ins of config file ``path`` in the order they are read: the names in
    ``PATH.d`` that end in ``.toml`` and do not start with a dot, sorted.

    A missing directory has none; one that cannot be listed is a :class:`ConfigError`.
    """
    directory = dropin_dir(path)
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise ConfigError(f"{directory}: cannot list the drop-ins: {e.strerror or e}") from None
    chosen = sorted(n for n in names if n.endswith(".toml") and not n.startswith("."))
    return [os.path.join(directory, n) for n in chosen]


def load(path: str, *, required: bool) -> Config:
    """Read and validate ``path`` and its drop-ins.

    Raises :class:`ConfigError` for an unreadable or invalid file, and for a missing main
    file when ``required``; a missing optional one gives the defaults (and the drop-ins).
    """
    return load_sources(path, required=required)[0]


def load_sources(path: str, *, required: bool) -> tuple[Config, dict[str, str]]:
    """Like :func:`load`; also returns, for each key set, the file that set it last."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, raw in _layers(path, required=required):
        for key, value in _validate(raw, source=source).items():
            values[key] = value
            sources[key] = source
    return _config(values, sources.get("nvlink_interval", path)), sources


def salvage(path: str, *, required: bool) -> tuple[Config, ConfigError | None]:
    """Like :func:`load`, but never raises: a bad file gives its (first) error and the
    settings that can still be used — each valid key of each file that parses as TOML.

    A typo elsewhere in a file must not make ``gpuagent status`` lose the agent's state
    file, nor leave node_exporter a dangling link.
    """
    try:
        return load(path, required=required), None
    except ConfigError as e:
        error = e
    known = {f.name for f in fields(Config)}
    values: dict[str, Any] = {}
    sources_: dict[str, str] = {}
    try:
        files = [path, *dropins(path)]
    except ConfigError:
        files = [path]
    for i, source in enumerate(files):
        try:
            raw = _parse(source, required=required and i == 0) or {}
        except ConfigError:
            continue
        for key, value in raw.items():
            if key not in known:
                continue
            try:
                values[key] = check_key(source, key, value)
            except ConfigError:
                continue
            sources_[key] = source
    try:
        return _config(values, sources_.get("nvlink_interval", path)), error
    except ConfigError:
        # Only the NVLink cadence is checked across keys: without it, the rest still holds.
        values.pop("nvlink_interval", None)
        return _config(values, path), error


def _layers(path: str, *, required: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each file's TOML table in reading order, parsed as it comes (so that the first bad
    file is the one an error names); a missing optional main file is none."""
    raw = _parse(path, required=required)
    if raw is not None:
        yield path, raw
    for dropin in dropins(path):
        # Listed a moment ago: gone now is an edit in progress, not an error; a link whose
        # target is missing is a mistake that would silently drop the settings it points at.
        raw = _parse(dropin, required=False)
        if raw is not None:
            yield dropin, raw
        elif os.path.islink(dropin):
            raise ConfigError(f"{dropin}: a dangling symlink (to {_link_text(dropin)})")


def _link_text(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "a target gone"


def with_interval(cfg: Config, interval: float) -> Config:
    """``cfg`` ticking every ``interval`` s (``run --interval``), its probe timeout capped at
    :data:`TIMEOUT_FRACTION` of it."""
    timeout = min(cfg.probe_timeout, round(TIMEOUT_FRACTION * interval, 3))
    return replace(cfg, interval=interval, probe_timeout=timeout)


def _parse(path: str, *, required: bool) -> dict[str, Any] | None:
    """The file's TOML table, or None for a missing optional file; raises ConfigError."""
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{path}: no such file") from None
        return None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
    # TOMLDecodeError is a ValueError; so is an integer of more than 4300 digits.
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {str(e)[:200]}") from None


def _read_regular(path: str) -> bytes:
    # O_NONBLOCK: a FIFO must not hang the daemon (at start or on reload); it is refused below.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        data = os.read(fd, _MAX_SIZE + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_SIZE:
        raise OSError(f"larger than {_MAX_SIZE // 1024} KiB")
    return data


def from_mapping(raw: dict[str, Any], *, source: str) -> Config:
    """Validate a parsed TOML table into a :class:`Config`; raises :class:`ConfigError`."""
    return _config(_validate(raw, source=source), source)


def _validate(raw: dict[str, Any], *, source: str) -> dict[str, Any]:
    known = {f.name: f for f in fields(Config)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r} (known: {', '.join(known)})")
        values[key] = check_key(source, key, value)
    return values


def _config(values: dict[str, Any], source: str) -> Config:
    cfg = replace(Config(), **values)
    if "nvlink_interval" in values and cfg.nvlink_interval < cfg.interval:
        # Rounded up to whole ticks it would read every tick, not as often as asked: say so.
        # (The default is not checked: a long interval alone reads NVLink every tick.)
        raise ConfigError(
            f"{source}: nvlink_interval: expected at least one tick (interval "
            f"{cfg.interval:g} s), got {values['nvlink_interval']:g}"
        )
    return cfg if "probe_timeout" in values else with_interval(cfg, cfg.interval)


def warnings(cfg: Config) -> list[str]:
    """What works but is likely not meant, one line each.

    A probe timeout at or above the interval is a warning, not an error: the agent still
    works, but a hung nvidia-smi stretches its tick to the timeout (grid points are skipped
    and samples turn stale meanwhile).  Some want exactly that: a short interval, and patience
    with a driver that answers slowly.
    """
    if cfg.probe_timeout >= cfg.interval:
        return [
            f"probe_timeout ({cfg.probe_timeout:g} s) is not below interval "
            f"({cfg.interval:g} s): a hung nvidia-smi stretches a tick to {cfg.probe_timeout:g} s"
        ]
    return []
