"""packaging/gpuagent.catalog: one well-formed entry per Event, and journalctl accepts it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from gpuagent.logs import Event
from gpuagent.sources.probe import rules
from tests.tools import tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATALOG = os.path.join(REPO, "packaging", "gpuagent.catalog")
HEADER = re.compile(r"^-- ([0-9a-f]{32})$")
FIELDS = ("Subject", "Defined-By", "Support", "Documentation")
NAMES = {e.value: e.name for e in Event}


def lines() -> list[str]:
    with open(CATALOG, encoding="utf-8") as f:
        return f.read().splitlines()


def entries() -> list[tuple[str, list[str]]]:
    """(MESSAGE_ID, lines after the header) for each entry."""
    out: list[tuple[str, list[str]]] = []
    for line in lines():
        m = HEADER.match(line)
        if m:
            out.append((m.group(1), []))
        elif out:
            out[-1][1].append(line)
    return out


def test_only_comments_before_the_first_entry_and_no_stray_headers() -> None:
    first = next(i for i, line in enumerate(lines()) if HEADER.match(line))
    assert all(not line or line.startswith("#") for line in lines()[:first])
    stray = [line for line in lines() if line.startswith("--") and not HEADER.match(line)]
    assert stray == []


def test_one_entry_per_event() -> None:
    ids = [message_id for message_id, _ in entries()]
    assert len(ids) == len(set(ids)), "duplicate MESSAGE_ID"
    assert set(ids) == {e.value for e in Event}


@pytest.mark.parametrize(
    ("message_id", "text"), entries(), ids=[NAMES.get(m, m) for m, _ in entries()]
)
def test_entry_is_well_formed(message_id: str, text: list[str]) -> None:
    blank = text.index("")
    head = dict(line.split(": ", 1) for line in text[:blank])
    assert list(head) == list(FIELDS), message_id
    assert head["Defined-By"] == "gpuagent"
    assert head["Documentation"] == "man:gpuagent(8)"
    assert head["Subject"].strip()
    body = [line for line in text[blank + 1 :] if line]
    assert body, f"{message_id} explains nothing"
    assert all(len(line) <= 80 for line in body)
    # journalctl -x fills @FIELD@ from the entry; the only field used is PCI_SLOT.
    uses = set(re.findall(r"@([A-Z_]+)@", "\n".join(body)))
    if uses:
        assert uses == {"PCI_SLOT"}
        # Events of a GPU only (an Xid may be the host's: an address that is no GPU; and
        # gpu_count is the host's), which carry PCI_SLOT.
        kinds = {*rules.KINDS, "nvlink_down", "nvlink_errors", "persistence_off"}
        problems = [Event.problem(k) for k in sorted(kinds - {"missing", "gpu_count"})]
        gpus = (
            Event.GPU_MISSING,
            Event.GPU_BACK,
            Event.GPU_INIT_FAILED,
            Event.BOARD_UUID_INCONSISTENT,
            Event.EVIDENCE_BUNDLE,
            Event.FAULT_VICTIMS,
            *problems,
        )
        assert message_id in [e.value for e in gpus]


def test_journalctl_compiles_it(tmp_path: str) -> None:
    journalctl = tool("journalctl")
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "usr/lib/systemd/catalog"))
    shutil.copy(CATALOG, os.path.join(root, "usr/lib/systemd/catalog"))
    update = subprocess.run(
        [journalctl, f"--root={root}", "--update-catalog"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (update.returncode, update.stderr) == (0, "")
    listing = subprocess.run(
        [journalctl, f"--root={root}", "--list-catalog"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    assert sorted(line.split()[0] for line in listing) == sorted(e.value for e in Event)
    assert all(line.split()[1] == "gpuagent:" for line in listing)
