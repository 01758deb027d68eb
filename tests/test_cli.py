"""``gpuagent detect`` and ``gpuagent probe`` through the CLI on fake hosts."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent import config
from gpuagent.commands.cli import main
from gpuagent.sources.probe.smi import FIELDS
from tests import fakehost, fakesysfs, replay
from tests.fakehost import H200_LOAD


def test_detect_and_probe_on_a_fake_host(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2)
    runner = CliRunner(mix_stderr=False)
    res = runner.invoke(main, ["--config", host.conf, "detect", "--json"])
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert [g["slot"] for g in out["gpus"]] == host.slots
    assert out["module_loaded"] is True
    res = runner.invoke(main, ["--config", host.conf, "probe", "--json"])
    assert res.exit_code == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert [r["pci.bus_id"] for r in rows] == ["00000000:18:00.0", "00000000:2A:00.0"]


def test_probe_keeps_the_driver_gate(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2)
    fakesysfs.set_module(host.root, False)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "probe"])
    assert res.exit_code == 3  # unknown: no answer
    assert "not loaded" in res.stderr
    assert host.spawns == 0


def test_probe_failure_is_one_line(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2)
    host.failing()
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "probe"])
    assert res.exit_code == 3
    assert res.stderr.startswith("gpuagent: probe failed (version_mismatch): exit 18: ")
    assert len(res.stderr.strip().splitlines()) == 1


def no_gpu_host(tmp_path: str) -> str:
    """A host with only a BMC's VGA function; returns its config file."""
    fakesysfs.add_device(tmp_path, "0000:03:00.0", 0x1A03, 0x2000, 0x030000, "ast")
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'sysfs_root = "{tmp_path}"\n')
    return conf


def test_detect_human_output_without_a_gpu(tmp_path: str) -> None:
    conf = no_gpu_host(tmp_path)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "detect"])
    assert res.exit_code == 0
    assert res.stdout.splitlines()[0] == "no NVIDIA GPU on the PCI bus"


def test_empty_config_path_is_refused() -> None:
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", "", "status"])
    assert res.exit_code == 78
    assert "--config" in res.stderr


def test_detect_fails_when_sysfs_cannot_be_read(tmp_path: str) -> None:
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'sysfs_root = "{tmp_path}/nonexistent"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "detect"])
    assert res.exit_code == 1
    assert "cannot list PCI devices" in res.stderr


@pytest.mark.parametrize("command", ["detect", "probe"])
def test_a_bus_it_may_not_read_is_one_line(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    host = fakehost.create(str(tmp_path), 1)
    real = os.scandir

    def refused(path: str) -> Any:
        # As root a mode refuses nothing: the refusal another user would get.
        if path.endswith("/bus/pci/devices"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", refused)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, command])
    assert res.exit_code == (3 if command == "probe" else 1)
    assert res.stderr == (
        f"gpuagent: {host.root}/bus/pci/devices: cannot list PCI devices: Permission denied\n"
    )


def test_probe_output_is_stripped_of_control_characters(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 1)
    rows, _ = replay.answer(
        replay.load(H200_LOAD), list(FIELDS), "csv,noheader,nounits", host.slots
    )
    host.scenario(stdout=rows.replace("NVIDIA H200", "evil\x1b]0;pwned\x07name"), exit=0)
    conf = os.path.join(tmp_path, "probe.toml")
    with open(conf, "w") as f:
        f.write(f'sysfs_root = "{host.root}"\nnvidia_smi = "{host.smi}"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "probe"])
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[1].split()[:2] == [host.slots[0], "evil?]0;pwned?name"]
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout


def test_probe_prints_a_dash_where_nvidia_smi_said_nothing(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 1)
    rows, _ = replay.answer(
        replay.load(H200_LOAD), list(FIELDS), "csv,noheader,nounits", host.slots
    )
    first, rest = rows.split(", ", 1)
    host.scenario(stdout=f"{first}, , {rest.split(', ', 1)[1]}", exit=0)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "probe", "--json"])
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    (row,), (said,) = out["rows"], out["reasons"]
    assert row[FIELDS[1]] is None and FIELDS[1] not in said  # nothing said, no bracket
    # "None" is nvidia-smi's own word for gpu_recovery_action; no other value may read so.
    assert [k for k, v in row.items() if v == "None"] == ["gpu_recovery_action"]


def test_probe_without_a_gpu_does_not_blame_the_module(tmp_path: str) -> None:
    conf = no_gpu_host(tmp_path)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "probe"])
    assert res.exit_code == 3
    assert res.stderr == "gpuagent: no NVIDIA GPU on the PCI bus at all; nothing to probe\n"


