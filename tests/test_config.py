"""Config loading: defaults, overrides, and a one-line error for every bad value."""

from __future__ import annotations

import os
import re

import pytest

from gpuagent.config import (
    DEFAULT_PATH,
    Config,
    ConfigError,
    config_path,
    load,
    salvage,
    warnings,
    with_interval,
)
from gpuagent.configkeys import Override


def write(tmp_path: str, text: str) -> str:
    path = os.path.join(tmp_path, "gpuagent.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def test_missing_default_file_gives_defaults(tmp_path: str) -> None:
    assert load(os.path.join(tmp_path, "absent.toml"), required=False) == Config()


def test_missing_explicit_file_is_an_error(tmp_path: str) -> None:
    with pytest.raises(ConfigError, match=r"absent\.toml: no such file"):
        load(os.path.join(tmp_path, "absent.toml"), required=True)


def test_values_are_read(tmp_path: str) -> None:
    path = write(
        tmp_path,
        "interval = 2.5\nprobe_timeout = 2\nbackoff_after = 5\nretry_max = 30.5\n"
        'nvidia_smi = "/opt/bin/nvidia-smi"\nsysfs_root = "/tmp/sys"\n'
        'state_file = "/tmp/s.json"\nload_driver = true\nlog_level = "debug"\n',
    )
    cfg = load(path, required=True)
    assert cfg == Config(
        2.5, 2.0, 5, 30.5, "/opt/bin/nvidia-smi", "/tmp/sys", "/tmp/s.json", True, "debug"
    )
    assert isinstance(cfg.probe_timeout, float)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("intervall = 10", "unknown key 'intervall'"),
        ('interval = "10"', "interval: expected a number of seconds"),
        ("interval = 0", "interval: expected seconds between"),
        ("interval = 0.001", "between 0.1 and 86400, got 0.001 (shorter ticks would spend"),
        ("interval = 0.099", "interval: expected seconds between 0.1 and"),
        ("interval = -1", "interval: expected seconds between"),
        ("interval = inf", "interval: expected seconds between"),
        ("interval = nan", "interval: expected seconds between"),
        ("probe_timeout = true", "probe_timeout: expected a number of seconds"),
        ("retry_max = 100000", "retry_max: expected seconds between"),
        ("backoff_after = 0", "backoff_after: expected an integer from 1 to 1000"),
        ("backoff_after = 2.5", "backoff_after: expected an integer"),
        ("load_driver = 1", "load_driver: expected true or false"),
        ('log_level = "verbose"', "log_level: expected one of debug, info, warning, error"),
        ('nvidia_smi = ""', "nvidia_smi: expected a non-empty string"),
        ("nvidia_smi = 3", "nvidia_smi: expected a non-empty string"),
        ('sysfs_root = "sys"', "sysfs_root: expected an absolute path"),
        ('proc_root = "proc"', "proc_root: expected an absolute path"),
        ('state_file = "state.json"', "state_file: expected an absolute path"),
        ('textfile = "gpuagent.prom"', "textfile: expected an absolute path ending in .prom"),
        ('textfile = "/var/lib/x/gpuagent.txt"', "textfile: expected an absolute path ending"),
        ('textfile = "/var/lib/x/"', "textfile: expected an absolute path ending in .prom"),
        ("textfile = false", "textfile: expected an absolute path ending in .prom"),
        ('textfile = "/a\\u0000.prom"', "textfile: expected an absolute path ending in .prom"),
        ('journal_directory = "var/log/journal"', "journal_directory: expected an absolute path"),
        ("journal_directory = 1", "journal_directory: expected an absolute path"),
        ("driver_absent_grace = -1", "driver_absent_grace: expected seconds between"),
        ('driver_absent_grace = "10m"', "driver_absent_grace: expected a number of seconds"),
        # A quoted number says it is a string, not the number it reads as.
        ('interval = "8"', "interval: expected a number of seconds, got the string '8'"),
        ("xid_warning_hold = 0", "xid_warning_hold: expected seconds between"),
        ("throttle_window = true", "throttle_window: expected a number of seconds"),
        ("throttle_fraction = 0", "throttle_fraction: expected a fraction above 0 and at most 1"),
        ("throttle_fraction = 1.5", "throttle_fraction: expected a fraction above 0 and at most"),
        ("throttle_fraction = nan", "throttle_fraction: expected a fraction above 0 and at most"),
        ('throttle_fraction = "10%"', "throttle_fraction: expected a fraction above 0"),
        ('nvml_library = ""', "nvml_library: expected a non-empty string"),
        ('nvml_library = "lib/libnvidia-ml.so.1"', "nvml_library: expected a library name"),
        ("xid = 94", "xid: expected a table of Xid codes"),
        ('[xid]\nfoo = { severity = "none" }', "xid: expected Xid codes (1 to 999999), got 'foo'"),
        ('[xid]\n0 = { severity = "none" }', "xid: expected Xid codes (1 to 999999), got '0'"),
        ('[xid]\n1234567 = { severity = "none" }', "xid: expected Xid codes"),
        ("[xid]\n" + "9" * 5000 + ' = { severity = "none" }', "xid: expected Xid codes"),
        ('[xid]\n94 = "none"', "xid.94: expected an inline table of severity and action"),
        ("[xid]\n94 = {}", "xid.94: expected an inline table of severity and action"),
        (
            '[xid]\n94 = { sev = "none" }',
            "xid.94: unknown key 'sev' (known: severity, action, count, window)",
        ),
        (
            '[xid]\n31 = { severity = "critical", count = 1, window = 600 }',
            "xid.31.count: expected an integer from 2 to 100, got 1",
        ),
        ('[xid]\n31 = { severity = "critical", count = 101, window = 600 }', "xid.31.count:"),
        ('[xid]\n31 = { severity = "critical", count = 2.5, window = 600 }', "xid.31.count:"),
        ('[xid]\n31 = { severity = "critical", count = true, window = 600 }', "xid.31.count:"),
        (
            '[xid]\n31 = { severity = "critical", count = 3, window = 0 }',
            "xid.31.window: expected seconds between 1 and 604800, got 0",
        ),
        ('[xid]\n31 = { severity = "critical", count = 3, window = -5 }', "xid.31.window:"),
        ('[xid]\n31 = { severity = "critical", count = 3, window = 604801 }', "xid.31.window:"),
        ('[xid]\n31 = { severity = "critical", count = 3, window = nan }', "xid.31.window:"),
        (
            '[xid]\n31 = { severity = "critical", count = 3, window = "10m" }',
            "xid.31.window: expected a number of seconds",
        ),
        (
            '[xid]\n31 = { severity = "critical", count = 3 }',
            "xid.31.count: needs window too",
        ),
        (
            '[xid]\n31 = { severity = "critical", window = 600 }',
            "xid.31.window: needs count too",
        ),
        (
            "[xid]\n31 = { count = 3, window = 600 }",
            "xid.31: count and window need a severity or action to escalate to",
        ),
        (
            '[xid]\n94 = { severity = "high" }',
            "xid.94.severity: expected one of none, warning, critical, got 'high'",
        ),
        ('[xid]\n13 = { action = "rma" }', "xid.13.action: expected one of none, restart_app,"),
        ("interval = [", "not valid TOML"),
        ("[section]\nx = 1", "unknown key 'section'"),
    ],
)
def test_every_bad_value_is_one_line_naming_file_and_key(
    tmp_path: str, text: str, needle: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path, required=True)
    message = str(err.value)
    assert message.startswith(path + ": ")
    assert needle in message
    assert "\n" not in message


