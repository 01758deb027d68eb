"""Every configuration key declared once (pure): :data:`KEYS`, one entry of name, checker,
default and doc per key, as systemd's ``ConfigTableItem`` tables; and the checkers.

A checker takes ``where`` (``"FILE: KEY"``) and the value a file gives the key, and returns
the setting (types, ranges, paths, the ``[xid]`` table) or raises a :class:`ConfigError`
whose message is one line starting with ``where`` and saying what was expected.
:class:`gpuagent.config.Config` takes its fields' defaults from :data:`KEYS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from gpuagent.health import ACTIONS, DRAIN_ASK, DRAIN_MODES, SEVERITIES

__all__ = [
    "KEYS",
    "LOG_LEVELS",
    "MAX_XID_COUNT",
    "MAX_XID_WINDOW",
    "MIN_INTERVAL",
    "OVERRIDE_SEVERITIES",
    "SAMPLERS",
    "Check",
    "ConfigError",
    "Key",
    "Override",
    "check_key",
]

LOG_LEVELS = ("debug", "info", "warning", "error")
# What a site's [xid] table may set a code's severity to: "none" counts the code without a
# problem (gpuagent.sources.kernel.xidcatalog.NONE), the others are health's severities.
OVERRIDE_SEVERITIES: tuple[str, ...] = ("none", *SEVERITIES)
# The most records an [xid] entry's count may ask for, and the longest window (s): a GPU's
# records of a code are held that many at most, and a burst spread over more than a week is
# a rate, not a burst.
MAX_XID_COUNT = 100
MAX_XID_WINDOW = 7 * 86400.0
# Below a tenth of a second a tick is mostly the PCI scan and the state file: the agent would
# spend a core on bookkeeping, and an nvidia-smi call alone takes longer than that.
MIN_INTERVAL = 0.1
# How the probe asks nvidia-smi: one run a tick, or one run in its own loop mode for many.
SAMPLERS = ("loop", "spawn")

# A checker: (where, value) -> the setting; raises ConfigError.
Check = Callable[[str, Any], Any]


class ConfigError(Exception):
    """A configuration file that cannot be used; ``str()`` is the one-line reason."""


# Key and Override are NamedTuples: a frozen dataclass execs its generated methods at import,
# a third of a millisecond each at every command's start (``gpuagent status`` included).
class Key(NamedTuple):
    """One configuration key: its ``name``, the ``check`` of the value a file gives it (from
    :mod:`gpuagent.configkeys`), its ``default`` and one line of ``doc``."""

    name: str
    check: Check
    default: Any
    doc: str


class Override(NamedTuple):
    """One code's entry in a site's ``[xid]`` table: the ``severity`` (one of
    :data:`OVERRIDE_SEVERITIES`) and the ``action`` (one of :data:`gpuagent.health.ACTIONS`)
    it gets instead of the catalog's, ``None`` where the table leaves it as it is.

    With ``repeats`` (the file's ``count``: 2 to :data:`MAX_XID_COUNT` records) and ``window``
    (seconds) both set, the entry applies to a GPU's code only once that many of its records
    fell within ``window`` s (:mod:`gpuagent.sources.kernel.xidwindow`); below that the
    catalog's meaning holds.  (``count`` would hide the tuple's method.)"""

    severity: str | None = None
    action: str | None = None
    repeats: int | None = None
    window: float | None = None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse(where: str, expected: str, value: Any, why: str = "") -> ConfigError:
    # A quoted number says it is a string: `got the string '8'`, not `got '8'`, which
    # reads as the number the key wants.
    got = f"the string {_show(value)}" if _numeric_text(value) else _show(value)
    return ConfigError(f"{where}: expected {expected}, got {got}{why}")


def _numeric_text(value: Any) -> bool:
    """Whether ``value`` is a string that spells a number (``"8"``, ``" 2.5"``)."""
    if not isinstance(value, str) or len(value) > 40:
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def _seconds(low: float = 0.001, high: float = 86400.0, why: str = "") -> Check:
    """A duration from ``low`` to ``high`` seconds, as a float; ``why`` says why not less.

    The default range: below a millisecond the loop would spend its time scheduling; a day
    is beyond any use.
    """
    because = f" ({why})" if why else ""

    def check(where: str, value: Any) -> float:
        if not _is_number(value):
            raise _refuse(where, "a number of seconds", value)
        # A chained comparison is false for NaN and infinities, and safe for huge integers.
        if not low <= value <= high:
            raise _refuse(where, f"seconds between {low} and {high:g}", value, because)
        return float(value)

    return check


def _integer(low: int, high: int) -> Check:
    """An integer from ``low`` to ``high`` (a bool is not one)."""

    def check(where: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _refuse(where, f"an integer from {low} to {high}", value)
        return value

    return check


def _fraction(where: str, value: Any) -> float:
    """A fraction above 0 and at most 1, as a float."""
    # A chained comparison is false for NaN.
    if not _is_number(value) or not 0 < value <= 1:
        raise _refuse(where, "a fraction above 0 and at most 1", value)
    return float(value)


def _boolean(where: str, value: Any) -> bool:
    """``true`` or ``false``."""
    if not isinstance(value, bool):
        raise _refuse(where, "true or false", value)
    return value


def _one_of(choices: tuple[str, ...]) -> Check:
    """One of the strings ``choices``."""

    def check(where: str, value: Any) -> str:
        if value not in choices:
            raise _refuse(where, f"one of {', '.join(choices)}", value)
        return str(value)

    return check


def _textfile_path(where: str, value: Any) -> str:
    """An absolute path ending in ``.prom``, or ``""``."""
    if (
        not isinstance(value, str)
        or "\0" in value
        or (value and not (value.startswith("/") and value.endswith(".prom")))
    ):
        raise _refuse(where, 'an absolute path ending in .prom, or "" to disable', value)
    return value


def _journal_path(where: str, value: Any) -> str:
    """An absolute path, or ``""`` (the system journal)."""
    if not isinstance(value, str) or "\0" in value or (value and not value.startswith("/")):
        raise _refuse(where, 'an absolute path, or "" for the system journal', value)
    return value


def _text(where: str, value: Any) -> str:
    """A non-empty string without a NUL."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise _refuse(where, "a non-empty string", value)
    return value


