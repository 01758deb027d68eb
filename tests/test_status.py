"""``gpuagent status``: exit codes and text for every probe state, through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent import state
from gpuagent.commands.cli import main
from gpuagent.commands.status import ExitCode, judge, malformed
from gpuagent.commands.statustext import render
from gpuagent.edges.systemd import unitstate
from gpuagent.schema import ProbeState, State
from gpuagent.sources.kernel.xidcatalog import lookup
from gpuagent.views import Failure, Gate, KernelView, ProbeView, XidCount
from tests import states
from tests.states import NOW, SLOT
from tests.test_statedir import unsearchable

STRAY = 2**22 + 7  # a pid no process has (above pid_max's 2**22)
ABSENT = "0000:2a:00.0"


def base(at: float = NOW, **facts: Any) -> State:
    """A healthy one-H200 host as the agent writes it one second before ``at``."""
    return states.state(now=at - 1, **facts)


def probe(at: float = NOW, **over: Any) -> ProbeView:
    """The base state's probe (answering every tick, last a second before ``at``), changed by
    ``over``."""
    return replace(ProbeView(state=ProbeState.OK, spawns_total=360, last_success_at=at - 1), **over)


def failing(failure: Failure = Failure.VERSION_MISMATCH, at: float = NOW, **over: Any) -> ProbeView:
    """The base state's probe, failing at its last try."""
    return probe(at, state=ProbeState.FAILING, failure=failure, **over)


HOST_PROBLEM = states.problem("gpu_count", "critical", "check_host", slot="")
# The host problems the agent writes for each probe state (the writer decides, never status).
MISMATCH = {"": [states.problem("driver_mismatch", "critical", "check_host", slot="")]}
SMI_FAILING = {"": [states.problem("smi_failing", "critical", "check_host", slot="")]}
HUNG = {"": [states.problem("driver_hung", "critical", "reboot", slot="")]}
NO_MODULE = {"": [states.problem("no_driver_module", "warning", "check_host", slot="")]}
NO_SMI = {"": [states.problem("nvidia_smi_missing", "warning", "check_host", slot="")]}