def test_not_utf8_is_a_config_error(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "bad.toml")
    with open(path, "wb") as f:
        f.write(b"interval = 1\n\xff\xfe")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(path, required=True)


def test_unreadable_is_a_config_error(tmp_path: str) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(str(tmp_path), required=True)


def test_path_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUAGENT_CONFIG", raising=False)
    assert config_path(None) == (DEFAULT_PATH, False)
    monkeypatch.setenv("GPUAGENT_CONFIG", "/env.toml")
    assert config_path(None) == ("/env.toml", True)
    assert config_path("/cli.toml") == ("/cli.toml", True)


def test_textfile_default_path_and_empty_disables(tmp_path: str) -> None:
    assert Config().textfile == "/var/lib/prometheus/node-exporter/gpuagent.prom"
    assert load(write(tmp_path, 'textfile = ""'), required=True).textfile == ""
    path = write(tmp_path, 'textfile = "/run/gpuagent/gpuagent.prom"')
    assert load(path, required=True).textfile == "/run/gpuagent/gpuagent.prom"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("interval = 1" + "0" * 400, "interval: expected seconds between"),
        ("backoff_after = 1" + "0" * 400, "backoff_after: expected an integer"),
        ("backoff_after = 1" + "0" * 5000, "not valid TOML"),
        ("a = " + "[" * 5000 + "]" * 5000, "not valid TOML"),
    ],
)
def test_hostile_files_are_one_line_errors(tmp_path: str, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path, required=True)
    assert needle in str(err.value)
    assert len(str(err.value)) < 400


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_devices_are_refused(path: str) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        load(path, required=True)


