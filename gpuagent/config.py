"""Configuration: :class:`Config`, its cross-key rules, the TOML file and its drop-ins.

Each key is declared once, in :data:`gpuagent.configkeys.KEYS` (its checker, default and
doc); what holds across keys is a list of rules (:data:`RULES`, :data:`WARNING_RULES`).

The file ``PATH`` is read first, then each drop-in ``PATH.d/*.toml`` in lexical order, a later
key overriding an earlier one: edits go into drop-ins, so that the shipped file stays as
shipped and an upgrade never asks about it.  Every error is a :class:`ConfigError` whose
message is one line naming the file (the main one or a drop-in), the key and what was
expected; a run by hand exits 78 (EX_CONFIG) on it, the service runs on what can be used
(the agent problem ``config``), and a reload keeps the old configuration.  :func:`salvage` is
for what must work whatever the files say (``status``, ``detect``, ``link-textfile``, the
service's start): it keeps what can be used.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from gpuagent.compat import tomllib
from gpuagent.configkeys import KEYS, MIN_INTERVAL, ConfigError, Override, check_key

__all__ = [
    "DEFAULT_PATH",
    "EX_CONFIG",
    "MIN_INTERVAL",
    "RULES",
    "WARNING_RULES",
    "Config",
    "ConfigError",
    "Reading",
    "config_path",
    "dropin_dir",
    "dropins",
    "load",
    "load_sources",
    "located_warnings",
    "read",
    "salvage",
    "warnings",
    "with_interval",
]

DEFAULT_PATH = "/etc/gpuagent/gpuagent.toml"
EX_CONFIG = 78

_DEFAULTS = {k.name: k.default for k in KEYS}


def _default(name: str) -> Any:
    """Config's default of key ``name``, from :data:`gpuagent.configkeys.KEYS`; a table
    read-only, for every Config shares it."""
    default = _DEFAULTS[name]
    return MappingProxyType(default) if isinstance(default, dict) else default


# Config and Reading are NamedTuples, as configkeys' Key: a dataclass needs the dataclasses
# module, which imports inspect, a sixth of ``gpuagent status``'s start.
class Config(NamedTuple):
    """The agent's settings, one per entry of :data:`gpuagent.configkeys.KEYS` (its check,
    default and doc) in its order; durations are in seconds."""

    interval: float = _default("interval")
    probe_timeout: float = _default("probe_timeout")
    backoff_after: int = _default("backoff_after")
    retry_max: float = _default("retry_max")
    nvidia_smi: str = _default("nvidia_smi")
    sysfs_root: str = _default("sysfs_root")
    state_file: str = _default("state_file")
    load_driver: bool = _default("load_driver")
    log_level: str = _default("log_level")
    textfile: str = _default("textfile")
    journal_directory: str = _default("journal_directory")
    expected_gpus: int | None = _default("expected_gpus")
    driver_absent_grace: float = _default("driver_absent_grace")
    driver_hung_after: float = _default("driver_hung_after")
    nvml_library: str = _default("nvml_library")
    xid_warning_hold: float = _default("xid_warning_hold")
    history_days: int = _default("history_days")
    recurrence_boots: int = _default("recurrence_boots")
    throttle_fraction: float = _default("throttle_fraction")
    throttle_window: float = _default("throttle_window")
    xid: Mapping[int, Override] = _default("xid")
    nvlink_interval: float | None = _default("nvlink_interval")
    nvlink_window: float = _default("nvlink_window")
    nvlink_recovery_budget: int = _default("nvlink_recovery_budget")
    nvlink_replay_budget: int = _default("nvlink_replay_budget")
    processes_interval: float | None = _default("processes_interval")
    proc_root: str = _default("proc_root")
    vgpu_interval: float = _default("vgpu_interval")
    imex_interval: float = _default("imex_interval")
    evidence_max_bundles: int = _default("evidence_max_bundles")
    evidence_max_bytes: int = _default("evidence_max_bytes")
    evidence_per_hour: int = _default("evidence_per_hour")
    evidence_report_timeout: float = _default("evidence_report_timeout")
    drain: str = _default("drain")
    sampler: str = _default("sampler")


class _Refused(Exception):
    """A cross-key rule's refusal of ``key``, one the files set: ``why``, in words."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(key, why)
        self.key = key
        self.why = why


# A cross-key rule: the settings and the keys the files set -> the settings as the rule leaves
# them (a default derived from another key); raises _Refused, naming one of those keys.
Rule = Callable[[Config, Collection[str]], Config]


