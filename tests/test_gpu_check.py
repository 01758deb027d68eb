"""scripts/gpu-check without a GPU: every step runs on the fake host, nothing enters the corpus."""

from __future__ import annotations

import json
import os
import subprocess

from gpuagent.sources.probe.smi import FIELDS, parse
from tests.replay import CORPUS, DATA

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "gpu-check")
NOHEADER = os.path.join(DATA, "noheader-fields.json")


def corpus_files() -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(CORPUS) for f in files} | {NOHEADER}


def test_gpu_check_checks_itself_on_the_fake_host(tmp_path: str) -> None:
    before = corpus_files()
    with open(NOHEADER, encoding="utf-8") as f:
        noheader_before = f.read()
    proc = subprocess.run(
        [SCRIPT, "--fake"],
        env={**os.environ, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checking gpu-check on the fake host" in proc.stdout
    assert "FAIL" not in proc.stdout
    assert proc.stdout.rstrip().endswith("gpu-check: no GPU was checked; gpu-check itself works")
    for step in ("detect", "probe", "run --ticks 3", "status"):
        assert f"ok   gpuagent {step}: exit 0" in proc.stdout

    # The agent's query, captured with its note and replayable through noheader-fields.json.
    out = os.path.join(tmp_path, "corpus")
    name = "h200-linux-driver590.48.01-gpu-check-agent-query-noheader-nounits"
    with open(os.path.join(out, "csv", f"{name}.csv"), encoding="utf-8") as f:
        assert len(parse(f.read(), FIELDS)) == 8
    with open(os.path.join(out, "csv", f"{name}.source.txt"), encoding="utf-8") as f:
        source = f.read()
    assert "Command: LC_ALL=C " in source
    assert "Exit code: 0" in source
    with open(os.path.join(out, "noheader-fields.json"), encoding="utf-8") as f:
        assert json.load(f)[f"{name}.csv"] == list(FIELDS)
    for made in (
        "csv/h200-linux-driver590.48.01-gpu-check-query-gpu-all-fields",
        "xml/h200-linux-driver590.48.01-gpu-check-q-x",
        "sysfs/h200-linux-driver590.48.01-gpu-check-pci-ids",
    ):
        assert os.path.exists(os.path.join(out, f"{made}.source.txt")), made
    with open(os.path.join(out, "sysfs", f"{made.split('/')[1]}.txt"), encoding="ascii") as f:
        ids = f.read().splitlines()
    assert len(ids) == 8
    assert all(" 0x10de 0x2335 0x030200 " in line for line in ids)

    with open(os.path.join(tmp_path, "timing.json"), encoding="utf-8") as f:
        timing = json.load(f)
    assert sorted(timing) == ["nvidia-smi -q -x", "the agent's query"]
    assert all(len(runs) == 10 for runs in timing.values())

    assert os.path.exists(os.path.join(out, "INDEX.md"))
    assert corpus_files() == before
    with open(NOHEADER, encoding="utf-8") as f:
        assert f.read() == noheader_before
