"""Evidence bundles: the names, the caps and the rate limit (pure); the requests taken from a
fake runtime directory and checked against a fake sysfs (tests/fakesysfs.py, an HGX host of
8 H200s); bundles gathered with fake commands, a hanging nvidia-bug-report.sh among them."""

from __future__ import annotations

import json
import os
import stat
import time
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuagent.commands import evidencecli
from gpuagent.config import Config
from gpuagent.evidence import ask, bundle, plan, requests
from gpuagent.evidence.gather import Gatherer, Limits
from gpuagent.evidence.store import LEDGER, Store, StoreError
from gpuagent.logs import Event
from gpuagent.report import Report
from gpuagent.sources.bus import pci
from tests import fakesysfs

SLOTS = fakesysfs.gpu_slots(8)
BOOT, OTHER_BOOT = "a" * 32, "b" * 32
T0 = 1_750_000_000.0


class Log:
    """An EventLog stand-in that keeps each line."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, Event | None, str, dict[str, Any]]] = []

    def __call__(self, level: int, event: Event | None, message: str, **fields: Any) -> None:
        self.lines.append((level, event, message, fields))

    def texts(self) -> list[str]:
        return [m for _, _, m, _ in self.lines]


# Names and caps ---------------------------------------------------------------------------


def test_a_bundle_is_named_by_its_utc_time_and_slot() -> None:
    name = plan.bundle_name(T0, "0000:18:00.0")
    assert name == "20250615T150640Z-0000:18:00.0"
    assert plan.is_bundle(name) and plan.slot_of(name) == "0000:18:00.0"
    for bad in ["0000:18:00.0", "20250615T150640Z-0000:18:00.8", LEDGER, ".partial-" + name]:
        assert not plan.is_bundle(bad) and plan.slot_of(bad) is None


def test_only_sysfs_spelling_is_a_slot() -> None:
    assert plan.is_slot("0000:18:00.0") and plan.is_slot("10000:e0:1f.7")
    for bad in [
        "0000:18:00",
        "0000:1A:00.0",
        "00000000:18:00.0x",
        "../../etc",
        "",
        "0000:18:00.0/",
    ]:
        assert not plan.is_slot(bad), bad
    with pytest.raises(ValueError, match="not a PCI slot"):
        plan.bundle_name(T0, "../x")


def test_the_oldest_go_past_either_cap_but_never_the_new_one() -> None:
    bundles = [("20250101T000000Z-a", 10), ("20250102T000000Z-a", 10), ("20250103T000000Z-a", 10)]
    assert plan.to_drop(bundles, "20250103T000000Z-a", 3, 30) == []
    assert plan.to_drop(bundles, "20250103T000000Z-a", 2, 30) == ["20250101T000000Z-a"]
    assert plan.to_drop(bundles, "20250103T000000Z-a", 3, 15) == [
        "20250101T000000Z-a",
        "20250102T000000Z-a",
    ]
    # Alone over the byte cap, the new one stays.
    assert plan.to_drop([("20250103T000000Z-a", 99)], "20250103T000000Z-a", 3, 15) == []


@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 1000)),
        max_size=30,
        unique_by=lambda t: t[0],
    ),
    st.integers(1, 10),
    st.integers(0, 5000),
)
def test_what_stays_is_within_the_caps_and_the_newest(
    made: list[tuple[int, int]], max_count: int, max_bytes: int
) -> None:
    bundles = [(f"{n:012d}", size) for n, size in made]
    keep = max(bundles)[0] if bundles else "none"
    dropped = plan.to_drop(bundles, keep, max_count, max_bytes)
    left = [b for b in bundles if b[0] not in dropped]
    assert keep not in dropped
    if len(left) > 1 or (left and left[0][0] != keep):
        assert len(left) <= max_count and sum(s for _, s in left) <= max_bytes
    # Only older than what stays.
    assert all(d < min(n for n, _ in left) for d in dropped) if left else not dropped


# The rate limit ---------------------------------------------------------------------------


def test_one_bundle_per_gpu_per_boot_and_a_few_per_hour() -> None:
    ledger: list[plan.Entry] = []
    why, ledger = plan.admit(ledger, SLOTS[0], BOOT, T0, 2)
    assert why is None and ledger == [plan.Entry(SLOTS[0], BOOT, T0)]
    why, ledger = plan.admit(ledger, SLOTS[0], BOOT, T0 + 7200, 2)
    assert why == f"a bundle of {SLOTS[0]} was made this boot already"
    why, ledger = plan.admit(ledger, SLOTS[1], BOOT, T0 + 1, 2)
    assert why is None
    why, ledger = plan.admit(ledger, SLOTS[2], BOOT, T0 + 2, 2)
    assert why == "2 bundles in the last hour already (evidence_per_hour)"
    # An hour on, the hour's limit has room again; this boot's entries are kept.
    why, ledger = plan.admit(ledger, SLOTS[2], BOOT, T0 + 3601, 2)
    assert why is None and len(ledger) == 3
    # The next boot: the GPU may have one again; the old boot's entries go after the hour.
    why, ledger = plan.admit(ledger, SLOTS[0], OTHER_BOOT, T0 + 9000, 2)
    assert why is None and ledger == [plan.Entry(SLOTS[0], OTHER_BOOT, T0 + 9000)]


def test_a_clock_set_back_counts_the_later_entries_in_the_hour() -> None:
    ledger = [plan.Entry(SLOTS[0], OTHER_BOOT, T0 + 5000)]
    assert plan.admit(ledger, SLOTS[1], BOOT, T0, 1).why is not None


def test_no_automatic_bundle_at_a_limit_of_zero() -> None:
    assert plan.admit([], SLOTS[0], BOOT, T0, 0).why is not None


@pytest.mark.parametrize(
    "value",
    [
        {},
        [1],
        [{"slot": "x", "boot": BOOT, "at": 1}],
        [{"slot": SLOTS[0], "boot": BOOT, "at": True}],
    ],
)
def test_a_bad_ledger_says_what_is_wrong(value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="expected"):
        plan.ledger_entries(value)


# Requests ---------------------------------------------------------------------------------


@pytest.fixture
def sysfs(tmp_path: Any) -> str:
    root = str(tmp_path / "sys")
    fakesysfs.gpu_host(root, 8)
    return root


def test_requests_are_taken_whatever_they_are(tmp_path: Any) -> None:
    directory = tmp_path / "evidence-requests"
    directory.mkdir()
    (directory / SLOTS[0]).write_text("ignored content")
    (directory / "junk").mkdir()
    (directory / "junk" / "deeper").write_text("")
    os.symlink("/etc/passwd", directory / SLOTS[1])
    assert requests.take(str(directory)) == sorted([SLOTS[0], SLOTS[1], "junk"])
    assert os.listdir(directory) == []
    assert os.path.exists("/etc/passwd")
    assert requests.take(str(tmp_path / "absent")) == []


def test_a_symlinked_request_directory_is_not_followed(tmp_path: Any) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious").write_text("")
    os.symlink(target, tmp_path / "evidence-requests")
    with pytest.raises(OSError):
        requests.take(str(tmp_path / "evidence-requests"))
    assert os.listdir(target) == ["precious"]


def test_only_an_nvidia_gpu_on_the_bus_is_asked_for(sysfs: str) -> None:
    names = [SLOTS[0], SLOTS[0], "0000:03:00.0", "0000:00:1f.3", "0000:99:00.0", "../x", SLOTS[1]]
    slots, refused = requests.choose(names, lambda s: pci.is_gpu(sysfs, s))
    assert slots == [SLOTS[0], SLOTS[1]]
    assert refused == [
        "0000:03:00.0: not an NVIDIA GPU on the bus",  # the ASPEED BMC's VGA
        "0000:00:1f.3: not an NVIDIA GPU on the bus",  # an audio function
        "0000:99:00.0: not an NVIDIA GPU on the bus",  # nothing there
        "'../x': not a PCI slot",
    ]


# The evidence directory -------------------------------------------------------------------


def test_the_directory_is_used_only_when_its_owner_alone_writes_it(tmp_path: Any) -> None:
    path = str(tmp_path / "evidence")
    Store(path, owner=os.getuid()).close()
    with pytest.raises(StoreError, match="not by uid"):
        Store(path, owner=os.getuid() + 1)
    os.chmod(path, 0o775)  # noqa: S103 - the mode refused
    with pytest.raises(StoreError, match="mode 775"):
        Store(path, owner=os.getuid())
    os.rmdir(path)
    os.symlink(str(tmp_path), path)
    with pytest.raises(StoreError, match="symbolic link"):
        Store(path, owner=os.getuid())


def _dispatch(
    tmp_path: Any, sysfs: str, names: list[str], now: float, boot: str = BOOT
) -> list[str]:
    directory = tmp_path / "evidence-requests"
    directory.mkdir(exist_ok=True)
    for name in names:
        (directory / name).touch()
    started: list[str] = []

    def start(slot: str) -> None:
        started.append(slot)

    cfg = Config(sysfs_root=sysfs, evidence_per_hour=2)
    status = evidencecli.dispatch(
        cfg,
        cast(Any, Log()),
        directory=str(directory),
        store=lambda: Store(str(tmp_path / "evidence"), owner=os.getuid()),
        boot=boot,
        now=now,
        start=start,
    )
    assert status == 0 and os.listdir(directory) == []
    return started


def test_a_flood_of_requests_costs_one_bundle_per_cap(tmp_path: Any, sysfs: str) -> None:
    flood = [*SLOTS, *SLOTS, "0000:03:00.0", "bogus"]
    assert _dispatch(tmp_path, sysfs, flood, T0) == SLOTS[:2]
    for minute in range(1, 60):
        assert _dispatch(tmp_path, sysfs, flood, T0 + 60 * minute) == []
    # The next hour: two more GPUs, never one twice this boot.
    assert _dispatch(tmp_path, sysfs, flood, T0 + 3600) == SLOTS[2:4]
    # After a reboot the first GPUs may have theirs again.
    assert _dispatch(tmp_path, sysfs, flood, T0 + 7200, OTHER_BOOT) == SLOTS[:2]


def test_a_broken_ledger_starts_anew(tmp_path: Any, sysfs: str) -> None:
    (tmp_path / "evidence").mkdir(mode=0o755)
    (tmp_path / "evidence" / LEDGER).write_text("{not json")
    assert _dispatch(tmp_path, sysfs, [SLOTS[0]], T0) == [SLOTS[0]]
    assert json.loads((tmp_path / "evidence" / LEDGER).read_text())[0]["slot"] == SLOTS[0]


# Gathering --------------------------------------------------------------------------------


def _script(path: Any, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def _gatherer(tmp_path: Any, bug_report: str | None, report_timeout: float = 30.0) -> Gatherer:
    state_dir = tmp_path / "lib"
    state_dir.mkdir(exist_ok=True)
    (state_dir / "gpus.json").write_text('{"gpus": []}')
    (state_dir / "notes.txt").write_text("not a state file")
    (tmp_path / "state.json").write_text('{"schema": 1}')
    return Gatherer(
        nvidia_smi=_script(tmp_path / "nvidia-smi", 'echo "smi $*"\n'),
        bug_report=bug_report,
        state_directory=str(state_dir),
        state_file=str(tmp_path / "state.json"),
        limits=Limits(command=10.0, report=report_timeout, total=1 << 20),
        journalctl=_script(tmp_path / "journalctl", 'echo "journal $*"\n'),
    )


def _gather(
    tmp_path: Any, sysfs: str, gatherer: Gatherer, wall: float, max_bundles: int = 10
) -> Any:
    log = Log()
    made = evidencecli.gather(
        Config(sysfs_root=sysfs, evidence_max_bundles=max_bundles),
        cast(Any, log),
        SLOTS[0],
        trigger="hand",
        store=lambda: Store(str(tmp_path / "evidence"), owner=os.getuid()),
        gatherer=gatherer,
        boot=BOOT,
        wall=lambda: wall,
    )
    return made, log


def test_a_bundle_holds_every_part_and_says_so(tmp_path: Any, sysfs: str) -> None:
    report = _script(
        tmp_path / "nvidia-bug-report.sh",
        'echo "collecting"; printf report > "$2.gz"\n',
    )
    made, log = _gather(tmp_path, sysfs, _gatherer(tmp_path, report), T0)
    assert made.name == f"20250615T150640Z-{SLOTS[0]}"
    files = sorted(os.listdir(made.path))
    assert files == [
        "journal-gpuagent.txt",
        "journal-kernel.txt",
        "manifest.json",
        "nvidia-bug-report.log.gz",
        "nvidia-bug-report.out.txt",
        "nvidia-smi-q.txt",
        "state-gpus.json",
        "state-run.json",
    ]

    def read(name: str) -> str:
        with open(os.path.join(made.path, name), encoding="utf-8") as f:
            return f.read()

    assert read("nvidia-smi-q.txt") == f"smi -q -i {SLOTS[0]}\n"
    assert f"--since @{int(T0 - 900)} -k -n 50000" in read("journal-kernel.txt")
    assert "-u gpuagent.service" in read("journal-gpuagent.txt")
    manifest = json.loads(read("manifest.json"))
    assert manifest["slot"] == SLOTS[0] and manifest["trigger"] == "hand"
    assert manifest["boot_id"] == BOOT
    outcomes = {p["what"]: (p["outcome"], p.get("exit_code")) for p in manifest["parts"]}
    assert outcomes["nvidia-smi -q"] == ("exited", 0)
    assert outcomes["nvidia-bug-report.sh"] == ("exited", 0)
    by_file = {p.get("name"): p for p in manifest["parts"]}
    assert by_file["nvidia-bug-report.log.gz"]["bytes"] == len("report")
    assert manifest["bytes"] == sum(p["bytes"] for p in manifest["parts"])
    assert stat.S_IMODE(os.stat(made.path).st_mode) == 0o700
    [(_, event, text, fields)] = log.lines
    assert event is Event.EVIDENCE_BUNDLE
    assert fields["pci_slot"] == SLOTS[0] and fields["evidence_bundle"] == made.path
    assert text == f"GPU {SLOTS[0]}: evidence gathered in {made.path}"


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (not gone, not a zombie); it may go between any two reads."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def test_a_hanging_bug_report_is_killed_at_its_timeout_and_the_manifest_says_so(
    tmp_path: Any, sysfs: str
) -> None:
    pidfile = tmp_path / "child.pid"
    report = _script(
        tmp_path / "nvidia-bug-report.sh",
        f'echo "Running nvidia-smi -q"; sleep 600 & echo $! > {pidfile}; wait\n',
    )
    began = time.monotonic()
    made, log = _gather(tmp_path, sysfs, _gatherer(tmp_path, report, report_timeout=0.5), T0)
    assert time.monotonic() - began < 20
    manifest = json.load(open(os.path.join(made.path, "manifest.json")))
    [part] = [p for p in manifest["parts"] if p["what"] == "nvidia-bug-report.sh"]
    assert part["outcome"] == "timeout" and part["note"] == "killed after 0.5 s"
    assert "exit_code" not in part
    assert (
        open(os.path.join(made.path, "nvidia-bug-report.out.txt")).read()
        == "Running nvidia-smi -q\n"
    )
    # Its child went with it (the process group).
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _running(child):
        assert time.monotonic() < deadline, f"pid {child} outlived its group's kill"
        time.sleep(0.05)
    assert "nvidia-bug-report.sh timeout" in log.texts()[0]


def test_without_a_bug_report_the_manifest_says_it_is_absent(tmp_path: Any, sysfs: str) -> None:
    made, _ = _gather(tmp_path, sysfs, _gatherer(tmp_path, None), T0)
    manifest = json.load(open(os.path.join(made.path, "manifest.json")))
    assert {"what": "nvidia-bug-report.sh", "outcome": "absent", "note": "not installed"} in [
        {k: v for k, v in p.items() if k not in ("bytes", "seconds")} for p in manifest["parts"]
    ]


def test_the_oldest_bundles_go_past_the_count_cap(tmp_path: Any, sysfs: str) -> None:
    gatherer = _gatherer(tmp_path, None)
    names = [_gather(tmp_path, sysfs, gatherer, T0 + i, max_bundles=2)[0].name for i in range(4)]
    assert sorted(n for n in os.listdir(tmp_path / "evidence") if plan.is_bundle(n)) == names[2:]


def test_no_bundle_for_what_is_not_a_gpu(tmp_path: Any, sysfs: str) -> None:
    fakesysfs.remove_device(sysfs, SLOTS[0])
    made, log = _gather(tmp_path, sysfs, _gatherer(tmp_path, None), T0)
    assert made is None and log.texts() == [f"{SLOTS[0]}: not an NVIDIA GPU on the bus; no bundle"]


def test_purge_removes_every_bundle(tmp_path: Any, sysfs: str) -> None:
    _gather(tmp_path, sysfs, _gatherer(tmp_path, None), T0)
    store = Store(str(tmp_path / "evidence"), owner=os.getuid())
    assert store.remove_all() == [f"20250615T150640Z-{SLOTS[0]}"]
    assert os.listdir(tmp_path / "evidence") == []


def test_a_manifest_lists_each_part() -> None:
    from gpuagent.evidence.gather import Part  # noqa: PLC0415

    parts = [
        Part("a", "a.txt", "exited", 0, 3, 0.1),
        Part("b", None, "absent", note="not installed"),
    ]
    got = bundle.manifest(
        SLOTS[0], trigger="request", boot=BOOT, started=1.0, finished=2.0, parts=parts
    )
    assert got["bytes"] == 3
    assert got["parts"] == [
        {
            "what": "a",
            "name": "a.txt",
            "outcome": "exited",
            "exit_code": 0,
            "bytes": 3,
            "seconds": 0.1,
        },
        {"what": "b", "outcome": "absent", "bytes": 0, "seconds": 0.0, "note": "not installed"},
    ]


# The agent's side -------------------------------------------------------------------------


def _report(problems: dict[str, list[str]]) -> Report:
    gpus = [
        {"pci_slot": slot, "problems": [{"severity": s} for s in severities]}
        for slot, severities in problems.items()
    ]
    return cast(Report, type("R", (), {"state": {"gpus": gpus}})())


def test_the_agent_asks_once_for_each_gpu_with_a_critical_problem(tmp_path: Any) -> None:
    directory = str(tmp_path / "run" / ask.SUBDIRECTORY)
    asker = ask.Asker(directory, cast(Any, Log()))
    asker(_report({SLOTS[0]: ["warning"], SLOTS[1]: ["warning", "critical"]}))
    assert os.listdir(directory) == [SLOTS[1]]
    assert os.path.getsize(os.path.join(directory, SLOTS[1])) == 0
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    os.unlink(os.path.join(directory, SLOTS[1]))  # root took it
    asker(_report({SLOTS[1]: ["critical"], SLOTS[2]: ["critical"]}))
    assert os.listdir(directory) == [SLOTS[2]]


def test_a_planted_symlink_is_not_followed(tmp_path: Any) -> None:
    directory = tmp_path / ask.SUBDIRECTORY
    directory.mkdir()
    target = tmp_path / "target"
    os.symlink(target, directory / SLOTS[0])
    log = Log()
    ask.Asker(str(directory), cast(Any, log))(_report({SLOTS[0]: ["critical"]}))
    assert not target.exists()
    assert log.texts() == []  # it exists: the same request, as far as the agent knows


def test_only_the_service_asks(tmp_path: Any) -> None:
    assert ask.for_runtime({}, cast(Any, Log())) == []
    [asker] = ask.for_runtime({"RUNTIME_DIRECTORY": "/run/gpuagent"}, cast(Any, Log()))
    assert asker.directory == "/run/gpuagent/evidence-requests"


def test_the_command_takes_one_slot_or_one_mode() -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    from gpuagent.commands.cli import main  # noqa: PLC0415

    runner = CliRunner(mix_stderr=False)
    for argv in [[], ["--requests", SLOTS[0]], ["--purge", "--requests"], ["--requested"]]:
        res = runner.invoke(main, ["evidence", *argv])
        assert res.exit_code == 2 and "name one SLOT, or --requests, or --purge" in res.stderr
    res = runner.invoke(main, ["evidence", "../../etc"])
    assert res.exit_code == 2 and "'../../etc' is not a PCI slot" in res.stderr