def _absolute_path(where: str, value: Any) -> str:
    """A :func:`_text` that starts with ``/``."""
    if not _text(where, value).startswith("/"):
        raise _refuse(where, "an absolute path", value)
    return str(value)


def _library(where: str, value: Any) -> str:
    """A :func:`_text` that is a library's file name or an absolute path."""
    if "/" in _text(where, value) and not value.startswith("/"):
        raise _refuse(where, "a library name (libnvidia-ml.so.1) or an absolute path", value)
    return str(value)


# Xid codes are printed with up to six digits (gpuagent.sources.kernel.xid).
_MAX_XID = 999_999


def _xid_table(where: str, value: Any) -> dict[int, Override]:
    """``[xid]``: one inline table per code, ``94 = { severity = "none" }``."""
    if not isinstance(value, dict):
        raise _refuse(where, 'a table of Xid codes ([xid] 94 = { severity = "none" })', value)
    out: dict[int, Override] = {}
    for code, entry in value.items():
        if not (code.isascii() and code.isdigit() and len(code) <= 6 and int(code) > 0):
            # A table key is a string whatever it spells: no "the string" here.
            raise ConfigError(f"{where}: expected Xid codes (1 to {_MAX_XID}), got {_show(code)}")
        out[int(code)] = _override(f"{where}.{code}", entry)
    return out