def _nvlink_at_least_a_tick(cfg: Config, given: Collection[str]) -> Config:
    """nvlink_interval at least one interval: rounded up to whole ticks, less would read
    every tick, not as often as asked.  The default is not checked: a long interval alone
    reads NVLink every tick."""
    given_interval = cfg.nvlink_interval if "nvlink_interval" in given else None
    if given_interval is not None and given_interval < cfg.interval:
        raise _Refused(
            "nvlink_interval",
            f"expected at least one tick (interval {cfg.interval:g} s), got {given_interval:g}",
        )
    return cfg


def _probe_timeout_within_interval(cfg: Config, given: Collection[str]) -> Config:
    """Without a probe_timeout of its own, the default one capped by the interval
    (:func:`with_interval`)."""
    return cfg if "probe_timeout" in given else with_interval(cfg, cfg.interval)


# The cross-key rules, in the order they apply.
RULES: tuple[Rule, ...] = (_nvlink_at_least_a_tick, _probe_timeout_within_interval)


def _timeout_below_interval(cfg: Config) -> tuple[tuple[str, ...], str] | None:
    """A probe timeout at or above the interval: the agent still works, but a hung nvidia-smi
    stretches its tick to the timeout (grid points are skipped and samples turn stale
    meanwhile).  Some want exactly that: a short interval, and patience with a driver that
    answers slowly."""
    if cfg.probe_timeout < cfg.interval:
        return None
    return ("probe_timeout", "interval"), (
        f"probe_timeout ({cfg.probe_timeout:g} s) is not below interval "
        f"({cfg.interval:g} s): a hung nvidia-smi stretches a tick to {cfg.probe_timeout:g} s"
    )


# The cross-key rules that only warn: the settings -> the keys the warning is about (the one
# to change first) and one line, or None.
WARNING_RULES: tuple[Callable[[Config], tuple[tuple[str, ...], str] | None], ...] = (
    _timeout_below_interval,
)


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
    return _listing(path)[0]


def _listing(path: str) -> tuple[list[str], list[str]]:
    """The drop-ins of ``path`` (:func:`dropins`), and the other names in ``PATH.d`` that do
    not start with a dot (``60-x.conf``, ``x.toml.dpkg-dist``), sorted: not read.  A name
    with a dot first is hidden on purpose (an editor's swap file, say)."""
    directory = dropin_dir(path)
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    except OSError as e:
        raise ConfigError(f"{directory}: cannot list the drop-ins: {e.strerror or e}") from None
    visible = sorted(n for n in names if not n.startswith("."))
    chosen = [os.path.join(directory, n) for n in visible if n.endswith(".toml")]
    others = [os.path.join(directory, n) for n in visible if not n.endswith(".toml")]
    return chosen, others


class Reading(NamedTuple):
    """What the files of one configuration make, whatever they say: ``config``, the
    settings of every valid key (of each file that parses as TOML; a key a cross-key rule
    refuses left out); ``sources``, for each of those keys, the file that set it last;
    ``files``, the files read, in order; ``ignored``, the names in the drop-in directory
    that are not read (:func:`_listing`); ``errors``, every error, in reading order (each
    file's, then the cross-key rules')."""

    config: Config
    sources: dict[str, str]
    files: tuple[str, ...]
    ignored: tuple[str, ...]
    errors: tuple[ConfigError, ...]


def _parse_dropin(dropin: str) -> dict[str, Any] | None:
    """The drop-in ``dropin``'s table, ``None`` if it is gone since it was listed (an edit in
    progress, not an error).  Raises :class:`ConfigError` for a bad file or a dangling link."""
    raw = _parse(dropin, required=False)
    # A link whose target is missing is a mistake that would silently drop its settings.
    if raw is None and os.path.islink(dropin):
        raise ConfigError(f"{dropin}: a dangling symlink (to {_link_text(dropin)})")
    return raw


def read(path: str, *, required: bool) -> Reading:
    """Read ``path`` and its drop-ins to the end, an error in one file no reason to stop:
    a :class:`Reading`.  Never raises :class:`ConfigError` (each is in ``errors``)."""
    errors: list[ConfigError] = []
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    files: list[str] = []

    def take(source: str, raw: dict[str, Any] | None) -> None:
        if raw is None:
            return
        files.append(source)
        for key, value in raw.items():
            try:
                values[key] = check_key(source, key, value)
            except ConfigError as e:
                errors.append(e)
                continue
            sources[key] = source

    try:
        take(path, _parse(path, required=required))
    except ConfigError as e:
        errors.append(e)
    try:
        chosen, ignored = _listing(path)
    except ConfigError as e:
        errors.append(e)
        chosen, ignored = [], []
    for dropin in chosen:
        try:
            take(dropin, _parse_dropin(dropin))
        except ConfigError as e:
            errors.append(e)
    cfg, refusals = _salvaged(values, sources, path)
    return Reading(cfg, sources, tuple(files), tuple(ignored), (*errors, *refusals))