# Each case's state as written for a judge at ``at``.
CASES: list[tuple[str, Callable[[float], State], ExitCode]] = [
    ("ok", base, ExitCode.OK),
    (
        "idle no gpu",
        lambda at: base(at, bus=(), probe=probe(at, state=ProbeState.IDLE, gate=Gate.NO_GPU)),
        ExitCode.OK,
    ),
    (
        "failing",
        lambda at: base(at, probe=failing(Failure.OTHER, at=at, failures=5), problems=SMI_FAILING),
        ExitCode.CRITICAL,
    ),
    (
        "version mismatch",
        lambda at: base(at, probe=failing(at=at, failures=5), problems=MISMATCH),
        ExitCode.CRITICAL,
    ),
    (
        "stuck",
        lambda at: base(
            at, probe=probe(at, state=ProbeState.STUCK, failure=Failure.TIMEOUT), problems=HUNG
        ),
        ExitCode.CRITICAL,
    ),
    (
        "gated driver",
        lambda at: base(
            at,
            probe=probe(at, state=ProbeState.GATED, gate=Gate.DRIVER_NOT_LOADED),
            problems=NO_MODULE,
        ),
        ExitCode.WARNING,
    ),
    (
        "gated smi",
        lambda at: base(
            at,
            probe=probe(at, state=ProbeState.GATED, gate=Gate.NVIDIA_SMI_MISSING),
            problems=NO_SMI,
        ),
        ExitCode.WARNING,
    ),
    # The reader decides nothing: a probe state or a stale sample the agent wrote no problem
    # for is no condition (every condition is a problem the writer gave a severity).
    (
        "failing without a problem",
        lambda at: base(at, probe=failing(at=at, failures=5)),
        ExitCode.OK,
    ),
    ("stale without a problem", lambda at: base(at, stale=[SLOT]), ExitCode.OK),
    (
        "missing",
        lambda at: base(at, bus=(states.nvidia(), states.nvidia(ABSENT)), missing=[ABSENT]),
        ExitCode.CRITICAL,
    ),
    (
        "critical problem",
        lambda at: base(at, problems={SLOT: [states.problem("lost", "critical", "reboot")]}),
        ExitCode.CRITICAL,
    ),
    (
        "warning problem",
        lambda at: base(
            at, problems={SLOT: [states.problem("throttled", "warning", "check_host")]}
        ),
        ExitCode.WARNING,
    ),
    ("host problem", lambda at: base(at, problems={"": [HOST_PROBLEM]}), ExitCode.CRITICAL),
    (
        "state problem",
        lambda at: base(at, trouble={"state_file": "ENOSPC"}),
        ExitCode.WARNING,
    ),
    (
        "finished run --ticks",
        lambda at: base(at, pid=STRAY, ended=("ticks", at - 9999)),
        ExitCode.OK,
    ),
    (
        "finished run --ticks failing",
        lambda at: base(
            at, pid=STRAY, ended=("ticks", at), probe=failing(at=at), problems=MISMATCH
        ),
        ExitCode.CRITICAL,
    ),
    ("stopped", lambda at: base(at, ended=("signal", at)), ExitCode.UNKNOWN),
    ("died", lambda at: base(at, pid=STRAY), ExitCode.UNKNOWN),
    ("silent", lambda at: states.state(now=at - 31), ExitCode.UNKNOWN),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize(("name", "made", "code"), CASES, ids=IDS)
def test_judge(name: str, made: Callable[[float], State], code: ExitCode) -> None:
    got, reason = judge(made(NOW), NOW)
    assert got == code
    assert reason and "\n" not in reason


def test_render_rows_and_stale() -> None:
    facts: dict[str, Any] = {
        "bus": (states.nvidia(), states.nvidia(ABSENT)),
        "samples": {SLOT: states.sample(at=NOW - 45)},
        "stale": [SLOT],
        "missing": [ABSENT],
    }
    st = base(**facts)
    assert st["status"] == f"drain and reboot: fixes {ABSENT}; 1 critical; 2 GPUs, sampling"
    text = render(st, NOW, *judge(st, NOW))
    first = f"\u25cf gpuagent - drain and reboot: fixes {ABSENT}; 1 critical; 2 GPUs, sampling"
    assert text.splitlines()[0] == first
    # The host's remedy in full under it, each problem it fixes named.
    assert text.splitlines()[1] == f"    remedy: drain and reboot: fixes {ABSENT} missing"
    assert "NVIDIA H200" not in text  # the name is --wide's
    assert "NVIDIA H200" in render(st, NOW, *judge(st, NOW), wide=True)
    assert "32362/143771 MiB" in render(st, NOW, *judge(st, NOW), wide=True)
    assert "52C" in text
    assert "32/140 GiB" in text
    assert "627/700 W" in text
    assert "STALE 45s" in text
    assert "last took" not in text
    st = base(probe=probe(duration=1.234), **facts)
    assert ", last took 1.23 s" in render(st, NOW, *judge(st, NOW))
    assert "\n      - reboot: critical missing: missing from nvidia-smi, though" in text
    assert "0000:2a:00.0    - CRITICAL" in text


def write_state(tmp_path: str, st: Mapping[str, object]) -> str:
    path = os.path.join(tmp_path, "state.json")
    state.write(path, st)
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{path}"\ntextfile = ""\n')
    return conf


@pytest.mark.parametrize(("name", "made", "code"), CASES, ids=IDS)
def test_cli_exit_codes(
    tmp_path: str, name: str, made: Callable[[float], State], code: ExitCode
) -> None:
    conf = write_state(tmp_path, made(time.time()))
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
    assert res.exit_code == ExitCode.UNKNOWN
    assert res.stderr.startswith("gpuagent: ")
    assert len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.output


def test_bad_config_is_78_one_line(public_dir: str) -> None:
    # In a directory the service may enter: check-config warns of one it could not, too.
    conf = os.path.join(public_dir, "c.toml")
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


# What `gpuagent status` must not import: the writer of the state and its outputs, the
# sources, the other commands.
HEAVY = (
    "systemd",
    "systemd.journal",
    "prometheus_client",
    "subprocess",
    "sdnotify",
    "gpuagent.daemon",
    "gpuagent.agent",
    "gpuagent.report",
    "gpuagent.publish",
    "gpuagent.statusline",
    "gpuagent.metrics",
    "gpuagent.sources.bus.pci",
    "gpuagent.sources.kernel.xidcount",
    "gpuagent.sources.probe.smi",
    "gpuagent.commands.clearcli",
    "gpuagent.commands.historycli",
    "gpuagent.commands.schedcli",
    "gpuagent.commands.unitscli",
)


def test_status_imports_stay_light(tmp_path: str) -> None:
    conf = write_state(tmp_path, base(time.time()))
    code = (
        "import sys\n"
        "from gpuagent.commands.cli import main\n"
        f"sys.argv = ['gpuagent', '--config', {conf!r}, 'status']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
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
    st: dict[str, object] = dict(base(time.time()))
    st[key] = value  # the hand edit
    with open(path, "w") as f:
        # Python's json writes 10**400 as digits, as a hand edit would.
        json.dump(st, f)
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{path}"\ntextfile = ""\n')
    reason = f"{path}: not a gpuagent state file: bad {key!r}"
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert res.exit_code == ExitCode.UNKNOWN, res.output
    assert res.stderr.strip() == f"gpuagent: {reason}"
    # --json: the JSON alone, on stdout; its health_reason says why.
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status", "--json"])
    assert res.exit_code == ExitCode.UNKNOWN, res.output
    assert (res.stderr, json.loads(res.stdout)["health_reason"]) == ("", reason)


def test_finished_run_is_not_up() -> None:
    st = states.state(now=NOW - 600, started_at=NOW - 660, ended=("ticks", NOW - 600))
    text = render(st, NOW, *judge(st, NOW))
    assert "finished 10m ago after 60s" in text
    assert "up " not in text


def test_terminal_control_characters_are_not_printed() -> None:
    st = base(
        samples={SLOT: states.sample({"name": "evil\x1b[2J\x00name"})},
        probe=failing(last_error="exit 1: \x1b]0;pwned\x07"),
    )
    text = render(st, NOW, *judge(st, NOW), wide=True)
    assert "\x1b" not in text and "\x00" not in text and "\x07" not in text
    assert "evil?[2J?name" in text


def test_unencodable_and_full_stdout_keep_the_exit_status(tmp_path: str) -> None:
    now = time.time()
    conf = write_state(tmp_path, base(now, probe=failing(at=now), problems=MISMATCH))
    env = {**os.environ, "PYTHONIOENCODING": "latin-1"}
    argv = [sys.executable, "-m", "gpuagent", "--config", conf, "status"]
    latin = subprocess.run(argv, env=env, capture_output=True, check=False, timeout=30)
    assert latin.returncode == ExitCode.CRITICAL
    assert b"Traceback" not in latin.stderr
    with open("/dev/full", "w") as full:
        res = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, check=False, timeout=30)
    assert res.returncode == ExitCode.CRITICAL
    assert b"Traceback" not in res.stderr and b"Exception" not in res.stderr


def test_a_bad_config_is_a_warning_and_status_exits_by_the_agent_s_health(tmp_path: str) -> None:
    conf = write_state(tmp_path, base(time.time()))
    with open(conf, "a") as f:
        f.write("intervall = 5\n")  # the typo of the issue, beside a valid state_file
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert res.exit_code == ExitCode.OK, res.output
    assert res.stderr == (
        f"gpuagent: warning: {conf}: unknown key 'intervall' (did you mean 'interval'?); "
        "using its valid settings only\n"
    )
    with open(conf, "w") as f:
        f.write("interval = [\n")  # not TOML at all: the default state file
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert res.exit_code == ExitCode.UNKNOWN
    assert res.stderr.splitlines()[0].startswith(f"gpuagent: warning: {conf}: not valid TOML")


def test_the_degraded_reason_is_printed_once(tmp_path: str) -> None:
    now = time.time()
    st = base(now, probe=failing(at=now), problems=MISMATCH)
    failing_line = "check_host; 1 critical; 1 GPU, nvidia-smi failing (version_mismatch)"
    assert st["status"] == failing_line
    conf = write_state(tmp_path, st)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert res.exit_code == ExitCode.CRITICAL
    # The header (wrapped at 80 columns) and the host's row, and no line of the reason more.
    assert res.stdout.startswith(f"\u25cf gpuagent - {failing_line[:49]}\n")
    assert (res.stdout.count("driver_mismatch"), res.stderr) == (2, "")
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status", "--json"])
    assert res.stderr == ""  # the JSON alone: its health_reason says why
    assert json.loads(res.stdout)["health_reason"] == "host driver_mismatch: check_host"


def test_next_try_is_in_seconds() -> None:
    st = base(probe=failing(Failure.TIMEOUT, failures=4, next_in_ticks=2), interval=10.0)
    text = render(st, NOW, *judge(st, NOW))
    assert "(timeout, 4 failures, next try in 20 s)" in text
    assert "ticks)" not in text


def test_a_stopped_agent_says_since_when() -> None:
    at = NOW - 300
    st = states.state(now=at, ended=("signal", at))
    code, reason = judge(st, NOW)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))
    assert (code, reason) == (ExitCode.UNKNOWN, f"gpuagent has been stopped since {stamp} (5m ago)")
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
        (STOPPED, "gpuagent has been stopped since Mon 2026-11-30 21:40:03 UTC"),
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
    assert (res.exit_code, res.stderr) == (ExitCode.UNKNOWN, "")
    assert (
        res.stdout
        == "\u25cb gpuagent - gpuagent has been stopped since Mon 2026-11-30 21:40:03 UTC\n"
    )
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status", "--json"])
    assert res.exit_code == ExitCode.UNKNOWN
    assert json.loads(res.stdout) == {
        "health": "unknown",
        "health_reason": "gpuagent has been stopped since Mon 2026-11-30 21:40:03 UTC",
    }
    assert res.stderr == ""  # the JSON alone