def test_a_fifo_does_not_hang(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "fifo.toml")
    os.mkfifo(path)
    with pytest.raises(ConfigError, match="not a regular file"):
        load(path, required=True)


def test_a_huge_file_is_refused(tmp_path: str) -> None:
    path = write(tmp_path, "# " + "x" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="larger than 64 KiB"):
        load(path, required=True)


def test_a_short_interval_shortens_the_default_probe_timeout(tmp_path: str) -> None:
    assert load(write(tmp_path, "interval = 5"), required=True).probe_timeout == 4.0
    assert load(write(tmp_path, "interval = 0.1"), required=True).probe_timeout == 0.08
    assert load(write(tmp_path, "interval = 60"), required=True).probe_timeout == 8.0
    cfg = load(write(tmp_path, "interval = 5\nprobe_timeout = 4.9"), required=True)
    assert cfg.probe_timeout == 4.9  # one the operator wrote stays as written


def test_run_interval_caps_the_probe_timeout() -> None:
    assert with_interval(Config(), 0.5) == Config(interval=0.5, probe_timeout=0.4)
    assert with_interval(Config(), 30) == Config(interval=30, probe_timeout=8.0)


def test_salvage_keeps_the_valid_keys_of_a_bad_file(tmp_path: str) -> None:
    path = write(tmp_path, 'intervall = 5\nstate_file = "/srv/s.json"\ninterval = "x"\n')
    cfg, error = salvage(path, required=True)
    assert cfg == Config(state_file="/srv/s.json")
    assert error is not None and "unknown key 'intervall'" in str(error)
    assert salvage(write(tmp_path, 'state_file = "/srv/s.json"'), required=True)[1] is None


def test_salvage_leaves_out_an_unknown_key_whatever_its_value(tmp_path: str) -> None:
    # A typo'd key with a string value once reached Config() and crashed gpuagent status.
    path = write(tmp_path, 'state_fille = "/srv/s.json"\nretry_max = 20\n')
    cfg, error = salvage(path, required=True)
    assert cfg == Config(retry_max=20.0)
    assert error is not None and "unknown key 'state_fille'" in str(error)


def test_salvage_of_a_file_that_is_not_toml_gives_the_defaults(tmp_path: str) -> None:
    cfg, error = salvage(write(tmp_path, 'state_file = "/srv/s.json"\n['), required=True)
    assert (cfg, "not valid TOML" in str(error)) == (Config(), True)
    cfg, error = salvage(os.path.join(tmp_path, "absent.toml"), required=True)
    assert (cfg, "no such file" in str(error)) == (Config(), True)


def test_a_probe_timeout_at_or_above_the_interval_is_a_warning(tmp_path: str) -> None:
    cfg = load(write(tmp_path, "interval = 5\nprobe_timeout = 5"), required=True)
    assert warnings(cfg) == [
        "probe_timeout (5 s) is not below interval (5 s): a hung nvidia-smi stretches a tick to 5 s"
    ]
    assert warnings(Config()) == warnings(Config(interval=0.1, probe_timeout=0.08)) == []


def test_journal_directory_default_is_the_system_journal(tmp_path: str) -> None:
    assert Config().journal_directory == ""
    path = write(tmp_path, 'journal_directory = "/var/tmp/journal"')
    assert load(path, required=True).journal_directory == "/var/tmp/journal"


def test_the_issue_17_keys_and_their_defaults(tmp_path: str) -> None:
    cfg = Config()
    assert (cfg.driver_absent_grace, cfg.xid_warning_hold) == (600.0, 3600.0)
    assert (cfg.throttle_fraction, cfg.throttle_window) == (0.1, 600.0)
    assert (cfg.nvml_library, cfg.xid) == ("libnvidia-ml.so.1", {})
    path = write(
        tmp_path,
        'driver_absent_grace = 120\nnvml_library = "/opt/nvidia/lib/libnvidia-ml.so.1"\n'
        "xid_warning_hold = 86400\nthrottle_fraction = 1\nthrottle_window = 60.5\n",
    )
    cfg = load(path, required=True)
    assert (cfg.driver_absent_grace, cfg.xid_warning_hold) == (120.0, 86400.0)
    assert (cfg.throttle_fraction, cfg.throttle_window) == (1.0, 60.5)
    assert cfg.nvml_library == "/opt/nvidia/lib/libnvidia-ml.so.1"
    assert isinstance(cfg.throttle_fraction, float)


