"""A fabric manager the driver refuses for its version (NVIDIA/gpu-driver-container#735):
``fabricmanager_mismatch``, whose advice installs the matching version and never restarts,
read from the unit's own journal records (only those journald vouches for), on real texts
(data/corpus/host/fabricmanager-*)."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from gpuagent.edges import bootid
from gpuagent.health import CRITICAL
from gpuagent.logs import Event
from gpuagent.sources.services import nvservices, unitlog
from gpuagent.sources.services.nvservices import (
    FABRICMANAGER,
    UnitFacts,
    fabricmanager_findings,
    fm_mismatch,
    fold_fabric,
)
from gpuagent.sources.services.unitlog import unit_messages
from tests.conftest import Host
from tests.fake_units import FakeUnits, unit
from tests.journalfeed import journal_remote
from tests.replay import CORPUS
from tests.test_nvidia_scenarios import PD, fabric_pending, nvswitch_host
from tests.tools import need

HOST = os.path.join(CORPUS, "host")
SHARED = os.path.join(os.path.dirname(CORPUS), "..", "..", "..", "shared", "corpus", "host")
H200_735 = "fabricmanager-journal-hgx-h200-driver580.126.09-fm590.48.01-version-mismatch"
AKASH = "fabricmanager-systemctl-status-driver550.120-fm550.127.05-version-mismatch-doesnt"
# journalctl's short form: "Nov 05 13:55:26 node1 nv-fabricmanager[104230]: MESSAGE".
_SHORT = re.compile(r"^[A-Z][a-z]{2} [ \d]\d [\d:]{8} \S+ (?P<ident>[^:\[]+)(?:\[\d+\])?: ")
FAILED = UnitFacts(FABRICMANAGER, "loaded", "failed", "failed", "exit-code", 5)
SWITCHES = ["0000:a0:00.0", "0000:a1:00.0"]
REMOTE = journal_remote()


def messages(path: str) -> list[str]:
    """The fabric manager's messages in a capture: a journalctl line's MESSAGE (systemd's own
    lines left out), or the capture's text as one message (a poster's wrapped block)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not any(_SHORT.match(line) for line in lines):
        return [" ".join(lines)]
    return [
        line[m.end() :]
        for line in lines
        if (m := _SHORT.match(line)) is not None and m["ident"] != "systemd"
    ]


@pytest.mark.parametrize(
    ("name", "versions"),
    [(H200_735, ("590.48.01", "580.126.09")), (AKASH, ("550.127.05", "550.120"))],
)
def test_the_driver_refusing_the_fabric_manager_in_both_spellings(
    name: str, versions: tuple[str, str]
) -> None:
    assert fm_mismatch(messages(os.path.join(HOST, name + ".txt"))) == versions


def test_no_other_fabric_manager_text_is_a_mismatch() -> None:
    """The other fabric manager captures (no NVSwitch, a config error, its log file, a
    healthy status) say nothing of a version."""
    need(os.path.isdir(SHARED), "no ../shared/corpus")
    others = [n for n in os.listdir(SHARED) if n.startswith("fabricmanager-")]
    others = [n for n in others if not n.endswith(".source.txt")]
    assert others
    for name in others:
        assert fm_mismatch(messages(os.path.join(SHARED, name))) is None, name


def test_a_mismatch_is_critical_check_host_and_names_the_version_to_install() -> None:
    (f,) = fabricmanager_findings(SWITCHES, FAILED, ("590.48.01", "580.126.09"))
    assert (f.kind, f.severity, f.action) == ("fabricmanager_mismatch", CRITICAL, "check_host")
    assert "install nvidia-fabricmanager 580.126.09, the driver's version" in f.message
    assert "refuses nv-fabricmanager 590.48.01" in f.message
    assert f.ends == f"when {FABRICMANAGER} runs again"
    # Running, or no NVSwitch that needs it: nothing, whatever its journal said.
    running = UnitFacts(FABRICMANAGER, "loaded", "active", "running", "success", 5)
    assert fabricmanager_findings(SWITCHES, running, ("590.48.01", "580.126.09")) == []
    assert fabricmanager_findings([], FAILED, ("590.48.01", "580.126.09")) == []


