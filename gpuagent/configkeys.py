"""One configuration key's value checked (pure): types, ranges, the ``[xid]`` table.

Every error is a :class:`ConfigError` whose message is one line naming the file, the key and
what was expected.
"""

from __future__ import annotations

from typing import Any

from gpuagent.health import ACTIONS
from gpuagent.sources.kernel.xidcatalog import OVERRIDE_SEVERITIES, Override

__all__ = ["LOG_LEVELS", "MIN_INTERVAL", "ConfigError", "check_key"]

LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    """A configuration file that cannot be used; ``str()`` is the one-line reason."""


_DURATIONS = {
    "interval",
    "probe_timeout",
    "retry_max",
    "driver_absent_grace",
    "xid_warning_hold",
    "throttle_window",
    "nvlink_interval",
    "nvlink_window",
    "processes_interval",
}
_BUDGETS = {"nvlink_recovery_budget", "nvlink_replay_budget"}
# A budget beyond this is no budget at all; it also keeps huge TOML integers out.
_MAX_BUDGET = 1_000_000_000
# Below a millisecond the loop would spend its time scheduling; a day is beyond any use.
_DURATION_RANGE = (0.001, 86400.0)
# Below a tenth of a second a tick is mostly the PCI scan and the state file: the agent would
# spend a core on bookkeeping, and an nvidia-smi call alone takes longer than that.
MIN_INTERVAL = 0.1


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_key(source: str, key: str, value: Any) -> Any:
    """``value`` of ``key`` read from ``source``, checked; raises :class:`ConfigError`."""
    where = f"{source}: {key}"
    if key in _DURATIONS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number of seconds, got {_show(value)}")
        low, high = _DURATION_RANGE
        if key == "interval":
            low = MIN_INTERVAL
        # A chained comparison is false for NaN and infinities, and safe for huge integers.
        if not low <= value <= high:
            why = " (shorter ticks would spend the CPU on bookkeeping)" if low > 0.01 else ""
            raise ConfigError(
                f"{where}: expected seconds between {low} and {high:g}, got {_show(value)}{why}"
            )
        return float(value)
    if key == "backoff_after":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
            raise ConfigError(f"{where}: expected an integer from 1 to 1000, got {_show(value)}")
        return value
    if key in _BUDGETS:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_BUDGET:
            raise ConfigError(
                f"{where}: expected an integer from 0 to {_MAX_BUDGET}, got {_show(value)}"
            )
        return value
    if key in ("history_days", "recurrence_boots"):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 3650:
            raise ConfigError(f"{where}: expected an integer from 1 to 3650, got {_show(value)}")
        return value
    if key == "expected_gpus":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1024:
            raise ConfigError(f"{where}: expected an integer from 0 to 1024, got {_show(value)}")
        return value
    if key == "throttle_fraction":
        # A chained comparison is false for NaN.
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise ConfigError(
                f"{where}: expected a fraction above 0 and at most 1, got {_show(value)}"
            )
        return float(value)
    if key == "xid":
        return _xid_table(where, value)
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
    if key == "journal_directory":
        if not isinstance(value, str) or "\0" in value or (value and not value.startswith("/")):
            raise ConfigError(
                f'{where}: expected an absolute path, or "" for the system journal, '
                f"got {_show(value)}"
            )
        return value
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(f"{where}: expected a non-empty string, got {_show(value)}")
    if key == "nvml_library" and "/" in value and not value.startswith("/"):
        raise ConfigError(
            f"{where}: expected a library name (libnvidia-ml.so.1) or an absolute path, "
            f"got {_show(value)}"
        )
    if key in {"sysfs_root", "proc_root", "state_file"} and not value.startswith("/"):
        raise ConfigError(f"{where}: expected an absolute path, got {_show(value)}")
    return value


# Xid codes are printed with up to six digits (gpuagent.sources.kernel.xid).
_MAX_XID = 999_999


def _xid_table(where: str, value: Any) -> dict[int, Override]:
    """``[xid]``: one inline table per code, ``94 = { severity = "none" }``."""
    if not isinstance(value, dict):
        raise ConfigError(
            f'{where}: expected a table of Xid codes ([xid] 94 = {{ severity = "none" }}), '
            f"got {_show(value)}"
        )
    out: dict[int, Override] = {}
    for code, entry in value.items():
        here = f"{where}.{code}"
        if not (code.isascii() and code.isdigit() and len(code) <= 6 and int(code) > 0):
            raise ConfigError(f"{where}: expected Xid codes (1 to {_MAX_XID}), got {_show(code)}")
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(
                f"{here}: expected an inline table of severity and action "
                f'({{ severity = "none" }}), got {_show(entry)}'
            )
        for name, setting in entry.items():
            allowed = {"severity": OVERRIDE_SEVERITIES, "action": ACTIONS}.get(name)
            if allowed is None:
                raise ConfigError(f"{here}: unknown key {name!r} (known: severity, action)")
            if setting not in allowed:
                raise ConfigError(
                    f"{here}.{name}: expected one of {', '.join(allowed)}, got {_show(setting)}"
                )
        out[int(code)] = Override(entry.get("severity"), entry.get("action"))
    return out
