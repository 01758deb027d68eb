"""``gpuagent status``: exit codes and text for every probe state, through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent import state, unitstate
from gpuagent.cli import main
from gpuagent.status import CRITICAL, DEGRADED, HEALTHY, UNKNOWN, judge, malformed, render

NOW = 1_800_000_000.0


def base(**over: Any) -> dict[str, Any]:
    st: dict[str, Any] = {
        "schema": state.SCHEMA,
        "version": "0.1.0",
        "pid": os.getpid(),
        "started_at": NOW - 3600,
        "updated_at": NOW - 1,
        "ticks": 360,
        "interval": 10.0,
        "exit": None,
        "status": "1 GPU, sampling",
        "pci": [
            {"slot": "0000:18:00.0", "device_id": "0x2335", "class": "0x030200", "driver": "nvidia"}
        ],
        "probe": {
            "state": "ok",
            "gate": None,
            "failure_class": None,
            "consecutive_failures": 0,
            "next_probe_in_ticks": 1,
            "spawns_total": 360,
            "last_error": None,
            "last_success_at": NOW - 1,
        },
        "gpus": [
            {
                "pci_slot": "0000:18:00.0",
                "sampled_at": NOW - 1,
                "stale": False,
                "health": "ok",
                "problems": [],
                "fields": {
                    "name": "NVIDIA H200",
                    "temperature.gpu": 52,
                    "utilization.gpu": 100,
                    "memory.used": 32362,
                    "memory.total": 143771,
                    "power.draw": 627.4,
                    "power.limit": 700.0,
                },
            }
        ],
        "host_problems": [],
        "missing": [],
        "problems": {},
    }
    st.update(over)
    return st


def sick(severity: str, kind: str = "lost", action: str = "reboot") -> dict[str, Any]:
    """The base state with one problem on its GPU."""
    problem = {"kind": kind, "severity": severity, "action": action, "message": "m", "since": NOW}
    gpu = dict(base()["gpus"][0], health=severity, problems=[problem])
    return base(gpus=[gpu])


def probe(**over: Any) -> dict[str, Any]:
    p = dict(base()["probe"])
    p.update(over)
    return p


CASES = [
    ("ok", base(), HEALTHY),
    (
        "idle no gpu",
        base(
            pci=[],
            gpus=[],
            status="no NVIDIA GPU on the PCI bus",
            probe=probe(state="idle", gate="no_gpu", next_probe_in_ticks=None),
        ),
        HEALTHY,
    ),
    (
        "failing",
        base(
            probe=probe(state="failing", failure_class="version_mismatch", consecutive_failures=5)
        ),
        CRITICAL,
    ),
    ("stuck", base(probe=probe(state="stuck", failure_class="timeout")), CRITICAL),
    ("gated driver", base(probe=probe(state="gated", gate="driver_not_loaded")), DEGRADED),
    ("gated smi", base(probe=probe(state="gated", gate="nvidia_smi_missing")), DEGRADED),
    ("stale", base(gpus=[dict(base()["gpus"][0], stale=True)]), DEGRADED),
    ("missing", base(missing=["0000:2a:00.0"]), CRITICAL),
    ("critical problem", sick("critical"), CRITICAL),
    ("warning problem", sick("warning", "throttled", "check_host"), DEGRADED),
    (
        "host problem",
        base(
            host_problems=[
                {
                    "kind": "gpu_count",
                    "severity": "critical",
                    "action": "check_host",
                    "message": "m",
                    "since": NOW,
                }
            ]
        ),
        CRITICAL,
    ),
    ("state problem", base(problems={"state_file": "ENOSPC"}), DEGRADED),
    (
        "finished run --ticks",
        base(pid=2**22 + 7, updated_at=NOW - 9999, exit={"reason": "ticks", "at": NOW - 9999}),
        HEALTHY,
    ),
    (
        "finished run --ticks failing",
        base(pid=2**22 + 7, exit={"reason": "ticks", "at": NOW}, probe=probe(state="failing")),
        CRITICAL,
    ),
    ("stopped", base(exit={"reason": "signal", "at": NOW}), UNKNOWN),
    ("died", base(pid=2**22 + 7), UNKNOWN),
    ("silent", base(updated_at=NOW - 31), UNKNOWN),
]


@pytest.mark.parametrize(("name", "st", "code"), CASES, ids=[c[0] for c in CASES])
def test_judge(name: str, st: dict[str, Any], code: int) -> None:
    got, reason = judge(st, NOW)
    assert got == code
    assert reason and "\n" not in reason


def test_render_rows_and_stale() -> None:
    absent: dict[str, Any] = {
        "pci_slot": "0000:2a:00.0",
        "fields": {},
        "sampled_at": None,
        "stale": False,
        "health": "unknown",
        "problems": [],
    }
    st = base(
        gpus=[dict(base()["gpus"][0], stale=True, sampled_at=NOW - 45), absent],
        missing=["0000:2a:00.0"],
    )
    text = render(st, NOW, *judge(st, NOW))
    assert text.splitlines()[0] == "\u25cf gpuagent - 1 GPU, sampling"
    assert "NVIDIA H200" in text
    assert "52C" in text
    assert "32362/143771 MiB" in text
    assert "627/700 W" in text
    assert "STALE 45s" in text
    assert "last took" not in text
    st["probe"]["duration"] = 1.234
    assert ", last took 1.23 s" in render(st, NOW, *judge(st, NOW))
    assert "\n      - on the PCI bus, not reported by nvidia-smi" in text
    assert "0000:2a:00.0    - -" in text


def write_state(tmp_path: str, st: dict[str, Any]) -> str:
    path = os.path.join(tmp_path, "state.json")
    state.write(path, st)
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{path}"\ntextfile = ""\n')
    return conf


@pytest.mark.parametrize(("name", "st", "code"), CASES, ids=[c[0] for c in CASES])
def test_cli_exit_codes(tmp_path: str, name: str, st: dict[str, Any], code: int) -> None:
    st = dict(st, updated_at=time.time() - (NOW - st["updated_at"]))
    conf = write_state(tmp_path, st)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert res.exit_code == code, res.output
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status", "--json"])
    assert res.exit_code == code
    assert json.loads(res.stdout)["schema"] == state.SCHEMA
    assert json.loads(res.stdout)["health"] == ["ok", "warning", "critical", "unknown"][code]


@pytest.mark.parametrize("content", [None, "", "{", "[]", '{"schema": 99}'])
def test_no_readable_state_is_3(
    tmp_path: str, content: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unitstate, "query", dict)  # no systemd to ask
    path = os.path.join(tmp_path, "state.json")
    if content is not None:
        with open(path, "w") as f:
            f.write(content)
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{path}"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert res.exit_code == UNKNOWN
    assert res.stderr.startswith("gpuagent: ")
    assert len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.output


def test_bad_config_is_78_one_line(tmp_path: str) -> None:
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write("interval = -3\n")
    for args in (["check-config"], ["probe"], ["run", "--ticks", "1"]):
        proc = subprocess.run(
            [sys.executable, "-m", "gpuagent", "--config", conf, *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert proc.returncode == 78
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert conf in proc.stderr and "interval" in proc.stderr


def test_status_imports_stay_light(tmp_path: str) -> None:
    conf = write_state(tmp_path, base(updated_at=time.time()))
    code = (
        "import sys\n"
        "from gpuagent.cli import main\n"
        f"sys.argv = ['gpuagent', '--config', {conf!r}, 'status']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('systemd', 'systemd.journal', 'prometheus_client', 'subprocess',"
        " 'sdnotify', 'gpuagent.daemon', 'gpuagent.agent') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=30
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr


MALFORMED = [
    ("exit", "yesterday"),
    ("interval", "10"),
    ("updated_at", [1]),
    ("started_at", 10**400),
    ("probe", "ok"),
    ("problems", ["x"]),
    ("gpus", "none"),
    ("gpus", [1, 2]),
    ("gpus", [{"pci_slot": None, "fields": {}, "sampled_at": NOW, "stale": False}]),
    ("gpus", [{"pci_slot": "0000:18:00.0", "fields": [], "sampled_at": NOW, "stale": False}]),
    ("missing", 3),
    ("missing", [3]),
    ("pid", "1"),
    ("sxids", {"x": 1}),
    ("sxids", [{"pci_slot": "0000:04:00.0", "sxid": "22013", "count": 1, "last": NOW}]),
]


@pytest.mark.parametrize(("key", "value"), MALFORMED, ids=[f"{k}={v!r}"[:40] for k, v in MALFORMED])
def test_hand_edited_state_is_3_with_one_line(tmp_path: str, key: str, value: object) -> None:
    path = os.path.join(tmp_path, "state.json")
    st = base(updated_at=time.time())
    st[key] = value
    with open(path, "w") as f:
        # Python's json writes 10**400 as digits, as a hand edit would.
        json.dump(st, f)
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{path}"\ntextfile = ""\n')
    for args in (["status"], ["status", "--json"]):
        res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, *args])
        assert res.exit_code == UNKNOWN, res.output
        assert res.stderr.strip() == f"gpuagent: {path}: not a gpuagent state file: bad {key!r}"


def test_finished_run_is_not_up() -> None:
    st = base(updated_at=NOW - 600, started_at=NOW - 660, exit={"reason": "ticks", "at": NOW})
    text = render(st, NOW, *judge(st, NOW))
    assert "finished 10m ago after 60s" in text
    assert "up " not in text


def test_terminal_control_characters_are_not_printed() -> None:
    gpu = dict(base()["gpus"][0], fields={"name": "evil\x1b[2J\x00name"})
    st = base(gpus=[gpu], probe=probe(state="failing", last_error="exit 1: \x1b]0;pwned\x07"))
    text = render(st, NOW, *judge(st, NOW))
    assert "\x1b" not in text and "\x00" not in text and "\x07" not in text
    assert "evil?[2J?name" in text


def test_unencodable_and_full_stdout_keep_the_exit_status(tmp_path: str) -> None:
    conf = write_state(tmp_path, base(updated_at=time.time(), probe=probe(state="failing")))
    env = {**os.environ, "PYTHONIOENCODING": "latin-1"}
    argv = [sys.executable, "-m", "gpuagent", "--config", conf, "status"]
    latin = subprocess.run(argv, env=env, capture_output=True, check=False, timeout=30)
    assert latin.returncode == CRITICAL
    assert b"Traceback" not in latin.stderr
    with open("/dev/full", "w") as full:
        res = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, check=False, timeout=30)
    assert res.returncode == CRITICAL
    assert b"Traceback" not in res.stderr and b"Exception" not in res.stderr


def test_a_bad_config_is_a_warning_and_status_exits_by_the_agent_s_health(tmp_path: str) -> None:
    conf = write_state(tmp_path, base(updated_at=time.time()))
    with open(conf, "a") as f:
        f.write("intervall = 5\n")  # the typo of the issue, beside a valid state_file
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert res.exit_code == HEALTHY, res.output
    assert res.stderr == (
        f"gpuagent: warning: {conf}: unknown key 'intervall' (known: interval, probe_timeout, "
        "backoff_after, retry_max, nvidia_smi, sysfs_root, state_file, load_driver, log_level, "
        "textfile, journal_directory, expected_gpus, driver_absent_grace, nvml_library, "
        "xid_warning_hold, throttle_fraction, throttle_window, xid); using its valid settings "
        "only\n"
    )
    with open(conf, "w") as f:
        f.write("interval = [\n")  # not TOML at all: the default state file
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert res.exit_code == UNKNOWN
    assert res.stderr.splitlines()[0].startswith(f"gpuagent: warning: {conf}: not valid TOML")


def test_the_degraded_reason_is_printed_once(tmp_path: str) -> None:
    st = base(updated_at=time.time(), probe=probe(state="failing"), status="1 GPU, failing")
    conf = write_state(tmp_path, st)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert res.exit_code == CRITICAL
    assert (res.stdout.count("1 GPU, failing"), res.stderr) == (1, "")
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status", "--json"])
    assert res.stderr == "gpuagent: 1 GPU, failing\n"  # the JSON does not say why


def test_next_try_is_in_seconds() -> None:
    p = probe(state="failing", failure_class="timeout", consecutive_failures=4)
    st = base(probe={**p, "next_probe_in_ticks": 2}, interval=10.0)
    text = render(st, NOW, *judge(st, NOW))
    assert "(timeout, 4 failures, next try in 20 s)" in text
    assert "ticks)" not in text


def test_a_stopped_agent_says_since_when() -> None:
    at = NOW - 300
    st = base(updated_at=at, exit={"reason": "signal", "at": at})
    code, reason = judge(st, NOW)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))
    assert (code, reason) == (UNKNOWN, f"gpuagent is stopped since {stamp} (5m ago)")
    lines = render(st, NOW, code, reason).splitlines()
    assert lines[0] == f"\u25cb gpuagent - {reason}"
    assert sum(reason in line for line in lines) == 1
    assert "finished 5m ago" in lines[1]


STOPPED = {
    "LoadState": "loaded",
    "ActiveState": "inactive",
    "Result": "success",
    "ExecMainStatus": "0",
    "InactiveEnterTimestamp": "Mon 2026-11-30 21:40:03 UTC",
}


@pytest.mark.parametrize(
    ("props", "reason"),
    [
        (STOPPED, "gpuagent is stopped since Mon 2026-11-30 21:40:03 UTC"),
        ({**STOPPED, "InactiveEnterTimestamp": ""}, "gpuagent has not run since boot"),
        (
            {**STOPPED, "ActiveState": "failed", "Result": "exit-code", "ExecMainStatus": "78"},
            "gpuagent failed (exit-code, exit status 78: the config file cannot be used "
            "(gpuagent check-config says why)) since Mon 2026-11-30 21:40:03 UTC",
        ),
        (
            {**STOPPED, "ActiveState": "failed", "Result": "watchdog", "ExecMainStatus": "6"},
            "gpuagent failed (watchdog, exit status 6) since Mon 2026-11-30 21:40:03 UTC",
        ),
        (
            {"LoadState": "not-found", "ActiveState": "inactive"},
            "gpuagent.service is not installed",
        ),
        ({**STOPPED, "ActiveState": "active"}, None),
        ({**STOPPED, "ActiveState": "activating"}, None),
        ({}, None),
    ],
)
def test_what_systemd_says_of_a_service_that_is_not_running(
    props: dict[str, str], reason: str | None
) -> None:
    assert unitstate.describe(props) == reason


def test_without_a_state_file_status_asks_systemd(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unitstate, "query", lambda: STOPPED)
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{tmp_path}/state.json"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert (res.exit_code, res.stderr) == (UNKNOWN, "")
    assert res.stdout == "\u25cb gpuagent - gpuagent is stopped since Mon 2026-11-30 21:40:03 UTC\n"
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status", "--json"])
    assert res.exit_code == UNKNOWN
    assert json.loads(res.stdout) == {
        "health": "unknown",
        "health_reason": "gpuagent is stopped since Mon 2026-11-30 21:40:03 UTC",
    }
    assert res.stderr == "gpuagent: gpuagent is stopped since Mon 2026-11-30 21:40:03 UTC\n"


def test_json_without_a_state_to_judge_is_still_json(tmp_path: str) -> None:
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{tmp_path}/state.json"\n')
    with open(os.path.join(tmp_path, "state.json"), "w") as f:
        f.write('{"schema": 1, "pid": "x"}')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status", "--json"])
    assert res.exit_code == UNKNOWN
    out = json.loads(res.stdout)
    assert out["health"] == "unknown" and "bad 'pid'" in out["health_reason"]
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert (res.exit_code, res.stdout) == (UNKNOWN, "")
    assert "bad 'pid'" in res.stderr


def test_systemctl_show_is_parsed(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    systemctl = os.path.join(tmp_path, "systemctl")
    with open(systemctl, "w") as f:
        f.write('#!/bin/sh\nprintf "LoadState=loaded\\nInactiveEnterTimestamp=\\nx\\n"\n')
    os.chmod(systemctl, 0o700)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert unitstate.query() == {"LoadState": "loaded", "InactiveEnterTimestamp": ""}
    os.unlink(systemctl)
    assert unitstate.query() == {}


def test_render_shows_each_gpus_health_and_problems() -> None:
    st = sick("critical")
    st["gpus"][0]["fields"].update(index=3, uuid="GPU-5c1e0d4a-0000-0000-0000-000000000000")
    st["host_problems"] = [
        {
            "kind": "gpu_count",
            "severity": "critical",
            "action": "check_host",
            "message": "7 NVIDIA GPUs on the PCI bus where expected_gpus is 8",
            "since": NOW - 300,
        }
    ]
    code, reason = judge(st, NOW)
    assert code == CRITICAL
    assert reason == "host gpu_count: check_host; 0000:18:00.0 lost: reboot"
    lines = render(st, NOW, code, reason).splitlines()
    assert (
        "    host: critical gpu_count: 7 NVIDIA GPUs on the PCI bus where expected_gpus is 8 "
        "(action: check_host, since 5m ago)" in lines
    )
    (row,) = [ln for ln in lines if ln.startswith("    0000:18:00.0")]
    assert row.split()[1:4] == ["3", "GPU-5c1e0d4a-0000-0000-0000-000000000000", "CRITICAL"]
    assert lines[lines.index(row) + 1] == "      - critical lost: m (action: reboot, since 0s ago)"


def test_a_gpu_with_bad_xid_counts_is_malformed() -> None:
    gpu = base()["gpus"][0]
    st = base(gpus=[{**gpu, "xids": [{"xid": 79, "count": "1", "last": NOW}]}])
    assert malformed(st) == "gpus"
    st = base(gpus=[{**gpu, "xids": [{"xid": 79, "count": 1, "last": NOW}]}])
    assert malformed(st) is None


def test_one_failure_and_one_spawn_are_singular() -> None:
    p = probe(state="failing", failure_class="timeout", consecutive_failures=1, spawns_total=1)
    st = base(probe={**p, "next_probe_in_ticks": 1}, interval=10.0)
    assert "(timeout, 1 failure, next try in 10 s), 1 spawn," in render(st, NOW, *judge(st, NOW))