def test_the_gpus_fabric_problems_fold_under_the_mismatch() -> None:
    (host,) = fabricmanager_findings(SWITCHES, FAILED, ("590.48.01", "580.126.09"))
    from gpuagent.views import Finding  # noqa: PLC0415

    fabric = Finding("fabric", CRITICAL, "check_host", "not joined the NVLink fabric")
    folded = fold_fabric([host], {"0000:18:00.0": [fabric]})
    assert folded["0000:18:00.0"][0].extra == (("cause", "fabricmanager_mismatch"),)


def export(entries: list[dict[str, str]]) -> bytes:
    """systemd's journal export format of ``entries`` (text fields only)."""
    out = b""
    for i, fields in enumerate(entries):
        head = {
            "__REALTIME_TIMESTAMP": str(1_700_000_000_000_000 + i),
            "__MONOTONIC_TIMESTAMP": str(1_000_000 + i),
        }
        for key, value in {**head, **fields}.items():
            out += f"{key}={value}\n".encode()
        out += b"\n"
    return out


def fm_journal(directory: str, boot: str, said: list[str], **forged: dict[str, str]) -> str:
    """A journal directory whose fabric manager (root, in its unit, this boot) said ``said``,
    and whose ``forged`` entries say the refusal without journald's word for it."""
    if REMOTE is None:
        pytest.skip("systemd-journal-remote is not installed")
    base = {"_BOOT_ID": boot, "_MACHINE_ID": "0" * 32, "_HOSTNAME": "node1", "PRIORITY": "6"}
    fm = {**base, "_TRANSPORT": "stdout", "_SYSTEMD_UNIT": FABRICMANAGER, "_UID": "0"}
    entries = [{**fm, "SYSLOG_IDENTIFIER": "nv-fabricmanager", "MESSAGE": m} for m in said]
    refusal = messages(os.path.join(HOST, H200_735 + ".txt"))[0]
    entries += [{**fm, **fields, "MESSAGE": refusal} for fields in forged.values()]
    return journal_of(directory, entries)


def journal_of(directory: str, entries: list[dict[str, str]]) -> str:
    """``directory`` made, with a journal file of ``entries`` in it."""
    if REMOTE is None:
        pytest.skip("systemd-journal-remote is not installed")
    os.makedirs(directory)
    stream = os.path.join(directory, "export")
    with open(stream, "wb") as f:
        f.write(export(entries))
    out = os.path.join(directory, "fm.journal")
    subprocess.run([REMOTE, f"--output={out}", stream], check=True, capture_output=True, timeout=60)
    os.remove(stream)
    return directory


def test_only_the_units_own_records_of_this_boot_are_read(tmp_path: str) -> None:
    boot = bootid.current()
    said = messages(os.path.join(HOST, AKASH + ".txt"))
    journal = fm_journal(
        os.path.join(str(tmp_path), "j"),
        boot,
        said,
        # logger as a user, another unit, an earlier boot: none is the fabric manager's.
        user={"_UID": "1000"},
        other={"_SYSTEMD_UNIT": "evil.service"},
        earlier={"_BOOT_ID": "f" * 32},
    )
    got = unit_messages(journal, FABRICMANAGER, boot)
    assert got == said
    assert fm_mismatch(got) == ("550.127.05", "550.120")
    assert unit_messages(journal, "nvidia-imex.service", boot) == []
    assert unit_messages(os.path.join(str(tmp_path), "none"), FABRICMANAGER, boot) == []


def test_a_forged_refusal_alone_is_fabricmanager_down(tmp_path: str) -> None:
    boot = bootid.current()
    journal = fm_journal(os.path.join(str(tmp_path), "j"), boot, [], user={"_UID": "1000"})
    assert fm_mismatch(unit_messages(journal, FABRICMANAGER, boot)) is None


