"""A bad file never stops the service: it starts on the file's valid settings with the agent
problem ``config`` (state, STATUS, textfile), a reload still refuses the file, and a good
reload ends the problem; a run by hand still refuses it (tests/test_status.py: exit 78)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from gpuagent import config
from gpuagent.commands.runconfig import RunConfig, config_problem
from gpuagent.config import ConfigError
from gpuagent.daemon import CONFIG, Daemon
from gpuagent.logs import Event
from tests import fakehost
from tests.test_daemon import Notify, stop
from tests.test_metrics import recorder, with_id
from tests.test_runconfig import hand_env

TYPO = "intervall = 5\n"


def bad_host(directory: str) -> tuple[fakehost.FakeHost, str]:
    """A fake host whose config is good and whose drop-in has the issue's typo."""
    host = fakehost.create(directory, 2, interval=10, probe_timeout=fakehost.PATIENT)
    dropin = os.path.join(config.dropin_dir(host.conf), "50-site.toml")
    os.mkdir(os.path.dirname(dropin))
    with open(dropin, "w", encoding="utf-8") as f:
        f.write("retry_max = 30\n" + TYPO)
    return host, dropin


def test_the_problem_names_the_first_error_and_counts_the_others() -> None:
    assert config_problem([]) is None
    one = ConfigError("/etc/x.toml: intervall: unknown key")
    assert config_problem([one]) == (
        "/etc/x.toml: intervall: unknown key; running on the valid settings: fix the file, "
        "`gpuagent check-config`, then reload"
    )
    problem = config_problem([one, ConfigError("b"), ConfigError("c")])
    assert problem is not None
    assert problem.startswith("/etc/x.toml: intervall: unknown key (+2 more); running on")


def test_only_a_salvaging_resolve_runs_on_the_valid_settings(tmp_path: str) -> None:
    host, dropin = bad_host(str(tmp_path))
    load = RunConfig(recorder()[0], env={})
    with pytest.raises(ConfigError, match="intervall"):
        load.resolve(host.conf, True)
    # The files it read are named all the same: a refusing run says so first.
    assert load.files.startswith(f"configuration read from {host.conf}, {dropin}")
    cfg, _ = load.resolve(host.conf, True, salvage=True)
    assert (cfg.interval, cfg.retry_max, cfg.sysfs_root) == (10, 30, host.root)
    assert [str(e).split(" (")[0] for e in load.errors] == [f"{dropin}: unknown key 'intervall'"]


def first_tick(state_file: str, run: subprocess.Popen[str]) -> dict[str, Any]:
    """The state once the agent has written its first tick; at most 60 s (a busy machine)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with open(state_file, encoding="utf-8") as f:
                state: dict[str, Any] = json.load(f)
            if state["ticks"] >= 1:
                return state
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        assert run.poll() is None, "the agent exited"
        assert time.monotonic() < deadline, "no tick written"
        time.sleep(0.05)


def written(path: str, run: subprocess.Popen[str]) -> str:
    """The file ``path`` once the agent has written it; at most 60 s (a busy machine)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            pass
        assert run.poll() is None, "the agent exited"
        assert time.monotonic() < deadline, f"{path} not written"
        time.sleep(0.05)


def test_the_service_starts_on_a_bad_file_and_says_so_everywhere(tmp_path: str) -> None:
    host, dropin = bad_host(str(tmp_path))
    notify = Notify(os.path.join(tmp_path, "notify"), abstract=False)
    run = subprocess.Popen(
        [sys.executable, "-m", "gpuagent", "--config", host.conf, "run"],
        env={**hand_env(), "NOTIFY_SOCKET": notify.address},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        state = first_tick(os.path.join(tmp_path, "state.json"), run)
        # The textfile and STATUS follow the state file: waited for, on a busy machine too.
        metrics = written(os.path.join(tmp_path, "gpuagent.prom"), run)
        deadline = time.monotonic() + 60
        while not any("agent problem: config" in m for m in notify.texts()):
            assert time.monotonic() < deadline, "no STATUS with the config problem"
            notify.pump(time.monotonic() + 0.2)
    finally:
        code, _ = stop(run)
    assert code == 0
    assert run.stderr is not None
    read, error = run.stderr.read().splitlines()[:2]
    assert read.startswith(f"info: configuration read from {host.conf}, {dropin}")
    assert error.startswith(f"error: {dropin}: unknown key 'intervall'")
    assert error.endswith("; not used")
    assert state["problems"][CONFIG].startswith(f"{dropin}: unknown key 'intervall'")
    assert state["interval"] == 10  # the main file's, the drop-in's valid key kept too
    assert state["status"].endswith("; agent problem: config")
    assert 'gpuagent_agent_problem{kind="config"} 1.0\n' in metrics


def test_a_reload_refuses_a_bad_file_and_a_good_one_ends_the_problem(tmp_path: str) -> None:
    host, dropin = bad_host(str(tmp_path))
    log, logs = recorder()
    load = RunConfig(log, env={})
    cfg, _ = load.resolve(host.conf, True, salvage=True)
    daemon = Daemon(cfg, (host.conf, True), log=log, load=load, problem=config_problem(load.errors))
    assert CONFIG in daemon.step().state["problems"]
    with open(dropin, "w", encoding="utf-8") as f:
        f.write("retry_max = 20\n" + TYPO)
    daemon.reload()
    assert daemon.config.retry_max == 30  # the old settings kept, the problem too
    assert CONFIG in daemon.step().state["problems"]
    refused = with_id(logs, Event.CONFIG_ERROR)
    assert len(refused) == 1 and "reload failed, keeping the old config" in refused[0].getMessage()
    with open(dropin, "w", encoding="utf-8") as f:
        f.write("retry_max = 20\n")
    daemon.reload()
    report = daemon.step()
    assert daemon.config.retry_max == 20
    assert CONFIG not in report.state["problems"]
    assert "agent problem" not in report.status
    daemon.finish("ticks")