def test_a_bare_gpuagent_shows_its_help() -> None:
    res = CliRunner(mix_stderr=False).invoke(main, [])
    assert (res.exit_code, res.stderr) == (0, "")
    assert res.stdout.startswith("Usage: ") and "Commands:" in res.stdout


def test_dash_v_is_the_version() -> None:
    res = CliRunner(mix_stderr=False).invoke(main, ["-V"])
    assert res.exit_code == 0 and res.stdout.startswith("gpuagent, version ")


@pytest.mark.parametrize("command", ["status", "probe"])
def test_a_checking_commands_usage_error_is_unknown_for_nagios(command: str) -> None:
    # A typo'd option: Nagios reads click's 2 as CRITICAL; it is UNKNOWN, 3.
    res = CliRunner(mix_stderr=False).invoke(main, [command, "--jsno"])
    assert res.exit_code == 3
    assert "No such option: --jsno" in res.stderr


def test_another_commands_usage_error_is_still_2() -> None:
    assert CliRunner(mix_stderr=False).invoke(main, ["detect", "--jsno"]).exit_code == 2
    assert CliRunner(mix_stderr=False).invoke(main, ["no-such-command"]).exit_code == 2


def test_probe_exits_as_status_does_on_a_warning(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2)
    host.healthy(override={host.slots[0]: {"retired_pages.pending": "Yes"}})
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "probe"])
    assert res.exit_code == 1, res.stdout
    assert "warning retired_pages_pending" in res.stdout
    host.healthy()
    assert CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "probe"]).exit_code == 0


def test_help_lists_the_commands_for_people_only() -> None:
    res = CliRunner(mix_stderr=False).invoke(main, ["--help"])
    assert res.exit_code == 0
    listed = {line.split()[0] for line in res.stdout.split("Commands:")[1].splitlines() if line}
    assert listed == {
        "check-config",
        "clear",
        "detect",
        "evidence",
        "history",
        "probe",
        "rma",
        "run",
        "slurm-check",
        "status",
        "victims",
    }


def test_check_config(public_dir: str) -> None:
    tmp_path = public_dir
    conf = os.path.join(tmp_path, "c.toml")
    runner = CliRunner(mix_stderr=False)
    with open(conf, "w") as f:
        f.write("interval = 5\n")
    res = runner.invoke(main, ["check-config", conf])
    assert (res.exit_code, res.stdout, res.stderr) == (0, f"{conf}: OK\n", "")
    with open(conf, "w") as f:
        f.write("intervall = 5\n")
    res = runner.invoke(main, ["--config", conf, "check-config"])
    assert res.exit_code == 78
    assert res.stdout == ""
    assert res.stderr.startswith(f"error: {conf}: unknown key 'intervall'")
    assert len(res.stderr.splitlines()) == 1
    with open(conf, "w") as f:
        f.write("interval = 5\nprobe_timeout = 6\n")
    res = runner.invoke(main, ["check-config", conf])
    assert (res.exit_code, res.stdout) == (0, f"{conf}: OK\n")
    assert res.stderr.startswith(f"gpuagent: warning: {conf}: probe_timeout (6 s) is not below")
    # What a reload runs: nothing in the journal when it is OK, warnings still.
    quiet = runner.invoke(main, ["check-config", "--quiet", conf])
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", res.stderr)
    with open(conf, "w") as f:
        f.write("interval = -1\n")
    quiet = runner.invoke(main, ["check-config", "-q", conf])
    assert quiet.exit_code == 78
    assert quiet.stderr.startswith(f"error: {conf}: ")
    absent = os.path.join(tmp_path, "absent.toml")
    assert runner.invoke(main, ["check-config", absent]).exit_code == 78