def load(path: str, *, required: bool) -> Config:
    """Read and validate ``path`` and its drop-ins.

    Raises :class:`ConfigError` for an unreadable or invalid file, and for a missing main
    file when ``required``; a missing optional one gives the defaults (and the drop-ins).
    """
    return load_sources(path, required=required)[0]


def load_sources(path: str, *, required: bool) -> tuple[Config, dict[str, str]]:
    """Like :func:`load`; also returns, for each key set, the file that set it last.  The
    error raised is the first of :func:`read`'s."""
    reading = read(path, required=required)
    if reading.errors:
        raise reading.errors[0]
    return reading.config, reading.sources


def salvage(path: str, *, required: bool) -> tuple[Config, ConfigError | None]:
    """Like :func:`load`, but never raises: a bad file gives its (first) error and the
    settings that can still be used (:attr:`Reading.config`).

    A typo elsewhere in a file must not make ``gpuagent status`` lose the agent's state
    file, nor leave node_exporter a dangling link.
    """
    reading = read(path, required=required)
    return reading.config, (reading.errors[0] if reading.errors else None)


def _salvaged(
    values: dict[str, Any], sources: dict[str, str], path: str
) -> tuple[Config, list[ConfigError]]:
    """The settings ``values`` make, less each key a cross-key rule refuses (and its entry
    in ``sources``): without it, the rest still holds; and an error for each refusal,
    naming the file that set the key (``path`` for a key ``sources`` lacks).  Each refusal
    drops one key the files set: this ends."""
    refusals: list[ConfigError] = []
    while True:
        try:
            return _settings(values), refusals
        except _Refused as refused:
            where = f"{sources.pop(refused.key, path)}: {refused.key}"
            refusals.append(ConfigError(f"{where}: {refused.why}"))
            values = {k: v for k, v in values.items() if k != refused.key}


def _link_text(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "a target gone"


def with_interval(cfg: Config, interval: float) -> Config:
    """``cfg`` ticking every ``interval`` s (``run --interval``), its probe timeout capped at
    :data:`TIMEOUT_FRACTION` of it."""
    timeout = min(cfg.probe_timeout, round(TIMEOUT_FRACTION * interval, 3))
    return cfg._replace(interval=interval, probe_timeout=timeout)


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
        # Typed here: where mypy checks the Python 3.10 branch without tomli installed, the
        # module is Any (pyproject's overrides).
        table: dict[str, Any] = tomllib.loads(data.decode("utf-8"))
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
    # TOMLDecodeError is a ValueError; so is an integer of more than 4300 digits.
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {str(e)[:200]}") from None
    return table


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
    return _config(_validate(raw, source=source), {}, source)


def _validate(raw: dict[str, Any], *, source: str) -> dict[str, Any]:
    """Each key of file ``source``'s table ``raw`` checked (in the file's order)."""
    return {key: check_key(source, key, value) for key, value in raw.items()}


def _settings(values: Mapping[str, Any]) -> Config:
    """The defaults with ``values`` (checked, by key), after :data:`RULES`; raises
    :class:`_Refused`."""
    cfg = Config()._replace(**values)
    for rule in RULES:
        cfg = rule(cfg, values.keys())
    return cfg


def _config(values: Mapping[str, Any], sources: Mapping[str, str], path: str) -> Config:
    """:func:`_settings`; a refusal is a :class:`ConfigError` naming the file that set the
    key (``sources``, by key; ``path`` for a key it lacks)."""
    try:
        return _settings(values)
    except _Refused as refused:
        where = f"{sources.get(refused.key, path)}: {refused.key}"
        raise ConfigError(f"{where}: {refused.why}") from None


def warnings(cfg: Config) -> list[str]:
    """What works but is likely not meant (:data:`WARNING_RULES`), one line each."""
    return [found[1] for rule in WARNING_RULES if (found := rule(cfg)) is not None]


def located_warnings(cfg: Config, sources: Mapping[str, str], path: str) -> list[str]:
    """:func:`warnings`, each line led by the file that set its first key and naming the
    file of any other key set elsewhere (``sources``, by key; ``path`` for a default)."""
    lines = []
    for rule in WARNING_RULES:
        found = rule(cfg)
        if found is None:
            continue
        (first, *others), line = found
        where = sources.get(first, path)
        also = [f"{k} set in {sources[k]}" for k in others if sources.get(k, where) != where]
        lines.append(f"{where}: {line}" + (f" ({'; '.join(also)})" if also else ""))
    return lines