def test_the_xid_table_of_the_issue(tmp_path: str) -> None:
    path = write(
        tmp_path,
        '[xid]\n94 = { severity = "none" }\n13 = { severity = "critical", action = "reset_gpu" }\n'
        '79 = { action = "check_host" }\n',
    )
    assert load(path, required=True).xid == {
        94: Override(severity="none"),
        13: Override("critical", "reset_gpu"),
        79: Override(action="check_host"),
    }
    inline = write(tmp_path, 'xid = { 94 = { severity = "none" } }\n')
    assert load(inline, required=True).xid == {94: Override(severity="none")}


def test_the_shipped_files_xid_examples_load(tmp_path: str) -> None:
    shipped = os.path.join(os.path.dirname(os.path.dirname(__file__)), "packaging", "gpuagent.toml")
    with open(shipped, encoding="utf-8") as f:
        examples = [line[2:] for line in f if re.fullmatch(r"# (\[xid\]|\d+ = \{.*\})\n", line)]
    assert load(write(tmp_path, "".join(examples)), required=True).xid == {
        94: Override(severity="none"),
        13: Override("critical", "reset_gpu"),
        # 3 within 10 minutes of an Xid 31 on one GPU.
        31: Override("critical", "reset_gpu", 3, 600.0),
    }


def test_salvage_drops_a_bad_xid_table_and_keeps_the_rest(tmp_path: str) -> None:
    path = write(tmp_path, 'throttle_window = 30\n[xid]\n94 = { severity = "high" }\n')
    cfg, error = salvage(path, required=True)
    assert (cfg.throttle_window, cfg.xid) == (30.0, {})
    assert error is not None and "xid.94.severity" in str(error)


def test_nvlink_defaults() -> None:
    cfg = Config()
    assert (cfg.nvlink_interval, cfg.nvlink_window) == (None, 600.0)
    assert (cfg.nvlink_recovery_budget, cfg.nvlink_replay_budget) == (0, 16)


def test_nvlink_values_are_read(tmp_path: str) -> None:
    path = write(
        tmp_path,
        "nvlink_interval = 30\nnvlink_window = 900.5\nnvlink_recovery_budget = 2\n"
        "nvlink_replay_budget = 100\n",
    )
    cfg = load(path, required=True)
    assert (cfg.nvlink_interval, cfg.nvlink_window) == (30.0, 900.5)
    assert isinstance(cfg.nvlink_interval, float)
    assert (cfg.nvlink_recovery_budget, cfg.nvlink_replay_budget) == (2, 100)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        # Less than one tick: a config error, not a silent read on every tick.
        (
            "nvlink_interval = 5",
            "nvlink_interval: expected at least one tick (interval 10 s), got 5",
        ),
        ("interval = 30\nnvlink_interval = 29.9", "expected at least one tick (interval 30 s)"),
        ("nvlink_interval = 0", "nvlink_interval: expected seconds between"),
        ('nvlink_interval = "60"', "nvlink_interval: expected a number of seconds"),
        ("nvlink_window = -1", "nvlink_window: expected seconds between"),
        ("nvlink_window = true", "nvlink_window: expected a number of seconds"),
        ("nvlink_recovery_budget = -1", "nvlink_recovery_budget: expected an integer from 0 to"),
        ("nvlink_replay_budget = 1.5", "nvlink_replay_budget: expected an integer from 0 to"),
        ("nvlink_replay_budget = true", "nvlink_replay_budget: expected an integer from 0 to"),
        ("nvlink_replay_budget = 10000000000", "nvlink_replay_budget: expected an integer from 0"),
    ],
)
def test_bad_nvlink_values(tmp_path: str, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path, required=True)
    assert str(err.value).startswith(path + ": ")
    assert needle in str(err.value)


def test_a_long_interval_with_the_default_nvlink_interval_is_fine(tmp_path: str) -> None:
    # Only a value set in the file is checked: the default becomes one read per tick.
    assert load(write(tmp_path, "interval = 120\n"), required=True).nvlink_interval is None
    assert load(write(tmp_path, "nvlink_interval = 10\n"), required=True).nvlink_interval == 10.0