def test_json_without_a_state_to_judge_is_still_json(tmp_path: str) -> None:
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{tmp_path}/state.json"\n')
    with open(os.path.join(tmp_path, "state.json"), "w") as f:
        f.write('{"schema": 1, "pid": "x"}')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status", "--json"])
    assert res.exit_code == ExitCode.UNKNOWN
    out = json.loads(res.stdout)
    assert out["health"] == "unknown" and "bad 'pid'" in out["health_reason"]
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert (res.exit_code, res.stdout) == (ExitCode.UNKNOWN, "")
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
    fields = {**states.H200, "index": 3, "uuid": "GPU-5c1e0d4a-0000-0000-0000-000000000000"}
    count = states.problem(
        "gpu_count",
        "critical",
        "check_host",
        slot="",
        message="7 NVIDIA GPUs on the PCI bus where expected_gpus is 8",
        since=NOW - 300,
    )
    lost = states.problem("lost", "critical", "reboot")
    st = base(samples={SLOT: states.sample(fields)}, problems={"": [count], SLOT: [lost]})
    code, reason = judge(st, NOW)
    assert code == ExitCode.CRITICAL
    # Worst first: a reboot takes more than a look at the host.
    assert reason == "0000:18:00.0 lost: reboot; host gpu_count: check_host"
    lines = render(st, NOW, code, reason, width=120).splitlines()
    assert (
        "    host: check_host: critical gpu_count: 7 NVIDIA GPUs on the PCI bus where "
        "expected_gpus is 8 (since 5m ago)" in lines
    )
    (row,) = [ln for ln in lines if ln.startswith("    0000:18:00.0")]
    assert row.split()[1:3] == ["3", "CRITICAL"]
    assert lines[lines.index(row) + 1] == "      - reboot: critical lost: m (since 0s ago)"
    lines = render(st, NOW, code, reason, wide=True).splitlines()
    (row,) = [ln for ln in lines if ln.startswith("    0000:18:00.0")]
    assert row.split()[1:4] == ["3", "GPU-5c1e0d4a-0000-0000-0000-000000000000", "CRITICAL"]


