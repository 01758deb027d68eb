"""Drop-ins: PATH.d/*.toml read after PATH in lexical order, each key validated where it is
set, used by every command and by a reload."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from click.testing import CliRunner

from gpuagent import config
from gpuagent.commands.cli import main
from gpuagent.config import Config, ConfigError, dropins, load, load_sources, salvage
from tests import fakehost, fakesysfs
from tests.test_daemon import Notify, start, stop


def write(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


@pytest.fixture
def main_file(tmp_path: str) -> str:
    return write(os.path.join(tmp_path, "gpuagent.toml"), "interval = 5\nbackoff_after = 2\n")


def test_later_files_override_earlier_ones_key_by_key(main_file: str) -> None:
    d = config.dropin_dir(main_file)
    write(f"{d}/20-b.toml", "interval = 3\n")
    write(f"{d}/10-a.toml", "interval = 2\nretry_max = 30\n")
    cfg, sources = load_sources(main_file, required=True)
    assert (cfg.interval, cfg.retry_max, cfg.backoff_after) == (3.0, 30.0, 2)
    assert sources == {
        "interval": f"{d}/20-b.toml",
        "retry_max": f"{d}/10-a.toml",
        "backoff_after": main_file,
    }
    # The probe timeout follows the interval the files end with.
    assert cfg.probe_timeout == round(0.8 * 3, 3)


def test_only_visible_toml_files_count(main_file: str) -> None:
    d = config.dropin_dir(main_file)
    for name in ("x.toml~", "x.toml.dpkg-dist", ".x.toml", "README", "x.conf"):
        write(f"{d}/{name}", "not = [valid\n")
    write(f"{d}/x.toml", "interval = 4\n")
    assert dropins(main_file) == [f"{d}/x.toml"]
    assert load(main_file, required=True).interval == 4.0


def test_no_directory_no_drop_ins(main_file: str) -> None:
    assert dropins(main_file) == []
    assert load(main_file, required=True).interval == 5.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("intervall = 1\n", "unknown key 'intervall'"),
        ("interval = -1\n", "interval: expected seconds between"),
        ("interval = [\n", "not valid TOML"),
        ('textfile = "relative.prom"\n', "textfile: expected an absolute path"),
    ],
)
def test_a_bad_drop_in_is_one_line_naming_it_and_the_key(
    main_file: str, text: str, needle: str
) -> None:
    bad = write(f"{config.dropin_dir(main_file)}/50-bad.toml", text)
    with pytest.raises(ConfigError) as e:
        load(main_file, required=True)
    assert str(e.value).startswith(f"{bad}: ")
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_a_drop_in_that_is_no_file_is_an_error(main_file: str) -> None:
    d = config.dropin_dir(main_file)
    os.makedirs(f"{d}/sub.toml")
    with pytest.raises(ConfigError, match=r"sub\.toml: cannot read: not a regular file"):
        load(main_file, required=True)


def test_an_unlistable_directory_is_an_error(
    main_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(_path: str) -> list[str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "listdir", denied)
    with pytest.raises(ConfigError, match=r"gpuagent\.toml\.d: cannot list the drop-ins: Perm"):
        load(main_file, required=True)


def test_drop_ins_apply_without_the_main_file(tmp_path: str) -> None:
    absent = os.path.join(tmp_path, "gpuagent.toml")
    write(f"{config.dropin_dir(absent)}/a.toml", "interval = 7\n")
    assert load(absent, required=False) == config.with_interval(Config(), 7.0)
    with pytest.raises(ConfigError, match="no such file"):
        load(absent, required=True)


def test_salvage_keeps_the_valid_keys_of_every_file(main_file: str) -> None:
    d = config.dropin_dir(main_file)
    bad = write(f"{d}/10-typo.toml", "interval = 2\nintervall = 1\n")
    write(f"{d}/20-ok.toml", "retry_max = 20\n")
    write(f"{d}/30-broken.toml", "[[[\n")
    cfg, error = salvage(main_file, required=True)
    assert (cfg.interval, cfg.retry_max, cfg.backoff_after) == (2.0, 20.0, 2)
    assert error is not None
    assert str(error).startswith(f"{bad}: unknown key 'intervall'")


def test_check_config_names_each_file(public_dir: str) -> None:
    main_file = write(os.path.join(public_dir, "gpuagent.toml"), "interval = 5\n")
    runner = CliRunner(mix_stderr=False)
    d = config.dropin_dir(main_file)
    a = write(f"{d}/a.toml", "retry_max = 20\n")
    res = runner.invoke(main, ["--config", main_file, "check-config"])
    assert (res.exit_code, res.stdout, res.stderr) == (0, f"{main_file}: OK\n{a}: OK\n", "")
    bad = write(f"{d}/b.toml", "retry_max = 0\n")
    for args in (["--config", main_file, "check-config"], ["check-config", "-q", main_file]):
        res = runner.invoke(main, args)
        assert (res.exit_code, res.stdout) == (78, "")
        assert res.stderr.startswith(f"error: {bad}: retry_max: expected seconds between")
        assert len(res.stderr.splitlines()) == 1


def test_check_config_of_an_absent_default_file_with_drop_ins(
    public_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    absent = os.path.join(public_dir, "gpuagent.toml")
    a = write(f"{config.dropin_dir(absent)}/a.toml", "interval = 7\n")
    monkeypatch.delenv("GPUAGENT_CONFIG", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", absent)
    res = CliRunner(mix_stderr=False).invoke(main, ["check-config"])
    assert (res.exit_code, res.stdout) == (
        0,
        f"{absent}: no such file; the drop-ins and the defaults apply\n{a}: OK\n",
    )


def test_status_and_detect_read_the_drop_ins(tmp_path: str) -> None:
    host = fakehost.create(os.path.join(tmp_path, "host"), 2)
    conf = write(os.path.join(tmp_path, "gpuagent.toml"), "")
    write(f"{config.dropin_dir(conf)}/host.toml", f'sysfs_root = "{host.root}"\n')
    state = os.path.join(host.dir, "state.json")
    write(f"{config.dropin_dir(conf)}/state.toml", f'state_file = "{state}"\n')
    runner = CliRunner(mix_stderr=False)
    res = runner.invoke(main, ["--config", conf, "detect", "--json"])
    assert res.exit_code == 0, res.stderr
    assert [g["slot"] for g in json.loads(res.stdout)["gpus"]] == fakesysfs.gpu_slots(2)
    # A state file that is not one: status names the file it read (with none at all it would
    # ask systemd, where there is one, and name no file).
    write(state, "{")
    res = runner.invoke(main, ["--config", conf, "status"])
    assert res.exit_code == 3
    assert f"{state}: not valid JSON" in res.stderr


def interval(host: fakehost.FakeHost) -> float:
    with open(os.path.join(host.dir, "state.json"), encoding="utf-8") as f:
        return float(json.load(f)["interval"])


def test_run_and_a_reload_read_the_drop_ins(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2, interval=1.0, probe_timeout=fakehost.PATIENT)
    d = config.dropin_dir(host.conf)
    write(f"{d}/10-retry.toml", "retry_max = 9\n")
    notify = Notify(os.path.join(tmp_path, "notify.sock"), abstract=False)
    proc = start(host, notify)
    try:
        notify.wait_for("STATUS=2 GPUs, sampling", 15)
        assert interval(host) == 1.0
        write(f"{d}/20-interval.toml", "interval = 2\n")
        proc.send_signal(signal.SIGHUP)
        notify.wait_for("RELOADING=1", 5)
        notify.wait_for("READY=1", 5)
        deadline = time.monotonic() + 5
        while interval(host) != 2.0:
            assert time.monotonic() < deadline, "the reload's tick wrote no state"
            notify.pump(time.monotonic() + 0.05)
        assert stop(proc)[0] == 0
    finally:
        proc.kill()
        proc.wait()
        notify.sock.close()
    assert proc.stderr is not None
    assert "error" not in proc.stderr.read()


def test_the_shipped_file_says_edits_belong_in_a_drop_in() -> None:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(repo, "packaging", "gpuagent.toml"), encoding="utf-8") as f:
        header = f.read().split("\n\n")[0]
    assert "/etc/gpuagent/gpuagent.toml.d/" in header


def test_read_finds_every_error_of_every_file_in_reading_order(main_file: str) -> None:
    d = config.dropin_dir(main_file)
    write(main_file, "intervall = 5\nretry_max = 0\nbackoff_after = 2\n")
    broken = write(f"{d}/10-broken.toml", "[[[\n")
    typo = write(f"{d}/20-typo.toml", "state_fille = '/run/x.json'\nnvlink_interval = 1\n")
    reading = config.read(main_file, required=True)
    assert [str(e) for e in reading.errors] == [
        f"{main_file}: unknown key 'intervall' (did you mean 'interval'?)",
        f"{main_file}: retry_max: expected seconds between 0.001 and 86400, got 0",
        f"{broken}: not valid TOML: Invalid initial character for a key part (at line 1, column 3)",
        f"{typo}: unknown key 'state_fille' (did you mean 'state_file'?)",
        f"{typo}: nvlink_interval: expected at least one tick (interval 10 s), got 1",
    ]
    assert reading.files == (main_file, typo)
    # What can be used: the valid keys less the refused one.
    assert reading.config.backoff_after == 2
    assert reading.sources == {"backoff_after": main_file}
    with pytest.raises(ConfigError) as e:
        load(main_file, required=True)
    assert str(e.value) == str(reading.errors[0])


def check_config(main_file: str) -> tuple[int, str, list[str]]:
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", main_file, "check-config"])
    return res.exit_code, res.stdout, res.stderr.splitlines()


def test_check_config_says_every_error_of_every_file(public_dir: str) -> None:
    main_file = write(os.path.join(public_dir, "gpuagent.toml"), "intervall = 5\nretry_max = 0\n")
    d = config.dropin_dir(main_file)
    broken = write(f"{d}/10-broken.toml", "interval = [\n")
    typo = write(f"{d}/20-typo.toml", "probe_timout = 3\n")
    code, out, err = check_config(main_file)
    assert (code, out) == (78, "")
    assert [line.split(": ")[1] for line in err] == [main_file, main_file, broken, typo]
    assert all(line.startswith("error: ") for line in err)
    assert "did you mean 'probe_timeout'?" in err[3]


def test_check_config_names_the_drop_in_that_set_a_warned_key(public_dir: str) -> None:
    main_file = write(os.path.join(public_dir, "gpuagent.toml"), "probe_timeout = 6\n")
    d = config.dropin_dir(main_file)
    fast = write(f"{d}/50-fast.toml", "interval = 5\n")
    prom = write(f"{d}/60-prom.toml", f'textfile = "{public_dir}/absent/g.prom"\n')
    code, out, err = check_config(main_file)
    assert (code, out) == (0, f"{main_file}: OK\n{fast}: OK\n{prom}: OK\n")
    assert err[0] == (
        f"gpuagent: warning: {main_file}: probe_timeout (6 s) is not below interval (5 s): a "
        f"hung nvidia-smi stretches a tick to 6 s (interval set in {fast})"
    )
    assert err[1].startswith(f"gpuagent: warning: {prom}: textfile {public_dir}/absent/g.prom")
    assert len(err) == 2
    write(f"{d}/70-slow.toml", "probe_timeout = 7\n")
    code, out, err = check_config(main_file)
    assert err[0].startswith(f"gpuagent: warning: {d}/70-slow.toml: probe_timeout (7 s)")


def test_check_config_names_each_drop_in_it_does_not_read(public_dir: str) -> None:
    main_file = write(os.path.join(public_dir, "gpuagent.toml"), "")
    d = config.dropin_dir(main_file)
    for name in ("60-x.conf", "60-x.tom", "x.toml.dpkg-dist", ".x.toml.swp"):
        write(f"{d}/{name}", "interval = 5\n")
    code, out, err = check_config(main_file)
    assert (code, out) == (0, f"{main_file}: OK\n")
    assert err == [
        f"gpuagent: warning: {d}/{name}: ignored, not read: a drop-in's name must end in .toml"
        for name in ("60-x.conf", "60-x.tom", "x.toml.dpkg-dist")
    ]
    assert config.read(main_file, required=True).ignored == tuple(
        f"{d}/{name}" for name in ("60-x.conf", "60-x.tom", "x.toml.dpkg-dist")
    )
