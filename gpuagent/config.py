"""Configuration: the TOML file, its defaults and validation.

Every error is a :class:`ConfigError` whose message is one line naming the file, the key and
what was expected; the daemon exits 78 (EX_CONFIG) on it at start and keeps its old
configuration on it at reload.
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = ["DEFAULT_PATH", "EX_CONFIG", "Config", "ConfigError", "config_path", "load"]

DEFAULT_PATH = "/etc/gpuagent/gpuagent.toml"
EX_CONFIG = 78
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    """A configuration file that cannot be used; ``str()`` is the one-line reason."""


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
    # NVIDIA GPUs this host should have on its PCI bus; fewer is a gpu_count problem.  Unset
    # (None, the default): no check.
    expected_gpus: int | None = None


_DURATIONS = {"interval", "probe_timeout", "retry_max"}
# A config file is a few hundred bytes; this keeps /dev/zero-like mistakes from eating memory.
_MAX_SIZE = 64 * 1024
# Below a millisecond the loop would spend its time scheduling; a day is beyond any use.
_DURATION_RANGE = (0.001, 86400.0)


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


def load(path: str, *, required: bool) -> Config:
    """Read and validate ``path``.

    Raises :class:`ConfigError` for an unreadable or invalid file, and for a missing one when
    ``required``; a missing optional file gives the defaults.
    """
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{path}: no such file") from None
        return Config()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
    # TOMLDecodeError is a ValueError; so is an integer of more than 4300 digits.
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {str(e)[:200]}") from None
    return from_mapping(raw, source=path)


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
    known = {f.name: f for f in fields(Config)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r} (known: {', '.join(known)})")
        values[key] = _check(source, key, value)
    return replace(Config(), **values)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(source: str, key: str, value: Any) -> Any:
    where = f"{source}: {key}"
    if key in _DURATIONS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number of seconds, got {_show(value)}")
        low, high = _DURATION_RANGE
        # A chained comparison is false for NaN and infinities, and safe for huge integers.
        if not low <= value <= high:
            raise ConfigError(
                f"{where}: expected seconds between {low} and {high:g}, got {_show(value)}"
            )
        return float(value)
    if key == "backoff_after":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
            raise ConfigError(f"{where}: expected an integer from 1 to 1000, got {_show(value)}")
        return value
    if key == "expected_gpus":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1024:
            raise ConfigError(f"{where}: expected an integer from 0 to 1024, got {_show(value)}")
        return value
    if key == "load_driver":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_show(value)}")
        return value
    if key == "log_level":
        if value not in LOG_LEVELS:
            raise ConfigError(
                f"{where}: expected one of {', '.join(LOG_LEVELS)}, got {_show(value)}"
            )
        return value
    if key == "textfile":
        if (
            not isinstance(value, str)
            or "\0" in value
            or (value and not (value.startswith("/") and value.endswith(".prom")))
        ):
            raise ConfigError(
                f'{where}: expected an absolute path ending in .prom, or "" to disable, '
                f"got {_show(value)}"
            )
        return value
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(f"{where}: expected a non-empty string, got {_show(value)}")
    if key in {"sysfs_root", "state_file"} and not value.startswith("/"):
        raise ConfigError(f"{where}: expected an absolute path, got {_show(value)}")
    return value
