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

from gpuagent import state
from gpuagent.cli import main
from gpuagent.status import CRITICAL, DEGRADED, HEALTHY, UNKNOWN, judge, render

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
def test_no_readable_state_is_3(tmp_path: str, content: str | None) -> None:
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
    for args in (["status"], ["detect"], ["run", "--ticks", "1"]):
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
