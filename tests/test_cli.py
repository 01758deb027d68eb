"""``gpuagent detect`` and ``gpuagent probe`` through the CLI on fake hosts."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from gpuagent.cli import main
from gpuagent.smi import FIELDS
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
    assert res.exit_code == 1
    assert "not loaded" in res.stderr
    assert host.spawns == 0


def test_probe_failure_is_one_line(tmp_path: str) -> None:
    host = fakehost.create(str(tmp_path), 2)
    host.failing()
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", host.conf, "probe"])
    assert res.exit_code == 1
    assert res.stderr.startswith("gpuagent: probe failed (version_mismatch): exit 18: ")
    assert len(res.stderr.strip().splitlines()) == 1


def test_detect_human_output_without_a_gpu(tmp_path: str) -> None:
    fakesysfs.add_device(tmp_path, "0000:03:00.0", 0x1A03, 0x2000, 0x030000, "ast")
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'sysfs_root = "{tmp_path}"\n')
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
    assert "name=evil?]0;pwned?name" in res.stdout
