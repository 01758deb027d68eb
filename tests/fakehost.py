"""A fake GPU host on disk: a sysfs tree, the replaying fake nvidia-smi and a config file.

Used by in-process tests (``conftest.Host``), by tests that run ``gpuagent run`` as a process,
by the benchmarks and by ``scripts/demo``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from tests import fakesysfs

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_SMI = os.path.join(HERE, "fake_nvidia_smi.py")
H200_LOAD = "h200-linux-driver590.48.01-load-query-gpu-all-fields.csv"
MISMATCH = "driver-library-version-mismatch-exit18-nvml535.161.txt"


@dataclass
class FakeHost:
    """``root`` the sysfs tree, ``smi`` the fake nvidia-smi, ``conf`` a config using both."""

    dir: str
    root: str
    smi: str
    conf: str
    slots: list[str]
    calls_log: str

    def scenario(self, **step: Any) -> None:
        """What the fake nvidia-smi does from its next call on (see its docstring)."""
        step.setdefault("log", self.calls_log)
        tmp = self.smi + ".json.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(step, f)
        os.replace(tmp, self.smi + ".json")

    def healthy(self, slots: list[str] | None = None, **extra: Any) -> None:
        self.scenario(capture=H200_LOAD, slots=self.slots if slots is None else slots, **extra)

    def failing(self, error: str = MISMATCH, code: int = 18) -> None:
        self.scenario(error=error, exit=code)

    @property
    def spawns(self) -> int:
        """How many times the fake nvidia-smi has run."""
        if not os.path.exists(self.calls_log):
            return 0
        with open(self.calls_log) as f:
            return sum(1 for _ in f)


def _toml(value: object) -> str:
    return json.dumps(value) if isinstance(value, str | bool) else str(value)


def create(directory: str, gpus: int = 8, **config: object) -> FakeHost:
    """Build a host of ``gpus`` H200s under ``directory``, answering healthy.

    The config points at it, keeps its state and metrics in ``directory`` and adds
    ``config``'s keys.
    """
    root = os.path.join(directory, "sys")
    slots = fakesysfs.gpu_host(root, gpus)
    smi = os.path.join(directory, "nvidia-smi")
    os.symlink(FAKE_SMI, smi)
    settings: dict[str, object] = {
        "sysfs_root": root,
        "nvidia_smi": smi,
        "state_file": os.path.join(directory, "state.json"),
        "textfile": os.path.join(directory, "gpuagent.prom"),
        **config,
    }
    conf = os.path.join(directory, "gpuagent.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.writelines(f"{key} = {_toml(value)}\n" for key, value in settings.items())
    host = FakeHost(directory, root, smi, conf, slots, os.path.join(directory, "calls.log"))
    host.healthy()
    return host