def _override(where: str, entry: Any) -> Override:
    """One code's inline table of ``[xid]``: severity and action, and with ``count`` its
    ``window`` (each needs the other, and a severity or action to escalate to)."""
    if not isinstance(entry, dict) or not entry:
        raise _refuse(
            where, 'an inline table of severity and action ({ severity = "none" })', entry
        )
    for name, setting in entry.items():
        check = _OVERRIDE_KEYS.get(name)
        if check is None:
            known = ", ".join(_OVERRIDE_KEYS)
            raise ConfigError(f"{where}: unknown key {name!r} (known: {known})")
        check(f"{where}.{name}", setting)
    burst = [name for name in ("count", "window") if name in entry]
    if len(burst) == 1:
        other = "window" if burst == ["count"] else "count"
        raise ConfigError(
            f"{where}.{burst[0]}: needs {other} too (3 within 600 s: count = 3, window = 600)"
        )
    if burst and "severity" not in entry and "action" not in entry:
        raise ConfigError(f"{where}: count and window need a severity or action to escalate to")
    window = entry.get("window")
    return Override(
        entry.get("severity"),
        entry.get("action"),
        entry.get("count"),
        None if window is None else float(window),
    )


# An [xid] entry's keys, in the order an error lists them.
_OVERRIDE_KEYS: dict[str, Check] = {
    "severity": _one_of(OVERRIDE_SEVERITIES),
    "action": _one_of(ACTIONS),
    "count": _integer(2, MAX_XID_COUNT),
    "window": _seconds(1, MAX_XID_WINDOW),
}


_SECONDS = _seconds()
# A budget beyond this is no budget at all; it also keeps huge TOML integers out.
_BUDGET = _integer(0, 1_000_000_000)
_YEARS = _integer(1, 3650)
_BOOKKEEPING = "shorter ticks would spend the CPU on bookkeeping"