def test_check_config_warns_of_an_nvidia_smi_it_cannot_find(public_dir: str) -> None:
    conf = os.path.join(public_dir, "c.toml")
    runner = CliRunner(mix_stderr=False)
    with open(conf, "w") as f:
        f.write('nvidia_smi = "/nonexistent/nvidia-smi"\n')
    res = runner.invoke(main, ["check-config", conf])
    assert (res.exit_code, res.stdout) == (0, f"{conf}: OK\n")
    assert res.stderr == (
        f"gpuagent: warning: {conf}: nvidia_smi '/nonexistent/nvidia-smi' is not found: the "
        "agent would report nvidia_smi_missing, or fail to run it, while GPUs are on the bus\n"
    )
    with open(conf, "w") as f:
        f.write('nvidia_smi = "no-such-nvidia-smi"\n')
    res = runner.invoke(main, ["check-config", conf])
    assert "is not found in the service's PATH (/usr/local/sbin:" in res.stderr
    # The default, unset, is no news on a host without the driver.
    with open(conf, "w") as f:
        f.write("interval = 10\n")
    assert runner.invoke(main, ["check-config", conf]).stderr == ""


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ('severity = "critical", count = 3, window = 600', None),
        ('severity = "critical", count = 3', "xid.31.count: needs window too"),
        ('severity = "critical", window = 600', "xid.31.window: needs count too"),
        ('severity = "critical", count = 1, window = 600', "xid.31.count: expected an integer"),
        ('severity = "critical", count = 3, window = 0', "xid.31.window: expected seconds"),
    ],
)
def test_check_config_of_a_count_within_a_window(
    public_dir: str, entry: str, error: str | None
) -> None:
    conf = os.path.join(public_dir, "c.toml")
    with open(conf, "w") as f:
        f.write(f"[xid]\n31 = {{ {entry} }}\n")
    res = CliRunner(mix_stderr=False).invoke(main, ["check-config", conf])
    if error is None:
        assert (res.exit_code, res.stdout, res.stderr) == (0, f"{conf}: OK\n", "")
    else:
        assert (res.exit_code, res.stdout) == (78, "")
        assert res.stderr.startswith(f"error: {conf}: {error}")
        assert len(res.stderr.splitlines()) == 1


def test_check_config_warns_of_what_the_packaged_service_cannot_do(public_dir: str) -> None:
    conf = os.path.join(public_dir, "c.toml")
    journal = os.path.join(public_dir, "journal")
    os.mkdir(journal, 0o700)
    with open(conf, "w") as f:
        f.write(
            'state_file = "/var/lib/gpuagent/state.json"\n'
            f'textfile = "{public_dir}/absent/gpuagent.prom"\n'
            f'journal_directory = "{journal}"\n'
        )
    os.chmod(conf, 0o600)
    res = CliRunner(mix_stderr=False).invoke(main, ["check-config", conf])
    assert (res.exit_code, res.stdout) == (0, f"{conf}: OK\n")
    lines = res.stderr.splitlines()
    assert len(lines) == 4, res.stderr
    assert lines[0].startswith(
        f"gpuagent: warning: {conf}: other users may not read it (mode 0600)"
    )
    assert "'/var/lib/gpuagent/state.json' is outside /run/gpuagent" in lines[1]
    assert lines[2].startswith(
        f"gpuagent: warning: {conf}: textfile {public_dir}/absent/gpuagent.prom: its directory "
        f"{public_dir}/absent does not exist"
    )
    assert lines[3].startswith(
        f"gpuagent: warning: {conf}: journal_directory {journal}: other users may not read it"
    )