def test_text_shows_every_agent_condition_not_only_the_worst() -> None:
    trouble = {"journal": "/var/log/journal: cannot read", "textfile": "ENOSPC"}
    lost = states.problem("lost", "critical", "reboot")
    st = base(problems={SLOT: [lost]}, trouble=trouble)
    code, reason = judge(st, NOW)
    assert code == ExitCode.CRITICAL and "journal" not in reason
    text = render(st, NOW, code, reason)
    assert "    warning: journal: /var/log/journal: cannot read" in text
    assert "    warning: textfile: ENOSPC" in text


def test_a_stale_row_shows_its_old_index_in_brackets() -> None:
    moved = {**states.H200, "index": 0}
    facts: dict[str, Any] = {
        "bus": (states.nvidia(),),
        "samples": {SLOT: states.sample(moved), ABSENT: states.sample(moved, at=NOW - 60)},
        "stale": [ABSENT],
    }
    text = render(base(**facts), NOW, *judge(base(**facts), NOW))
    (current,) = [ln for ln in text.splitlines() if ln.startswith(f"    {SLOT}")]
    (gone,) = [ln for ln in text.splitlines() if ln.startswith(f"    {ABSENT}")]
    assert current.split()[1] == "0"
    assert gone.split()[1] == "(0)"