def test_on_the_fake_host_the_mismatch_is_one_line_and_no_restart_advice(
    host: Host, tmp_path: str
) -> None:
    """An HGX host whose fabric manager the driver refused (gpu-driver-container#735): one
    critical host problem, check_host, the GPUs' fabric folded under it; its journal read
    once, however many ticks; its restarts no flapping warning; it ends when it runs."""
    nvswitch_host(host)
    fabric_pending(host)
    boot = bootid.current()
    said = messages(os.path.join(HOST, H200_735 + ".txt"))
    journal = fm_journal(os.path.join(str(tmp_path), "fmj"), boot, said)
    units = FakeUnits()
    units.set(unit(FABRICMANAGER, "failed", "failed", result="exit-code", restarts=0), unit(PD))
    host.make_agent(units=units, journal_directory=journal)
    st = host.tick(2).state
    assert [(p["kind"], p["action"]) for p in st["host_problems"]] == [
        ("fabricmanager_mismatch", "check_host")
    ]
    assert "install nvidia-fabricmanager 580.126.09" in st["host_problems"][0]["message"]
    assert all(
        [(p["kind"], p.get("cause")) for p in g["problems"]]
        == [("fabric", "fabricmanager_mismatch")]
        for g in st["gpus"]
    )
    (line,) = host.events(Event.PROBLEM_FABRICMANAGER_MISMATCH)
    assert "restart_service" not in line.getMessage()
    assert host.events(Event.PROBLEM_FABRICMANAGER_DOWN) == []
    # systemd restarts it and it fails again, again and again: still the one cause.
    for restarts in (1, 2, 3, 4):
        units.set(
            unit(FABRICMANAGER, "failed", "failed", result="exit-code", restarts=restarts), unit(PD)
        )
        host.tick(1)
    assert [p["kind"] for p in host.state["host_problems"]] == ["fabricmanager_mismatch"]
    assert host.events(Event.PROBLEM_FABRICMANAGER_FLAPPING) == []
    units.set(unit(FABRICMANAGER), unit(PD))
    host.healthy()
    st = host.tick(2).state
    assert st["host_problems"] == []
    assert len(host.events(Event.PROBLEM_FABRICMANAGER_MISMATCH)) == 1


def test_kinds_and_events() -> None:
    assert "fabricmanager_mismatch" in nvservices.KINDS
    assert Event.problem("fabricmanager_mismatch") is Event.PROBLEM_FABRICMANAGER_MISMATCH


def test_under_a_containers_boot_id_the_journals_own_boot_is_read(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a container the kernel's boot id (what the agent sees) is not journald's; the
    kernel's records are read under the journal's boot, and so are the unit's (issue 39)."""
    from systemd import journal  # noqa: PLC0415 - python3-systemd, a test of the journal

    if REMOTE is None:
        pytest.skip("systemd-journal-remote is not installed")
    said = messages(os.path.join(HOST, AKASH + ".txt"))
    journald = "c" * 32
    now_us = int(time.time() * 1e6)
    fm = {
        "_BOOT_ID": journald,
        "_MACHINE_ID": "0" * 32,
        "_HOSTNAME": "node1",
        "_TRANSPORT": "stdout",
        "_SYSTEMD_UNIT": FABRICMANAGER,
        "_UID": "0",
        "SYSLOG_IDENTIFIER": "nv-fabricmanager",
    }
    entries = [
        {**fm, "MESSAGE": m, "__REALTIME_TIMESTAMP": str(now_us + i)} for i, m in enumerate(said)
    ]
    directory = journal_of(os.path.join(str(tmp_path), "j"), entries)
    # The system journal ("" as the directory) is this test's files.
    monkeypatch.setattr(unitlog, "_reader", lambda _: journal.Reader(path=directory))
    assert unit_messages("", FABRICMANAGER, bootid.current()) == said