def test_check_config_fails_on_a_file_the_service_could_not_read(
    public_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = os.path.join(public_dir, "gpuagent.toml")
    with open(conf, "w") as f:
        f.write("interval = 5\n")
    monkeypatch.delenv("GPUAGENT_CONFIG", raising=False)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", conf)
    runner = CliRunner(mix_stderr=False)
    res = runner.invoke(main, ["check-config"])
    assert (res.exit_code, res.stdout, res.stderr) == (0, f"{conf}: OK\n", "")
    # A drop-in written with root's umask 077: the service's own, so an error.
    dropin = os.path.join(config.dropin_dir(conf), "50-site.toml")
    os.mkdir(config.dropin_dir(conf), 0o755)
    with open(dropin, "w") as f:
        f.write("retry_max = 30\n")
    os.chmod(dropin, 0o600)
    for args in (["check-config"], ["check-config", "--quiet"], ["check-config", conf]):
        res = runner.invoke(main, args)
        assert (res.exit_code, res.stdout) == (78, ""), res.stderr
        assert res.stderr == (
            f"error: {dropin}: other users may not read it (mode 0600), and the packaged "
            "service (user gpuagent) is one: it would fail to start or reload "
            "(chmod o+r, or group video)\n"
        )
    # Another path: a warning is enough.
    other = os.path.join(public_dir, "try.toml")
    with open(other, "w") as f:
        f.write("")
    os.chmod(other, 0o600)
    res = runner.invoke(main, ["check-config", other])
    assert res.exit_code == 0
    assert res.stderr.startswith(f"gpuagent: warning: {other}: other users may not read it")


def test_check_config_of_an_absent_default_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUAGENT_CONFIG", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", "/nonexistent/gpuagent.toml")
    res = CliRunner(mix_stderr=False).invoke(main, ["check-config"])
    assert (res.exit_code, res.stdout) == (
        0,
        "/nonexistent/gpuagent.toml: no such file; the defaults apply\n",
    )


def test_reload_signals_the_pid_it_is_given(tmp_path: str) -> None:
    # The child takes SIGHUP back from whatever it inherited (nohup ignores it, and an ignored
    # signal is discarded) and blocks it for sigwait before it says it is ready.
    child = (
        "import signal, sys\n"
        "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})\n"
        "print('ready', flush=True)\n"
        "signal.sigwait({signal.SIGHUP})\n"
        "sys.exit(7)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert select.select([proc.stdout], [], [], 60)[0], "the child never got ready"
        assert proc.stdout.readline() == "ready\n"
        res = CliRunner(mix_stderr=False).invoke(main, ["reload", str(proc.pid)])
        assert res.exit_code == 0
        assert proc.wait(timeout=60) == 7
    finally:
        proc.kill()
        proc.wait()
    res = CliRunner(mix_stderr=False).invoke(main, ["reload", str(proc.pid)])
    assert res.exit_code == 1
    assert res.stderr == f"gpuagent: cannot signal pid {proc.pid}: No such process\n"


def test_detect_survives_a_bad_config(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2)
    with open(host.conf, "a") as f:
        f.write("intervall = 5\n")
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "detect", "--json"])
    assert res.exit_code == 0
    assert [g["slot"] for g in json.loads(res.stdout)["gpus"]] == host.slots
    assert res.stderr.startswith(f"gpuagent: warning: {host.conf}: unknown key 'intervall'")


def test_probe_names_a_gpu_nvidia_smi_cannot_reach(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2)
    host.healthy(prepend="device-handle-unknown-error.txt", exit=255)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "probe"])
    assert res.exit_code == 2  # critical: lost
    header, lost, *answered = res.stdout.splitlines()
    assert header.split() == ["SLOT", "NAME", "ACTION", "FINDING"]
    assert lost.split(None, 3) == [
        "0000:0b:00.0",
        "-",
        "reboot",
        "critical lost: nvidia-smi cannot reach the GPU: Unknown Error",
    ]
    assert [line.split() for line in answered] == [
        [s, "NVIDIA", "H200", "-", "ok"] for s in host.slots
    ]
    assert res.stderr == "gpuagent: GPU 0000:0b:00.0: Unknown Error\n"
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "probe", "--json"])
    assert res.exit_code == 2  # critical: lost
    assert json.loads(res.stdout)["gpu_errors"] == {"0000:0b:00.0": "Unknown Error"}


