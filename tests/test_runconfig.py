"""gpuagent.commands.runconfig: the textfile a run writes (the service's own, a hand run's only when
named), its lock, and a hand run without the service's state directory."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from gpuagent import config
from gpuagent.commands.runconfig import RunConfig, files_line, state_dir_problem, textfile_for
from gpuagent.config import Config
from gpuagent.edges import textlink
from gpuagent.edges.lock import AlreadyRunning
from gpuagent.logs import EventLog
from tests import fakehost
from tests.test_daemon import REPO, Notify, start, stop

HAND: dict[str, str] = {}
SERVICE = {"INVOCATION_ID": "0123", "NOTIFY_SOCKET": "/run/systemd/notify"}
PACKAGED = {**SERVICE, "RUNTIME_DIRECTORY": "/run/gpuagent"}


def hand_env() -> dict[str, str]:
    """This process's environment as a shell's would be: nothing from systemd."""
    drop = ("NOTIFY_SOCKET", "INVOCATION_ID", "RUNTIME_DIRECTORY", "JOURNAL_STREAM")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONPATH": REPO}


def hand_run(conf: str) -> subprocess.CompletedProcess[str]:
    """``gpuagent --config CONF run --ticks 1`` as from a shell."""
    return subprocess.run(
        [sys.executable, "-m", "gpuagent", "--config", conf, "run", "--ticks", "1"],
        env=hand_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def read_from(conf: str) -> str:
    """The first line of a hand run on ``conf`` alone."""
    return f"info: configuration read from {conf}; no drop-ins in {conf}.d\n"


def test_a_hand_run_says_first_which_files_it_read(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2)
    d = config.dropin_dir(host.conf)
    os.mkdir(d)
    for name, interval in (("50-site.toml", 7), ("60-x.conf", 9)):
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(f"interval = {interval}\n")
    res = hand_run(host.conf)
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines()[0] == (
        f"info: configuration read from {host.conf}, {d}/50-site.toml; not read (a drop-in's "
        f"name must end in .toml): {d}/60-x.conf"
    )
    # FILE.d's drop-in is read as the service reads its own: its settings hold.
    with open(os.path.join(tmp_path, "state.json"), encoding="utf-8") as f:
        assert json.load(f)["interval"] == 7


def test_the_first_line_names_what_was_not_read(tmp_path: str) -> None:
    absent = os.path.join(tmp_path, "absent.toml")
    reading = config.read(absent, required=False)
    assert files_line(absent, reading, []) == (
        f"configuration: the defaults; {absent}: no such file; no drop-ins in {absent}.d"
    )
    service = ["/etc/gpuagent/gpuagent.toml.d/50-site.toml", "/etc/gpuagent/gpuagent.toml.d/x.toml"]
    assert files_line(absent, reading, service).endswith(
        "; not the service's 2 drop-ins in /etc/gpuagent/gpuagent.toml.d"
    )


def test_a_hand_run_writes_no_textfile_unless_it_names_one(tmp_path: str) -> None:
    cfg = Config()
    textfile, note = textfile_for(cfg, {}, HAND)
    assert textfile == ""
    assert note is not None
    assert note.startswith("not started by systemd, and no textfile set: writing no Prometheus")
    own = os.path.join(tmp_path, "mine.prom")
    named = Config(textfile=own)
    assert textfile_for(named, {"textfile": "/root/try.toml"}, HAND) == (own, None)
    assert textfile_for(Config(textfile=""), {"textfile": "x"}, HAND) == ("", None)


def test_the_packaged_service_writes_its_own_file(tmp_path: str) -> None:
    there = Config(textfile=os.path.join(tmp_path, "gpuagent.prom"))
    assert textfile_for(there, {}, PACKAGED) == (textlink.RUN_FILE, None)
    # No node_exporter yet: its own file all the same, and a line that says so.
    absent = Config(textfile=os.path.join(tmp_path, "absent", "gpuagent.prom"))
    textfile, note = textfile_for(absent, {}, PACKAGED)
    assert textfile == textlink.RUN_FILE
    assert note is not None and "is prometheus-node-exporter installed?" in note
    # Another unit (systemd-run, say) writes where it is told.
    assert textfile_for(there, {}, SERVICE) == (there.textfile, None)
    assert textfile_for(Config(textfile=""), {}, PACKAGED) == ("", None)


def test_runconfig_says_its_note_once(tmp_path: str) -> None:
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(f'state_file = "{tmp_path}/state.json"\n')
    lines: list[str] = []
    logger = logging.getLogger("test-runconfig")
    logger.propagate = False
    logger.setLevel(logging.INFO)

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger.addHandler(Capture())
    load = RunConfig(EventLog(logger), env=HAND)
    assert load(conf, True).textfile == ""
    assert load(conf, True).textfile == ""  # a reload: nothing new to say
    assert len(lines) == 1, lines
    assert "writing no Prometheus metrics" in lines[0]


def test_two_agents_never_write_one_textfile(tmp_path: str) -> None:
    target = os.path.join(tmp_path, "gpuagent.prom")
    link = os.path.join(tmp_path, "link.prom")
    os.symlink(target, link)
    confs = []
    for name, textfile in (("a", target), ("b", link), ("c", os.path.join(tmp_path, "c.prom"))):
        conf = os.path.join(tmp_path, f"{name}.toml")
        with open(conf, "w", encoding="utf-8") as f:
            f.write(f'state_file = "{tmp_path}/{name}.json"\ntextfile = "{textfile}"\n')
        confs.append(conf)
    first = RunConfig(EventLog(), env=HAND)
    first(confs[0], True)
    second = RunConfig(EventLog(), env=HAND)
    with pytest.raises(AlreadyRunning, match=r"already running \(pid \d+\): .*\.prom\.lock"):
        second(confs[1], True)  # the same file through a link
    second(confs[2], True)
    # A reload onto the first one's textfile fails, and keeps the lock it had.
    with pytest.raises(AlreadyRunning):
        second(confs[0], True)
    assert second.lock.path == os.path.join(tmp_path, "c.prom.lock")
    first.lock.release()
    second.lock.release()


def test_a_hand_run_beside_an_agent_on_its_textfile_exits_75(tmp_path: str) -> None:
    host = fakehost.create(
        os.path.join(tmp_path, "host"), 2, interval=1.0, probe_timeout=fakehost.PATIENT
    )
    conf = os.path.join(tmp_path, "try.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(
            f'state_file = "{tmp_path}/try.json"\ntextfile = "{host.dir}/gpuagent.prom"\n'
            f'sysfs_root = "{host.root}"\nnvidia_smi = "{host.smi}"\n'
        )
    notify = Notify(os.path.join(tmp_path, "notify.sock"), abstract=False)
    proc = start(host, notify)
    try:
        notify.wait_for("STATUS=2 GPUs, sampling", 15)
        second = hand_run(conf)
        assert second.returncode == 75, second.stderr
        assert second.stderr == (
            f"{read_from(conf)}error: not starting: already running (pid {proc.pid}): "
            f"{host.dir}/gpuagent.prom.lock is locked\n"
        )
        assert not os.path.exists(os.path.join(tmp_path, "try.json"))
        assert os.path.getsize(os.path.join(host.dir, "gpuagent.prom")) > 0
        assert stop(proc)[0] == 0
    finally:
        proc.kill()
        proc.wait()
        notify.sock.close()


def test_a_hand_run_without_a_textfile_says_so_and_writes_none(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2)
    with open(host.conf, encoding="utf-8") as f:
        text = "".join(line for line in f if not line.startswith("textfile"))
    with open(host.conf, "w", encoding="utf-8") as f:
        f.write(text)
    res = hand_run(host.conf)
    assert res.returncode == 0, res.stderr
    said = [ln for ln in res.stderr.splitlines() if "Prometheus" in ln]
    assert said == [
        "info: not started by systemd, and no textfile set: writing no Prometheus metrics "
        f"({Config().textfile} is the service's; set textfile to write some)"
    ]
    with open(os.path.join(tmp_path, "state.json"), encoding="utf-8") as f:
        st = json.load(f)
    assert st["ticks"] == 1
    assert "textfile" not in st["problems"]


def test_without_the_services_state_directory_a_hand_run_says_how(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os.path, "isdir", lambda _path: False)
    problem = state_dir_problem(Config(), HAND)
    assert problem is not None
    assert problem.startswith("/run/gpuagent, the service's state directory, is not there")
    assert "--config FILE, FILE setting another state_file" in problem
    assert state_dir_problem(Config(), SERVICE) is None


def test_a_state_file_in_no_directory_exits_78(tmp_path: str) -> None:
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(f'state_file = "{tmp_path}/absent/state.json"\n')
    res = hand_run(conf)
    assert (res.returncode, res.stderr) == (
        config.EX_CONFIG,
        f"{read_from(conf)}error: not starting: state_file {tmp_path}/absent/state.json: "
        f"{tmp_path}/absent does not exist\n",
    )