# Every key, in Config's order (the order of the shipped file and the man page).
KEYS: tuple[Key, ...] = (
    Key("interval", _seconds(MIN_INTERVAL, why=_BOOKKEEPING), 10.0, "seconds between ticks"),
    Key("probe_timeout", _SECONDS, 8.0, "how long nvidia-smi gets to answer"),
    Key("backoff_after", _integer(1, 1000), 3, "failed probes before the backoff starts"),
    Key("retry_max", _SECONDS, 60.0, "the longest wait between failing probes"),
    Key("nvidia_smi", _text, "nvidia-smi", "the nvidia-smi to run: a name in $PATH, or a path"),
    Key("sysfs_root", _absolute_path, "/sys", "where sysfs is mounted"),
    Key("state_file", _absolute_path, "/run/gpuagent/state.json", "where the state is written"),
    Key("load_driver", _boolean, False, "probe also while the nvidia module is not loaded"),
    Key("log_level", _one_of(LOG_LEVELS), "info", "the least severe message logged"),
    Key(
        "textfile",
        _textfile_path,
        "/var/lib/prometheus/node-exporter/gpuagent.prom",
        'the metrics file for node_exporter\'s textfile collector; "" writes none',
    ),
    Key("journal_directory", _journal_path, "", 'the journal files to read; "" the system\'s'),
    # Fewer is a gpu_count problem; None (unset): no check.
    Key("expected_gpus", _integer(0, 1024), None, "the NVIDIA GPUs this host should have"),
    # Then it is a no_driver_module problem: a driver upgrade unloads it for about 80 s.
    Key("driver_absent_grace", _SECONDS, 600.0, "how long GPUs may wait for the nvidia module"),
    # Timeouts of nvidia-smi (reaped) are the smi_timeout warning, which says so once they
    # have lasted this long (never more: no drain); a child outliving SIGKILL is driver_hung.
    Key("driver_hung_after", _SECONDS, 300.0, "how long timeouts last before smi_timeout says so"),
    # Its file name carries the installed driver's version (libnvidia-ml.so.1 ->
    # libnvidia-ml.so.<version>): a name in the system's library directories, or a path.
    Key("nvml_library", _library, "libnvidia-ml.so.1", "the NVML library of the installed driver"),
    # A warning (a Nonfatal NVLink 145, an ECC 63) ends this long after its last record.
    Key("xid_warning_hold", _SECONDS, 3600.0, "how long a warning-class Xid problem holds"),
    # Read at start for recurrence: a critical problem that hit the same GPU in
    # recurrence_boots of them asks for its RMA.
    Key("history_days", _YEARS, 30, "the days of earlier boots read from the journal"),
    Key("recurrence_boots", _YEARS, 2, "the earlier boots a problem recurs in for an RMA"),
    Key("throttle_fraction", _fraction, 0.1, "the share of slowed samples that is throttled"),
    Key("throttle_window", _SECONDS, 600.0, "the samples' window throttle_fraction judges"),
    Key("xid", _xid_table, {}, "this site's own severity and action of Xid codes"),
    # Rounded up to whole ticks; at least one interval (gpuagent.config.RULES).  None (unset):
    # 60 s, 300 s under sampler = "loop" (gpuagent.sources.nvlink.nvlinksource).
    Key("nvlink_interval", _SECONDS, None, "how often NVLink links and counters are read"),
    Key("nvlink_window", _SECONDS, 600.0, "how long a counter's rise counts against its budget"),
    Key("nvlink_recovery_budget", _BUDGET, 0, "how far a recovery counter may rise in a window"),
    Key("nvlink_replay_budget", _BUDGET, 16, "how far a replay counter may rise in a window"),
    # Rounded up to whole ticks; None (unset) or less than a tick: every tick.
    Key("processes_interval", _SECONDS, None, "how often who is on each GPU is read"),
    Key("proc_root", _absolute_path, "/proc", "where proc is mounted"),
    # Rounded up to whole ticks; read only on a vGPU guest (nvidia-gridd installed).
    Key("vgpu_interval", _SECONDS, 300.0, "how often a vGPU guest's licences are read"),
    # Rounded up to whole ticks; read only where nvidia-imex.service is enabled and running.
    Key("imex_interval", _SECONDS, 60.0, "how often the IMEX domain's readiness is read"),
    # The evidence bundles (gpuagent-evidence@.service, root): the oldest go past either cap.
    Key("evidence_max_bundles", _integer(1, 1000), 10, "the evidence bundles kept"),
    Key(
        "evidence_max_bytes",
        _integer(1 << 20, 1 << 40),
        512 << 20,
        "the evidence bundles' bytes kept",
    ),
    # The agent's requests: one bundle per GPU per boot, and at most this many an hour.
    Key("evidence_per_hour", _integer(0, 60), 2, "the bundles the agent's requests make an hour"),
    # Within the unit's TimeoutStartSec=600, with the other parts' minute each.
    Key(
        "evidence_report_timeout",
        _seconds(1.0, 400.0, why="the unit's TimeoutStartSec=600 holds every part"),
        300.0,
        "how long nvidia-bug-report.sh gets before it is killed",
    ),
    # "report" for a fleet's first week on a host: the verdict, status, metrics and journal
    # are the same; slurm-check, NHC's check and node-problem-detector's condition say
    # "would drain" instead (gpuagent.commands.drain).
    Key(
        "drain",
        _one_of(DRAIN_MODES),
        DRAIN_ASK,
        'on a critical problem, "ask" Slurm, NHC, NPD to drain, or "report" what would',
    ),
    Key("sampler", _one_of(SAMPLERS), "loop", "probe by nvidia-smi's loop, or one a tick"),
)
_BY_NAME = {k.name: k for k in KEYS}


def check_key(source: str, key: str, value: Any) -> Any:
    """``value`` of ``key`` read from ``source``, checked by the key's entry in :data:`KEYS`;
    raises :class:`ConfigError` (for an unknown key too)."""
    entry = _BY_NAME.get(key)
    if entry is None:
        raise ConfigError(f"{source}: unknown key {_show(key)} ({_hint(key)})")
    return entry.check(f"{source}: {key}", value)


def _hint(key: str) -> str:
    """What an unknown ``key`` was likely meant to be: the closest known key, or where the
    keys are listed (a list of all of them is too long for one line)."""
    # difflib only for a key not known: it is a tenth of a status command's start.
    from difflib import get_close_matches  # noqa: PLC0415

    near = get_close_matches(key, _BY_NAME, n=1)
    return f"did you mean {near[0]!r}?" if near else "the keys are in gpuagent.toml(5)"