def test_status_fits_80_columns(tmp_path: str) -> None:
    """COLUMNS=80 gpuagent status: no line over 80 characters, whatever the problems say."""
    now = time.time()
    long = "a message long enough to need wrapping " * 4
    problems = {
        SLOT: [states.problem("lost", "critical", "reboot", message=long, since=now)],
        "": [states.problem("gpu_count", "critical", "check_host", slot="", message=long)],
    }
    st = base(now, problems=problems, trouble={"journal": long})
    conf = write_state(tmp_path, st)
    env = {**os.environ, "COLUMNS": "80"}
    argv = [sys.executable, "-m", "gpuagent", "--config", conf, "status"]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=30)
    assert res.returncode == ExitCode.CRITICAL, res.stderr
    assert [ln for ln in res.stdout.splitlines() if len(ln) > 80] == []
    assert "reboot: critical lost:" in res.stdout
    wide = subprocess.run(
        [*argv, "--wide"], env=env, capture_output=True, text=True, check=False, timeout=30
    )
    assert "NVIDIA H200" in wide.stdout


def test_a_gpu_with_bad_xid_counts_is_malformed() -> None:
    kernel = KernelView({(SLOT, 79): XidCount(79, 1, NOW, NOW, lookup(79), "m")}, {}, {})
    st = base(kernel=kernel)
    assert states.gpu(st)["xids"][0]["count"] == 1
    assert malformed(st) is None
    gpu = {**states.gpu(st), "xids": [{**states.gpu(st)["xids"][0], "count": "1"}]}
    assert malformed({**st, "gpus": [gpu]}) == "gpus"


def test_one_failure_and_one_spawn_are_singular() -> None:
    p = failing(Failure.TIMEOUT, failures=1, spawns_total=1, next_in_ticks=1)
    st = base(probe=p, interval=10.0)
    assert "(timeout, 1 failure, next try in 10 s), 1 spawn," in render(st, NOW, *judge(st, NOW))


def test_a_state_file_it_may_not_read_is_said_not_taken_for_a_stopped_service(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A state directory this user may not search, where systemd says the service stopped.
    monkeypatch.setattr(unitstate, "query", lambda: STOPPED)
    path = os.path.join(tmp_path, "state.json")
    unsearchable(monkeypatch, path)
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{path}"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert (res.exit_code, res.stdout) == (ExitCode.UNKNOWN, "")
    assert res.stderr == f"gpuagent: {path}: cannot read: Permission denied\n"
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status", "--json"])
    assert json.loads(res.stdout)["health_reason"] == f"{path}: cannot read: Permission denied"
