"""gpuagent.apps: --query-compute-apps parsed, over every capture of the corpus and the
values nvidia-smi gives instead of a number."""

from __future__ import annotations

import glob
import os

import pytest

from gpuagent import apps
from gpuagent.apps import App
from tests.replay import CORPUS

CAPTURES = sorted(
    os.path.basename(p) for p in glob.glob(os.path.join(CORPUS, "csv", "*compute-apps.csv"))
)


def _read(name: str) -> str:
    with open(os.path.join(CORPUS, "csv", name), encoding="utf-8") as f:
        return f.read()


def test_the_corpus_has_mig_and_not() -> None:
    assert len(CAPTURES) >= 8
    assert any("-mig-" in n for n in CAPTURES)
    assert any("-mig-" not in n for n in CAPTURES)


@pytest.mark.parametrize("name", CAPTURES)
def test_every_capture_reads_to_its_processes(name: str) -> None:
    text = _read(name)
    parsed = apps.parse(text)
    assert parsed.unreadable == ()
    rows = [ln for ln in text.splitlines()[1:] if ln.strip()]
    assert len(parsed.apps) == len(rows)
    for app, line in zip(parsed.apps, rows, strict=True):
        cells = [c.strip() for c in line.split(",")]
        # timestamp, gpu_name, gpu_bus_id, gpu_serial, gpu_uuid, pid, process_name, memory
        assert app.gpu_uuid == cells[4]
        assert app.pid == int(cells[5])
        assert app.name == cells[6]
        assert app.used_memory_mib == int(cells[7].removesuffix(" MiB"))


def test_the_mig_captures_report_against_the_parent_gpu() -> None:
    for name in (n for n in CAPTURES if "-mig-" in n):
        uuids = {a.gpu_uuid for a in apps.parse(_read(name)).apps}
        (uuid,) = uuids
        assert uuid is not None and uuid.startswith("GPU-"), name


def test_the_agents_own_form() -> None:
    text = (
        "GPU-1b2c3d4e-0000-0000-0000-000000000001, 48213, python3, 42189\n"
        "GPU-1b2c3d4e-0000-0000-0000-000000000001, 48214, [Insufficient Permissions], [N/A]\n"
    )
    assert apps.parse(text).apps == (
        App("GPU-1b2c3d4e-0000-0000-0000-000000000001", 48213, "python3", 42189),
        App("GPU-1b2c3d4e-0000-0000-0000-000000000001", 48214, None, None),
    )
    assert apps.ARGS == (
        "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
        "--format=csv,noheader,nounits",
    )


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "No running processes found\n", "No running compute processes found.\n"],
)
def test_no_process(text: str) -> None:
    assert apps.parse(text) == apps.Parsed(())


@pytest.mark.parametrize(
    "line",
    [
        "GPU-1, notapid, python3, 10",
        "GPU-1, -5, python3, 10",
        "GPU-1, 12, python3",
        "GPU-1, 12, python3, 10 GiB",
        'GPU-1, 12, "unterminated, 10',
        "\x00\xff",
    ],
)
def test_a_line_that_is_no_process_is_unreadable_and_the_rest_is_read(line: str) -> None:
    parsed = apps.parse(f"GPU-1, 7, a, 1\n{line}\nGPU-1, 8, b, 2\n")
    assert [a.pid for a in parsed.apps] == [7, 8]
    assert parsed.unreadable == (line.strip(),)


def test_a_name_with_a_comma_in_quotes() -> None:
    (app,) = apps.parse('GPU-1, 7, "/opt/a,b/run", 3\n').apps
    assert app.name == "/opt/a,b/run"
