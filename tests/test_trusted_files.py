"""The files the agent and root's commands trust: never through a planted symlink, never
hung on a FIFO, never eaten by a huge or deep file, synced before they count as written."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent import config, state
from gpuagent.commands.cli import main
from gpuagent.edges import safefile, textlink
from gpuagent.edges.lock import NotALock, StateLock, lock_path
from gpuagent.logs import EventLog
from gpuagent.publish import Textfile
from gpuagent.sources.bus.known import KnownGpus
from gpuagent.sources.nvlink.linksup import LinksUp
from tests.test_metrics import SNAP, recorder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An unprivileged owner for planted files (the tests run as root).
OTHER = 12345
# A command that would hang does not get longer than this.
DEADLINE = 30


def victim(tmp_path: str) -> str:
    path = os.path.join(tmp_path, "victim")
    with open(path, "w") as f:
        f.write("precious\n")
    return path


def untouched(path: str) -> bool:
    with open(path) as f:
        return f.read() == "precious\n"


def test_symlink_planted_at_the_lock_is_not_followed_nor_a_second_agent(tmp_path: str) -> None:
    target = victim(tmp_path)
    st = os.path.join(tmp_path, "state.json")
    os.symlink(target, lock_path(st))
    with pytest.raises(NotALock, match=r"state\.json\.lock is a symbolic link"):
        StateLock().acquire(st)
    assert untouched(target)


def test_fifo_at_the_lock_is_refused(tmp_path: str) -> None:
    st = os.path.join(tmp_path, "state.json")
    os.mkfifo(lock_path(st))
    with pytest.raises(NotALock, match="not a regular file"):
        StateLock().acquire(st)


def test_symlink_planted_at_the_state_files_temp_name_is_not_written_through(
    tmp_path: str,
) -> None:
    target = victim(tmp_path)
    path = os.path.join(tmp_path, "state.json")
    os.symlink(target, os.path.join(tmp_path, f".state.json.{os.getpid()}.tmp"))
    state.write(path, {"schema": 1})
    assert untouched(target)
    with open(path) as f:
        assert json.load(f) == {"schema": 1}


def test_symlink_at_the_state_file_is_not_read(tmp_path: str) -> None:
    target = victim(tmp_path)
    path = os.path.join(tmp_path, "state.json")
    os.symlink(target, path)
    with pytest.raises(state.StateError, match="symbolic link"):
        state.read(path)


def fifo_state(tmp_path: str) -> str:
    path = os.path.join(tmp_path, "state.json")
    os.mkfifo(path)
    conf = os.path.join(tmp_path, "gpuagent.toml")
    with open(conf, "w") as f:
        f.write(f'state_file = "{path}"\ntextfile = ""\n')
    return conf


@pytest.mark.parametrize("command", [["status"], ["slurm-check"]])
def test_fifo_at_the_state_file_does_not_hang_status_or_slurm_check(
    tmp_path: str, command: list[str]
) -> None:
    conf = fifo_state(tmp_path)
    env = {**os.environ, "PYTHONPATH": REPO, "SLURMD_NODENAME": "n1"}
    res = subprocess.run(
        [sys.executable, "-m", "gpuagent", "--config", conf, *command],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env=env,
        check=False,
    )
    said = (res.stdout + res.stderr).strip()
    assert "not a regular file" in said
    assert len(said.splitlines()) == 1
    assert "Traceback" not in said


def test_fsync_before_the_rename_and_of_the_directory(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = os.path.join(tmp_path, "state.json")
    state.write(path, {"schema": 1})
    assert synced == [os.path.join(tmp_path, f".state.json.{os.getpid()}.tmp"), str(tmp_path)]


def test_textfile_and_statedir_files_are_fsynced(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log, _ = recorder()
    Textfile(os.path.join(tmp_path, "gpuagent.prom"), log).write(SNAP)
    assert len(calls) == 2
    known = KnownGpus(str(tmp_path), EventLog(logging.getLogger("t")), boot="b")
    known.update({"0000:18:00.0": {"uuid": "GPU-1", "name": "A100"}})
    assert len(calls) == 4


def test_textfile_does_not_follow_a_symlink_another_user_planted(tmp_path: str) -> None:
    target = victim(tmp_path)
    exporter = os.path.join(tmp_path, "node-exporter")
    os.makedirs(exporter)
    link = os.path.join(exporter, "gpuagent.prom")
    os.symlink(target, link)
    os.lchown(link, OTHER, OTHER)
    log, logs = recorder()
    textfile = Textfile(link, log)
    textfile.write(SNAP)
    textfile.remove()
    assert untouched(target)
    assert textfile.problem is not None
    assert "not followed" in textfile.problem
    assert len(logs.records) == 1


def test_link_textfile_does_not_follow_a_directory_another_user_swapped_in(
    tmp_path: str,
) -> None:
    elsewhere = os.path.join(tmp_path, "etc")
    os.makedirs(elsewhere)
    prometheus = os.path.join(tmp_path, "prometheus")
    os.makedirs(prometheus)
    os.chown(prometheus, OTHER, OTHER)
    exporter = os.path.join(prometheus, "node-exporter")
    os.symlink(elsewhere, exporter)
    os.lchown(exporter, OTHER, OTHER)
    run = os.path.join(tmp_path, "run")
    os.makedirs(run)
    with pytest.raises(PermissionError, match="not followed"):
        textlink.link(os.path.join(exporter, "gpuagent.prom"), [], os.path.join(run, "g.prom"))
    assert os.listdir(elsewhere) == []


def test_link_textfile_follows_roots_own_symlinked_directory(tmp_path: str) -> None:
    real = os.path.join(tmp_path, "real")
    os.makedirs(real)
    exporter = os.path.join(tmp_path, "node-exporter")
    os.symlink(real, exporter)
    run = os.path.join(tmp_path, "run")
    os.makedirs(run)
    path = os.path.join(exporter, "gpuagent.prom")
    assert textlink.link(path, [], os.path.join(run, "g.prom")) == path
    assert os.listdir(real) == ["gpuagent.prom"]


def known(directory: str) -> tuple[KnownGpus, list[logging.LogRecord]]:
    log, logs = recorder()
    return KnownGpus(directory, log, boot="b"), logs.records


def links(directory: str) -> tuple[LinksUp, list[logging.LogRecord]]:
    log, logs = recorder()
    return LinksUp(directory, log, boot="b"), logs.records


GOOD: dict[str, Any] = {
    "gpus.json": {"gpus": [{"pci_slot": "0000:18:00.0", "uuid": "GPU-1", "name": "A100"}]},
    "nvlink.json": {"boot_id": "b", "links_up": {"GPU-1": [0, 1]}},
}
BAD: dict[str, list[str]] = {
    "deep": ["[" * 100_000 + "]" * 100_000],
    "huge": [
        json.dumps({"gpus": [], "pad": "x" * (2 * 1024 * 1024)}),
        json.dumps({"boot_id": "b", "links_up": {}, "pad": "x" * (2 * 1024 * 1024)}),
    ],
    "nan": [
        '{"gpus": [{"pci_slot": "0000:18:00.0", "gone_at": NaN}]}',
        '{"boot_id": "b", "links_up": {"GPU-1": [Infinity]}}',
    ],
    "shape": [
        '{"gpus": [{"pci_slot": "0000:18:00.0", "uuid": 5}]}',
        '{"boot_id": "b", "links_up": {"GPU-1": [true, -1]}}',
    ],
}


@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize("name", ["gpus.json", "nvlink.json"])
def test_deep_huge_nan_or_misshapen_statedir_json_starts_with_nothing_remembered(
    tmp_path: str, kind: str, name: str
) -> None:
    texts = BAD[kind]
    text = texts[0] if len(texts) == 1 or name == "gpus.json" else texts[1]
    with open(os.path.join(tmp_path, name), "w") as f:
        f.write(text)
    remembered, records = known(str(tmp_path)) if name == "gpus.json" else links(str(tmp_path))
    assert not getattr(remembered, "gpus" if name == "gpus.json" else "links")
    assert remembered.error is not None
    assert name in remembered.error
    assert len(remembered.error.splitlines()) == 1
    assert [r.levelno for r in records] == [logging.WARNING]


@pytest.mark.parametrize("name", ["gpus.json", "nvlink.json"])
def test_statedir_json_that_is_sound_is_remembered(tmp_path: str, name: str) -> None:
    with open(os.path.join(tmp_path, name), "w") as f:
        json.dump(GOOD[name], f)
    remembered, _ = known(str(tmp_path)) if name == "gpus.json" else links(str(tmp_path))
    assert getattr(remembered, "gpus" if name == "gpus.json" else "links")
    assert remembered.error is None


@pytest.mark.parametrize("name", ["gpus.json", "nvlink.json"])
def test_symlink_planted_at_a_statedir_file_is_not_read_nor_written_through(
    tmp_path: str, name: str
) -> None:
    target = victim(tmp_path)
    directory = os.path.join(tmp_path, "state")
    os.makedirs(directory)
    os.symlink(target, os.path.join(directory, name))
    remembered, _ = known(directory) if name == "gpus.json" else links(directory)
    assert remembered.error is not None
    assert "symbolic link" in remembered.error
    if isinstance(remembered, KnownGpus):
        remembered.update({"0000:18:00.0": {"uuid": "GPU-1", "name": "A100"}})
    else:
        remembered.update({"GPU-1": {0}})
    assert untouched(target)
    assert not os.path.islink(os.path.join(directory, name))  # replaced by the agent's file


def test_read_regular_reads_at_most_its_bound(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "f")
    with open(path, "wb") as f:
        f.write(b"x" * 11)
    assert safefile.read_regular(path, 11) == b"x" * 11
    with pytest.raises(OSError, match="larger than 10 bytes"):
        safefile.read_regular(path, 10)


def test_check_config_fails_a_dangling_drop_in(public_dir: str) -> None:
    main_file = os.path.join(public_dir, "gpuagent.toml")
    with open(main_file, "w") as f:
        f.write("interval = 5\n")
    d = config.dropin_dir(main_file)
    os.makedirs(d)
    dangling = os.path.join(d, "50-site.toml")
    os.symlink("/nonexistent/site.toml", dangling)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", main_file, "check-config"])
    assert res.exit_code == config.EX_CONFIG
    assert res.stderr.startswith(f"error: {dangling}: a dangling symlink")
    assert len(res.stderr.splitlines()) == 1
    with pytest.raises(config.ConfigError, match="dangling symlink"):
        config.load(main_file, required=True)