def test_probe_shows_what_nvidia_smi_said_instead_of_a_value(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2)
    reset = "[GPU requires reset]"
    host.healthy(override={host.slots[0]: {"temperature.gpu": reset, "power.draw": "[N/A]"}})
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "probe"])
    assert res.exit_code == 2, res.stderr  # a critical finding, as status exits
    _, first, second = res.stdout.splitlines()
    assert first.split(None, 4)[3:] == [
        "reset_gpu",
        "critical requires_reset: nvidia-smi says the GPU requires a reset (temperature.gpu)",
    ]
    assert second.split() == [host.slots[1], "NVIDIA", "H200", "-", "ok"]
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "probe", "--json"])
    out = json.loads(res.stdout)
    row, said = out["rows"][0], out["reasons"][0]
    assert (row["temperature.gpu"], row["power.draw"]) == (None, None)
    assert (said["temperature.gpu"], said["power.draw"]) == (reset, "[N/A]")
    assert out["reasons"][1].get("temperature.gpu") != reset
    assert [f["kind"] for f in out["findings"][host.slots[0]]] == ["requires_reset"]
    assert out["findings"][host.slots[1]] == []


def test_probe_says_the_gate_the_agent_would_hold(tmp_path: str) -> None:
    # nvidia-smi missing and the module unloaded: the agent's first gate is nvidia-smi's.
    host = fakehost.create(str(tmp_path), 1)
    fakesysfs.set_module(host.root, False)
    conf = os.path.join(tmp_path, "probe.toml")
    with open(conf, "w") as f:
        f.write(f'sysfs_root = "{host.root}"\nnvidia_smi = "/nonexistent/nvidia-smi"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "probe"])
    assert res.exit_code == 3
    assert res.stderr == "gpuagent: nvidia-smi not found ('/nonexistent/nvidia-smi')\n"
    # Found, with the module unloaded: the driver's gate.
    with open(conf, "w") as f:
        f.write(f'sysfs_root = "{host.root}"\nnvidia_smi = "{host.smi}"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "probe"])
    assert res.exit_code == 3
    assert "the nvidia kernel module is not loaded; not running nvidia-smi" in res.stderr


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["status"], 3),
        (["status", "--json"], 3),
        (["slurm-check", "--node", "n1"], 1),
    ],
)
def test_a_state_file_it_may_not_read_is_one_line(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, args: list[str], code: int
) -> None:
    from gpuagent.edges import safefile  # noqa: PLC0415
    from tests.test_status import write_state  # noqa: PLC0415

    conf = write_state(str(tmp_path), {"schema": 1})
    state_file = os.path.join(str(tmp_path), "state.json")
    real = safefile.read_regular

    def refused(path: str, limit: int) -> bytes:
        # As root a mode refuses nothing: the refusal another user would get.
        if path == state_file:
            raise PermissionError(13, "Permission denied", path)
        return real(path, limit)

    monkeypatch.setattr(safefile, "read_regular", refused)
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, *args])
    output = res.stdout + res.stderr
    assert res.exit_code == code, output
    said = [line for line in output.splitlines() if "Permission denied" in line]
    assert len(said) == 1, output
    assert f"{state_file}: cannot read: Permission denied" in said[0]
    assert "Traceback" not in output
    # node-problem-detector's line: at most 80 characters, the path cut short.
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status", "--format=npd"])
    assert (res.exit_code, res.stderr) == (2, "")
    assert res.stdout.startswith("unknown: ") and len(res.stdout.splitlines()) == 1
