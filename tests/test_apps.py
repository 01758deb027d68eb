"""gpuagent.sources.processes.apps: --query-compute-apps parsed, over every capture of the corpus
and the values nvidia-smi gives instead of a number; no cell a process can shape."""

from __future__ import annotations

import glob
import os

import pytest

from gpuagent.sources.processes import apps
from gpuagent.sources.processes.apps import App
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
        assert app.used_memory_mib == int(cells[7].removesuffix(" MiB"))


@pytest.mark.parametrize("name", CAPTURES)
def test_every_capture_in_the_agents_own_query_reads_the_same(name: str) -> None:
    # No capture asks for gpu_uuid,pid,used_memory with noheader,nounits: this input is
    # each real capture's columns of those fields, without the header and the units.
    text = _read(name)
    rows = [[c.strip() for c in ln.split(",")] for ln in text.splitlines()[1:] if ln.strip()]
    own = "".join(f"{c[4]}, {c[5]}, {c[7].removesuffix(' MiB')}\n" for c in rows)
    assert apps.parse(own) == apps.parse(text)


def test_the_mig_captures_report_against_the_parent_gpu() -> None:
    for name in (n for n in CAPTURES if "-mig-" in n):
        uuids = {a.gpu_uuid for a in apps.parse(_read(name)).apps}
        (uuid,) = uuids
        assert uuid is not None and uuid.startswith("GPU-"), name


def test_the_agents_own_form() -> None:
    text = (
        "GPU-1b2c3d4e-0000-0000-0000-000000000001, 48213, 42189\n"
        "GPU-1b2c3d4e-0000-0000-0000-000000000001, 48214, [N/A]\n"
        "[N/A], 1, 0\n"
        "GPU-1b2c3d4e-0000-0000-0000-000000000001, 4294967295, 1\n"
    )
    assert apps.parse(text) == apps.Parsed(
        (
            App("GPU-1b2c3d4e-0000-0000-0000-000000000001", 48213, 42189),
            App("GPU-1b2c3d4e-0000-0000-0000-000000000001", 48214, None),
            App(None, 1, 0),
            App("GPU-1b2c3d4e-0000-0000-0000-000000000001", 4294967295, 1),
        )
    )
    assert apps.ARGS == (
        "--query-compute-apps=gpu_uuid,pid,used_memory",
        "--format=csv,noheader,nounits",
    )


def test_the_agent_never_asks_for_the_name_a_process_gives_itself() -> None:
    assert "process_name" not in apps.FIELDS
    assert not any("name" in a for a in apps.ARGS)


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "No running processes found\n", "No running compute processes found.\n"],
)
def test_no_process(text: str) -> None:
    assert apps.parse(text) == apps.Parsed(())


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("GPU-1, notapid, 10", "pid 'notapid' is not 1..4294967295"),
        ("GPU-1, -5, 10", "pid '-5' is not 1..4294967295"),
        ("GPU-1, -1, 10", "pid '-1' is not 1..4294967295"),
        ("GPU-1, 0, 10", "pid '0' is not 1..4294967295"),
        ("GPU-1, 4294967296, 10", "pid '4294967296' is not 1..4294967295"),
        ("GPU-1, 99999999999, 10", "pid '99999999999' is not 1..4294967295"),
        ("GPU-1, [N/A], 10", "pid '[N/A]' is not 1..4294967295"),
        ("GPU-1, 12", "2 cells where 3 were asked for"),
        ("GPU-1, 12, python3, 10", "4 cells where 3 were asked for"),
        ("GPU-1, 12, 10 GiB", "used_memory '10 GiB' is no number of MiB"),
        ("GPU-1, 12, -10", "used_memory '-10' is no number of MiB"),
        ("python3, 12, 10", "gpu_uuid 'python3' is no GPU's UUID"),
        ('"GPU-1", 12, 10', "gpu_uuid '\"GPU-1\"' is no GPU's UUID"),
        ("\x00\xff", "1 cells where 3 were asked for"),
    ],
)
def test_a_line_that_is_no_process_is_unreadable_and_the_rest_is_read(
    line: str, reason: str
) -> None:
    parsed = apps.parse(f"GPU-1, 7, 1\n{line}\nGPU-1, 8, 2\n")
    assert [a.pid for a in parsed.apps] == [7, 8]
    assert parsed.unreadable == (apps.Unreadable(line.strip(), reason),)


def test_a_capture_whose_name_has_a_comma_is_unreadable_not_shifted() -> None:
    # The header form (captures) has process_name: nvidia-smi does not quote it.
    text = (
        "gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
        "GPU-1, 7, /opt/a,b/run, 3 MiB\n"
        "GPU-1, 8, python3, 4 MiB\n"
    )
    parsed = apps.parse(text)
    assert parsed.apps == (App("GPU-1", 8, 4),)
    assert parsed.unreadable == (
        apps.Unreadable("GPU-1, 7, /opt/a,b/run, 3 MiB", "5 cells where 4 were asked for"),
    )
