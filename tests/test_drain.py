"""The scheduler's drain: the pure decision (every case), ``slurm-check`` against a fake
scontrol, ``status --format=npd`` and NHC's ``check_gpuagent`` with a stand-in ``die``."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import pytest
from click.testing import CliRunner

from gpuagent.commands import drain, drainrecord, slurmcheck
from gpuagent.commands.cli import main
from gpuagent.commands.drain import Node, decide, npd, parse_node, worst
from gpuagent.edges import safefile
from gpuagent.schema import ProbeState, State
from gpuagent.sources.driver.driver import driver_mismatch, mismatch_evidence
from gpuagent.views import Failure, Finding, ProbeView, Problem
from tests import states
from tests.states import NOW, SLOT
from tests.test_status import write_state

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OTHER = "0000:2a:00.0"
STRAY = 2**22 + 7  # a pid no process has
IDLE = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 OS=Linux 6.1 #1 SMP @0  "
    "State=IDLE ThreadsPerCore=1 Partitions=debug  ExtSensorsTemp=n/s"
)
REASON = "gpuagent: 0000:18:00.0 recovery_action reset_gpu"


@pytest.fixture(autouse=True)
def record(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """slurm-check's record of its drains, in the test's own directory (never /var/lib)."""
    path = os.path.join(str(tmp_path), "lib", "slurm-drains.json")
    monkeypatch.setattr(drainrecord, "PATH", path)
    return path


def shown(state: str = "IDLE", reason: str | None = None) -> str:
    """``scontrol show node n1 -o`` for a node in ``state`` with ``reason`` (slurm 22.05)."""
    line = IDLE.replace("State=IDLE", f"State={state}")
    if reason is not None:
        line += f" Reason={reason} [root@2026-12-01T09:26:43]"
    return line + "\n"


def node(state: str = "IDLE", reason: str | None = None) -> Node:
    found = parse_node(shown(state, reason))
    assert found is not None
    return found


def sick(
    kind: str = "recovery_action",
    severity: str = "critical",
    action: str = "reset_gpu",
    slot: str = SLOT,
    at: float = NOW,
) -> State:
    bus = (states.nvidia(), states.nvidia(OTHER))
    p = states.problem(kind, severity, action, slot=slot, since=at - 60)
    return states.state(now=at - 1, bus=bus, problems={slot: [p]})


def healthy(at: float = NOW) -> State:
    return states.state(now=at - 1)


def test_parse_node() -> None:
    assert node() == Node("n1", frozenset({"IDLE"}), "")
    assert node("IDLE+DRAIN", "admin: bad fan") == Node(
        "n1", frozenset({"IDLE", "DRAIN"}), "admin: bad fan"
    )
    assert node("MIXED+DRAIN", REASON).reason == REASON
    assert node("MIXED+DRAIN", REASON).ours
    assert node("DRAINED").drained and node("DRAINING").drained
    assert node("IDLE+DRAIN").drained and not node("DOWN*").drained
    assert node("DOWN*").flags == frozenset({"DOWN"})
    assert not node("IDLE", "gpuagent").ours  # the prefix has a colon
    # A reason without scontrol's [user@time] is kept whole.
    assert parse_node(IDLE + " Reason=x [y]").reason == "x [y]"  # type: ignore[union-attr]
    for bad in ("", "slurm_load_node error: Invalid node name specified", "State=IDLE", IDLE * 2):
        assert parse_node(bad if bad != IDLE * 2 else IDLE + "\n" + IDLE) is None


def test_worst_is_critical_then_the_strongest_action_then_slot() -> None:
    assert worst(healthy()) is None
    bus = (states.nvidia(), states.nvidia(OTHER))
    problems = {
        SLOT: [
            states.problem("hot", "warning", "drain_and_rma"),
            states.problem("recovery_action", "critical", "reset_gpu"),
        ],
        OTHER: [states.problem("xid", "critical", "drain_and_reset", slot=OTHER)],
        "": [states.problem("gpu_count", "warning", "check_host", slot="")],
    }
    st = states.state(bus=bus, problems=problems)
    # An Xid latches: only a clear ends it, and its drain reason says so.
    assert worst(st) == drain.Worst("critical", OTHER, "xid", "drain_and_reset", latches=True)
    said = f"gpuagent: {OTHER} xid drain_and_reset; then gpuagent clear"
    assert worst(st).reason == said  # type: ignore[union-attr]
    host = states.state(
        problems={"": [states.problem("gpu_count", "critical", "check_host", slot="")]}
    )
    assert worst(host) == drain.Worst("critical", "host", "gpu_count", "check_host")


UPDATE_DRAIN = ("update", "NodeName=n1", "State=DRAIN", f"Reason={REASON}")
UPDATE_RESUME = ("update", "NodeName=n1", "State=RESUME")

# (state, node, the update), every combination that matters.
DECISIONS: list[tuple[str, Callable[[], State], Node, tuple[str, ...]]] = [
    ("critical, idle: drain", sick, node(), UPDATE_DRAIN),
    ("critical, mixed: drain", sick, node("MIXED"), UPDATE_DRAIN),
    ("critical, down: drain", sick, node("DOWN*"), UPDATE_DRAIN),
    ("critical, drained by us: nothing", sick, node("IDLE+DRAIN", REASON), ()),
    (
        "critical, drained by us for another: new reason",
        sick,
        node("IDLE+DRAIN", "gpuagent: 0000:2a:00.0 xid reboot"),
        UPDATE_DRAIN,
    ),
    ("critical, admin's drain: left alone", sick, node("IDLE+DRAIN", "admin: fan"), ()),
    ("critical, drain without reason: left alone", sick, node("DRAINING"), ()),
    ("warning, idle: nothing", lambda: sick(severity="warning"), node(), ()),
    (
        "warning, drained by us: resume",
        lambda: sick(severity="warning"),
        node("IDLE+DRAIN", REASON),
        UPDATE_RESUME,
    ),
    ("healthy, idle: nothing", healthy, node(), ()),
    ("healthy, drained by us: resume", healthy, node("MIXED+DRAIN", REASON), UPDATE_RESUME),
    ("healthy, drained by us, down: resume", healthy, node("DOWN+DRAIN", REASON), UPDATE_RESUME),
    ("healthy, admin's drain: left alone", healthy, node("IDLE+DRAIN", "admin: gpuagent: x"), ()),
    ("healthy, our reason but not drained: nothing", healthy, node("IDLE", REASON), ()),
]


@pytest.mark.parametrize(("name", "made", "n", "update"), DECISIONS, ids=[d[0] for d in DECISIONS])
def test_decide(name: str, made: Callable[[], State], n: Node, update: tuple[str, ...]) -> None:
    d = decide(n, made(), "", NOW)
    assert (d.update, d.known) == (update, True)
    assert d.says.startswith("n1: ")


def test_an_unknown_state_changes_nothing() -> None:
    for n in (node(), node("IDLE+DRAIN", REASON)):
        d = decide(n, None, "/run/gpuagent/state.json: no state file (is gpuagent running?)", NOW)
        assert (d.update, d.known) == ((), False)
        assert (
            d.says
            == "n1: nothing changed: /run/gpuagent/state.json: no state file (is gpuagent running?)"
        )
        stale = sick(at=NOW - 600)
        d = decide(n, stale, "", NOW)
        assert (d.update, d.known) == ((), False)
        assert "has not updated its state for 601 s" in d.says
        stopped = states.state(now=NOW - 5, ended=("signal", NOW - 5))
        d = decide(n, stopped, "", NOW)
        assert (d.update, d.known) == ((), False)
        assert "gpuagent has been stopped since" in d.says
        dead = states.state(now=NOW - 1, pid=STRAY)
        assert (
            decide(n, dead, "", NOW).says
            == f"n1: nothing changed: gpuagent (pid {STRAY}) died without finishing"
        )


def failing() -> State:
    """nvidia-smi's exit 18 as the agent writes it: the probe failing, and its problem."""
    probe = ProbeView(
        state=ProbeState.FAILING, failure=Failure.VERSION_MISMATCH, failures=3, spawns_total=9
    )
    f = driver_mismatch(mismatch_evidence(None, None, refused=True), None)
    assert f is not None
    return states.state(now=NOW - 1, probe=probe, problems={"": [Problem("", f, NOW - 30)]})


def both(at: float = NOW) -> State:
    """A critical problem on SLOT and a warning on OTHER."""
    bus = (states.nvidia(), states.nvidia(OTHER))
    bad = states.problem("recovery_action", "critical", "reset_gpu", slot=SLOT, since=at - 60)
    meh = states.problem("ecc_uncorrected", "warning", "reset_gpu", slot=OTHER, since=at - 60)
    return states.state(now=at - 1, bus=bus, problems={SLOT: [bad], OTHER: [meh]})


def test_npd() -> None:
    # The condition (a permanent rule): set by a critical problem only.
    assert npd(healthy(), "", NOW) == (0, "ok: 1 GPU, sampling")
    assert npd(sick(), "", NOW) == (1, f"critical: {SLOT} recovery_action: reset_gpu")
    assert npd(both(), "", NOW) == (1, f"critical: {SLOT} recovery_action: reset_gpu")
    assert npd(sick(severity="warning", action="none"), "", NOW) == (
        0,
        f"ok; warning: {SLOT} recovery_action: none",
    )
    assert npd(failing(), "", NOW) == (1, "critical: host driver_mismatch: check_host")
    assert npd(None, "no state file", NOW) == (2, "unknown: no state file")
    code, line = npd(sick(at=NOW - 600), "", NOW)
    assert (code, line) == (2, "unknown: gpuagent has not updated its state for 601 s")
    code, line = npd(None, "x" * 200 + "\n\x1b[31m", NOW)
    assert code == 2 and len(line) == drain.NPD_WIDTH and line.endswith("...")
    long = sick(kind="k" * 90)
    assert len(npd(long, "", NOW)[1]) == drain.NPD_WIDTH


def test_npd_warning() -> None:
    # The event (a temporary rule): a warning, whatever critical problem holds beside it.
    warn = drain.npd_warning
    assert warn(healthy(), "", NOW) == (0, "ok: no warning")
    assert warn(sick(), "", NOW) == (0, "ok: no warning")
    assert warn(failing(), "", NOW) == (0, "ok: no warning")
    assert warn(both(), "", NOW) == (1, f"warning: {OTHER} ecc_uncorrected: reset_gpu")
    assert warn(sick(severity="warning", action="none"), "", NOW) == (
        1,
        f"warning: {SLOT} recovery_action: none",
    )
    # A warning of the agent's own (no GPU's problem) is one too.
    trouble = states.state(now=NOW - 1, trouble={"metrics": "cannot write"})
    assert warn(trouble, "", NOW) == (1, "warning: metrics: cannot write")
    assert warn(None, "no state file", NOW) == (2, "unknown: no state file")
    assert warn(sick(at=NOW - 600), "", NOW)[0] == 2
    assert len(warn(sick(kind="k" * 90, severity="warning"), "", NOW)[1]) == drain.NPD_WIDTH


def test_reason() -> None:
    assert drain.reason(sick(), "", NOW) == (True, REASON)
    assert drain.reason(sick(severity="warning"), "", NOW) == (True, "")
    assert drain.reason(healthy(), "", NOW) == (True, "")
    assert drain.reason(None, "gone", NOW) == (False, "gone")
    assert drain.reason(sick(at=NOW - 600), "", NOW)[0] is False


# A fake scontrol: prints $FAKE_SCONTROL_SHOW for `show`, records every call, can hang or fail.
FAKE_SCONTROL = """\
#!/usr/bin/env python3
import os, sys, time
with open(os.environ["FAKE_SCONTROL_LOG"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
if os.environ.get("FAKE_SCONTROL_HANG"):
    time.sleep(60)
if sys.argv[1] == "show":
    print(open(os.environ["FAKE_SCONTROL_SHOW"]).read(), end="")
elif os.environ.get("FAKE_SCONTROL_FAIL"):
    print("slurm_update error: Invalid node state specified", file=sys.stderr)
    sys.exit(1)
"""


class Slurm:
    """A fake scontrol on $PATH, the node it shows and the calls it got."""

    def __init__(self, tmp: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dir = tmp
        bin_dir = os.path.join(tmp, "bin")
        os.mkdir(bin_dir)
        path = os.path.join(bin_dir, "scontrol")
        with open(path, "w") as f:
            f.write(FAKE_SCONTROL.replace("/usr/bin/env python3", sys.executable))
        os.chmod(path, 0o700)
        self.log = os.path.join(tmp, "calls")
        self.show_file = os.path.join(tmp, "show")
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_SCONTROL_LOG", self.log)
        monkeypatch.setenv("FAKE_SCONTROL_SHOW", self.show_file)
        self.show()

    def show(self, state: str = "IDLE", reason: str | None = None) -> None:
        with open(self.show_file, "w") as f:
            f.write(shown(state, reason))

    def calls(self) -> list[str]:
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            calls = f.read().splitlines()
        os.unlink(self.log)
        return calls


@pytest.fixture
def slurm(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> Slurm:
    return Slurm(str(tmp_path), monkeypatch)


def check(conf: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    res = CliRunner(mix_stderr=False).invoke(
        main, ["--config", conf, "slurm-check", *args], env=env
    )
    return res.exit_code, res.stdout, res.stderr


def test_slurm_check_drains_resumes_and_leaves_an_admin_s_drain(slurm: Slurm) -> None:
    conf = write_state(slurm.dir, sick(at=time.time()))
    env = {"SLURMD_NODENAME": "n1"}
    assert check(conf, env=env) == (0, f"gpuagent slurm-check: n1: draining: {REASON}\n", "")
    assert slurm.calls() == ["show node n1 -o", f"update NodeName=n1 State=DRAIN Reason={REASON}"]
    slurm.show("IDLE+DRAIN", REASON)
    assert check(conf, env=env) == (0, f"gpuagent slurm-check: n1: drained: {REASON}\n", "")
    assert slurm.calls() == ["show node n1 -o"]
    write_state(slurm.dir, healthy(time.time()))
    code, out, _ = check(conf, env=env)
    assert code == 0 and "n1: resuming: no critical GPU problem" in out
    assert slurm.calls() == ["show node n1 -o", "update NodeName=n1 State=RESUME"]
    slurm.show()
    assert check(conf, env=env) == (0, "gpuagent slurm-check: n1: no critical GPU problem\n", "")
    assert slurm.calls() == []  # nothing of gpuagent's to resume: slurmctld is not asked
    write_state(slurm.dir, sick(at=time.time()))
    slurm.show("IDLE+DRAIN", "admin: bad fan")
    code, out, _ = check(conf, env=env)
    assert (code, slurm.calls()) == (0, ["show node n1 -o"])
    assert "left as drained by another: admin: bad fan" in out
    write_state(slurm.dir, healthy(time.time()))
    assert check(conf, env=env)[0] == 0
    assert slurm.calls() == []  # the admin's drain: never gpuagent's to resume


def test_the_node_is_slurmd_s_name_else_the_short_host_name(
    slurm: Slurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = write_state(slurm.dir, sick(at=time.time()))
    slurm.show("IDLE+DRAIN", REASON)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setattr("socket.gethostname", lambda: "gpu17.cluster.example")
    assert slurmcheck.node_name({}) == "gpu17"
    assert slurmcheck.node_name({"SLURMD_NODENAME": "n1"}) == "n1"
    check(conf)
    assert slurm.calls() == ["show node gpu17 -o"]
    check(conf, "--node", "n9", env={"SLURMD_NODENAME": "n1"})
    assert slurm.calls() == ["show node n9 -o"]


def test_a_missing_or_stale_state_drains_nothing_and_asks_slurm_nothing(slurm: Slurm) -> None:
    conf = write_state(slurm.dir, sick(at=time.time() - 600))
    code, out, err = check(conf, "--node", "n1")
    assert (code, out, slurm.calls()) == (1, "", [])
    assert err.startswith(
        "gpuagent slurm-check: n1: nothing changed: gpuagent has not updated its state"
    )
    os.unlink(os.path.join(slurm.dir, "state.json"))
    code, out, err = check(conf, "--node", "n1")
    assert (code, out, slurm.calls()) == (1, "", [])
    assert "no state file (is gpuagent running?)" in err


def test_scontrol_that_does_not_answer_is_killed_in_time(
    slurm: Slurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = write_state(slurm.dir, sick(at=time.time()))
    monkeypatch.setenv("FAKE_SCONTROL_HANG", "1")
    start = time.monotonic()
    code, _out, err = check(conf, "--node", "n1", "--timeout", "0.5")
    assert time.monotonic() - start < 10
    assert (
        code == 2
        and err == "gpuagent slurm-check: n1: scontrol show node n1 -o: no answer in 0.5 s\n"
    )
    monkeypatch.delenv("FAKE_SCONTROL_HANG")
    monkeypatch.setenv("FAKE_SCONTROL_FAIL", "1")
    code, _out, err = check(conf, "--node", "n1")
    assert code == 2 and "exit 1: slurm_update error: Invalid node state specified" in err
    with open(slurm.show_file, "w") as f:
        f.write("")
    code, _out, err = check(conf, "--node", "n1")
    assert code == 2 and "no such node" in err
    # The default budget: two scontrol calls within slurmd's 60 s.
    assert 2 * slurmcheck.TIMEOUT < 60


def test_without_scontrol_it_says_so(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = write_state(str(tmp_path), sick(at=time.time()))
    monkeypatch.setenv("PATH", str(tmp_path))
    code, _, err = check(conf, "--node", "n1")
    assert code == 2 and "cannot run scontrol" in err


def test_reason_only_runs_no_scontrol(slurm: Slurm) -> None:
    conf = write_state(slurm.dir, sick(at=time.time()))
    assert check(conf, "--reason") == (0, REASON + "\n", "")
    write_state(slurm.dir, healthy(time.time()))
    assert check(conf, "--reason") == (0, "", "")
    write_state(slurm.dir, healthy(time.time() - 600))
    code, out, err = check(conf, "--reason")
    assert (code, out) == (1, "") and "has not updated its state" in err
    assert slurm.calls() == []


def test_status_format_npd(tmp_path: str) -> None:
    conf = write_state(str(tmp_path), sick(at=time.time()))
    runner = CliRunner(mix_stderr=False)
    res = runner.invoke(main, ["--config", conf, "status", "--format=npd"])
    assert (res.exit_code, res.stdout) == (1, f"critical: {SLOT} recovery_action: reset_gpu\n")
    write_state(str(tmp_path), healthy(time.time()))
    res = runner.invoke(main, ["--config", conf, "status", "--format=npd"])
    assert (res.exit_code, res.stdout) == (0, "ok: 1 GPU, sampling\n")
    res = runner.invoke(main, ["--config", conf, "status", "--format=json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["health"] == "ok"
    res = runner.invoke(main, ["--config", conf, "status", "--format=npd-warning"])
    assert (res.exit_code, res.stdout) == (0, "ok: no warning\n")
    write_state(str(tmp_path), both(time.time()))
    res = runner.invoke(main, ["--config", conf, "status", "--format=npd-warning"])
    assert (res.exit_code, res.stdout) == (1, f"warning: {OTHER} ecc_uncorrected: reset_gpu\n")
    os.unlink(os.path.join(str(tmp_path), "state.json"))
    for form in ("npd", "npd-warning"):
        res = runner.invoke(main, ["--config", conf, "status", f"--format={form}"])
        assert res.exit_code == 2 and res.stdout.startswith("unknown: ")


def test_the_npd_plugin_config_runs_the_npd_format() -> None:
    with open(os.path.join(REPO, "packaging", "npd", "gpuagent-plugin-monitor.json")) as f:
        cfg = json.load(f)
    assert cfg["plugin"] == "custom"
    assert cfg["pluginConfig"]["max_output_length"] == drain.NPD_WIDTH
    # NPD's convention: a permanent rule sets a condition, a temporary one emits an event.
    condition, event = cfg["rules"]
    assert condition["type"] == "permanent"
    assert (condition["path"], condition["args"]) == (
        "/usr/bin/gpuagent",
        ["status", "--format=npd"],
    )
    assert condition["condition"] in {c["type"] for c in cfg["conditions"]}
    assert (event["type"], event["reason"]) == ("temporary", "GPUWarning")
    assert "condition" not in event
    assert (event["path"], event["args"]) == (
        "/usr/bin/gpuagent",
        ["status", "--format=npd-warning"],
    )


# NHC's die and log, as NHC defines them: die records the failure and its message.
NHC_STANDIN = """\
set -u
log() { echo "log: $*"; }
die() { echo "die $1: $2"; }
source "$1"
check_gpuagent
echo "rc $?"
"""


def nhc(tmp: str, st: State, extra: str = "") -> subprocess.CompletedProcess[str]:
    """NHC's check (with the stand-in ``die``) run over ``st``, through the real CLI, its
    config file ending in ``extra``."""
    conf = write_state(tmp, st)
    with open(conf, "a") as f:
        f.write(extra)
    command = os.path.join(tmp, "gpuagent")
    with open(command, "w") as f:
        f.write(
            f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m gpuagent --config {conf} "$@"\n'
        )
    os.chmod(command, 0o700)
    check_file = os.path.join(REPO, "packaging", "nhc", "check_gpuagent.nhc")
    proc = subprocess.run(
        ["bash", "-c", NHC_STANDIN, "nhc", check_file],
        env={**os.environ, "GPUAGENT_COMMAND": command},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.parametrize(
    ("made", "said"),
    [
        (lambda: sick(at=time.time()), f"die 1: {REASON}\nrc 1\n"),
        (lambda: sick(severity="warning", at=time.time()), "rc 0\n"),
        (lambda: healthy(time.time()), "rc 0\n"),
        (lambda: healthy(time.time() - 600), None),
    ],
    ids=["critical", "warning", "healthy", "stale"],
)
def test_nhc_check(tmp_path: str, made: Callable[[], State], said: str | None) -> None:
    proc = nhc(str(tmp_path), made())
    if said is None:
        assert proc.stdout.startswith(
            "log: check_gpuagent: nothing checked: gpuagent has not updated"
        )
        assert proc.stdout.endswith("rc 0\n")
    else:
        assert proc.stdout == said


@pytest.mark.parametrize(
    ("made", "said"),
    [
        (lambda: sick(at=time.time()), f"die 1: {REASON}\nrc 1\n"),
        (lambda: healthy(time.time()), "rc 0\n"),
    ],
    ids=["critical", "healthy"],
)
def test_nhc_check_logs_a_config_warning_and_never_fails_on_it(
    tmp_path: str, made: Callable[[], State], said: str
) -> None:
    """gpuagent's warning about its own config goes to standard error, which the check
    captures: it is logged, and the node fails on the GPU's reason alone."""
    proc = nhc(str(tmp_path), made(), extra="bogus_key = 1\n")
    warned, rest = proc.stdout.split("\n", 1)
    assert warned.startswith("log: check_gpuagent: gpuagent: warning: ")
    assert "bogus_key" in warned
    assert rest == said


def test_the_slurm_wrapper_runs_slurm_check() -> None:
    with open(os.path.join(REPO, "packaging", "slurm", "gpuagent-slurm-check")) as f:
        text = f.read()
    assert text.startswith("#!/bin/sh\n")
    assert 'exec /usr/bin/gpuagent slurm-check "$@"\n' in text
    assert os.access(os.path.join(REPO, "packaging", "slurm", "gpuagent-slurm-check"), os.X_OK)


def xid_problem(kind: str, code: object, slot: str = SLOT) -> State:
    """A critical problem of ``kind`` on ``slot`` carrying the Xid ``code`` in the state."""
    finding = Finding(kind, "critical", "reboot", "m", extra=(("xid", code),))  # type: ignore[arg-type]
    return states.state(now=time.time() - 1, problems={slot: [Problem(slot, finding, NOW - 60)]})


def test_an_xid_s_drain_reason_names_its_code() -> None:
    xid79 = worst(xid_problem("xid", 79))
    said = f"gpuagent: {SLOT} xid reboot (Xid 79); then gpuagent clear"
    assert xid79 is not None and xid79.reason == said
    # Only an Xid's code: any other kind keeps the plain shape.
    other = worst(xid_problem("recovery_action", 79))
    assert other is not None and other.reason == f"gpuagent: {SLOT} recovery_action reboot"
    # An Xid whose code the state lacks (the host's stray addresses) keeps the plain shape too.
    said = f"gpuagent: {SLOT} xid reset_gpu; then gpuagent clear"
    assert worst(sick(kind="xid")).reason == said  # type: ignore[union-attr]
    reason = f"gpuagent: {SLOT} xid reboot (Xid 79); then gpuagent clear"
    d = decide(
        node("IDLE+DRAIN", f"gpuagent: {SLOT} xid reboot"), xid_problem("xid", 79), "", time.time()
    )
    assert d.update == ("update", "NodeName=n1", "State=DRAIN", f"Reason={reason}")
    assert drain.reason(xid_problem("xid", 79), "", time.time()) == (True, reason)


class Scontrol:
    """An injected scontrol: shows the node ``shows``, fails an update when ``fails``, and
    keeps each call with what the record said when it came."""

    def __init__(self, record: str, shows: str = shown(), fails: bool = False) -> None:
        self.record = record
        self.shows = shows
        self.fails = fails
        self.calls: list[str] = []
        self.recorded: list[dict[str, str] | None] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> str:
        assert timeout == slurmcheck.TIMEOUT
        self.calls.append(" ".join(argv[1:]))
        self.recorded.append(drainrecord.read(self.record)[0])
        if argv[1] == "show":
            return self.shows
        if self.fails:
            raise slurmcheck.ScontrolError("scontrol update: exit 1: slurm_update error")
        return ""


def never(argv: Sequence[str], timeout: float) -> str:
    pytest.fail(f"slurmctld asked: {' '.join(argv)}")


def run_check(
    tmp_path: str, st: State, run: slurmcheck.Scontrol, record: str
) -> slurmcheck.Checked:
    write_state(tmp_path, st)
    path = os.path.join(tmp_path, "state.json")
    return slurmcheck.check(path, "n1", record=record, run=run)


def recorded(record: str) -> dict[str, str] | None:
    drained, why = drainrecord.read(record)
    assert why == ""
    return drained


def test_no_critical_problem_and_no_drain_recorded_asks_nothing(tmp_path: str, record: str) -> None:
    assert drainrecord.write(record, {"n9": "gpuagent: 0000:2a:00.0 xid reboot"}) == ""
    healthy_now = slurmcheck.Checked(0, "n1: no critical GPU problem")
    assert run_check(tmp_path, healthy(time.time()), never, record) == healthy_now
    warned = sick(severity="warning", at=time.time())
    assert run_check(tmp_path, warned, never, record) == healthy_now
    assert recorded(record) == {"n9": "gpuagent: 0000:2a:00.0 xid reboot"}


def test_without_a_record_it_asks_once_and_records_no_drain(tmp_path: str, record: str) -> None:
    asked = Scontrol(record)
    done = run_check(tmp_path, healthy(time.time()), asked, record)
    assert (done, asked.calls) == (
        slurmcheck.Checked(0, "n1: no critical GPU problem"),
        ["show node n1 -o"],
    )
    assert recorded(record) == {}
    assert run_check(tmp_path, healthy(time.time()), never, record).code == 0


def test_a_drain_is_recorded_before_it_is_made_and_forgotten_after_the_resume(
    tmp_path: str, record: str
) -> None:
    drainrecord.write(record, {"n9": "admin's node"})
    asked = Scontrol(record)
    done = run_check(tmp_path, sick(at=time.time()), asked, record)
    assert done == slurmcheck.Checked(0, f"n1: draining: {REASON}")
    assert asked.calls == ["show node n1 -o", f"update NodeName=n1 State=DRAIN Reason={REASON}"]
    assert asked.recorded[1] == {"n9": "admin's node", "n1": REASON}
    asked = Scontrol(record, shown("IDLE+DRAIN", REASON))
    done = run_check(tmp_path, healthy(time.time()), asked, record)
    assert asked.calls == ["show node n1 -o", "update NodeName=n1 State=RESUME"]
    assert asked.recorded[1] == {"n9": "admin's node", "n1": REASON}  # until the resume is done
    assert recorded(record) == {"n9": "admin's node"}


def test_a_drain_made_before_the_record_is_recorded(tmp_path: str, record: str) -> None:
    asked = Scontrol(record, shown("IDLE+DRAIN", REASON))
    done = run_check(tmp_path, sick(at=time.time()), asked, record)
    assert (done.code, asked.calls) == (0, ["show node n1 -o"])
    assert recorded(record) == {"n1": REASON}


def test_a_failed_update_keeps_the_record(tmp_path: str, record: str) -> None:
    asked = Scontrol(record, fails=True)
    done = run_check(tmp_path, sick(at=time.time()), asked, record)
    assert done.code == slurmcheck.EX_SCONTROL and "slurm_update error" in done.says
    assert recorded(record) == {"n1": REASON}  # the next check asks again
    asked = Scontrol(record, shown("IDLE+DRAIN", REASON), fails=True)
    done = run_check(tmp_path, healthy(time.time()), asked, record)
    assert done.code == slurmcheck.EX_SCONTROL
    assert recorded(record) == {"n1": REASON}


@pytest.mark.parametrize(
    ("held", "says"),
    [
        (None, "n1: no critical GPU problem"),
        ("admin: bad fan", "n1: no critical GPU problem; drained by another, left so"),
    ],
    ids=["resumed", "drained again by the admin"],
)
def test_an_administrator_s_resume_drops_the_record(
    tmp_path: str, record: str, held: str | None, says: str
) -> None:
    drainrecord.write(record, {"n1": REASON})
    asked = Scontrol(record, shown("IDLE" if held is None else "IDLE+DRAIN", held))
    done = run_check(tmp_path, healthy(time.time()), asked, record)
    assert (done, asked.calls) == (slurmcheck.Checked(0, says), ["show node n1 -o"])
    assert recorded(record) == {}
    assert run_check(tmp_path, healthy(time.time()), never, record).code == 0


def test_an_admin_s_drain_is_never_recorded(tmp_path: str, record: str) -> None:
    asked = Scontrol(record, shown("IDLE+DRAIN", "admin: bad fan"))
    done = run_check(tmp_path, sick(at=time.time()), asked, record)
    assert (done.code, asked.calls) == (0, ["show node n1 -o"])
    assert recorded(record) == {}


def damage(record: str, how: str) -> None:
    os.makedirs(os.path.dirname(record), exist_ok=True)
    if how == "fifo":
        os.mkfifo(record)
    elif how == "symlink":
        target = os.path.join(os.path.dirname(record), "elsewhere.json")
        with open(target, "w") as f:
            f.write('{"drained": {}}')
        os.symlink(target, record)
    else:
        with open(record, "wb") as f:
            f.write(how.encode("latin-1"))


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ('{"drained": {', "Expecting"),
        ("[]", 'not a record of drains: no "drained" object of node names'),
        ('{"drained": {"n1": 5}}', 'not a record of drains: no "drained" object of node names'),
        ("\xff", "codec can't decode"),
        ("fifo", "cannot read the record of its drains: not a regular file"),
        ("symlink", "cannot read the record of its drains: a symbolic link (not followed)"),
    ],
    ids=["truncated", "a list", "a number", "not utf-8", "fifo", "symlink"],
)
def test_a_damaged_record_says_so_in_one_line_and_asks(
    tmp_path: str, record: str, how: str, why: str
) -> None:
    damage(record, how)
    asked = Scontrol(record)
    done = run_check(tmp_path, healthy(time.time()), asked, record)
    assert (done.code, done.says, asked.calls) == (
        0,
        "n1: no critical GPU problem",
        ["show node n1 -o"],
    )
    assert done.warning.startswith(f"{record}: ") and done.warning.endswith("; asking slurmctld")
    assert why in done.warning and "\n" not in done.warning
    assert recorded(record) == {}  # rewritten: the next check asks nothing
    assert not os.path.islink(record)


def test_a_record_that_cannot_be_written_is_removed(
    tmp_path: str, record: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drainrecord.write(record, {})

    write_atomic = safefile.write_atomic

    def full(path: str, data: bytes, mode: int = 0o644) -> None:
        if path == record:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        write_atomic(path, data, mode)

    monkeypatch.setattr(safefile, "write_atomic", full)
    asked = Scontrol(record)
    done = run_check(tmp_path, sick(at=time.time()), asked, record)
    assert done.code == 0 and asked.calls[1].startswith("update NodeName=n1 State=DRAIN")
    assert done.warning == f"{record}: cannot record its drains: No space left on device"
    assert not os.path.lexists(record)  # the next check asks slurmctld
    asked = Scontrol(record, shown("IDLE+DRAIN", REASON))
    assert run_check(tmp_path, healthy(time.time()), asked, record).code == 0
    assert asked.calls == ["show node n1 -o", "update NodeName=n1 State=RESUME"]


def test_the_fast_check_runs_no_scontrol_even_a_hanging_one(slurm: Slurm, record: str) -> None:
    conf = write_state(slurm.dir, healthy(time.time()))
    drainrecord.write(record, {})
    env = {**os.environ, "PYTHONPATH": REPO, "SLURMD_NODENAME": "n1", "FAKE_SCONTROL_HANG": "1"}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", FAST_CHECK, record, conf],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    took = time.monotonic() - start
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        "gpuagent slurm-check: n1: no critical GPU problem\n",
        "",
    )
    assert slurm.calls() == []
    assert took < slurmcheck.TIMEOUT / 2, took  # a hanging scontrol would have taken 20 s


# slurm-check as slurmd runs it, its record moved to argv[1].
FAST_CHECK = """\
import sys
from gpuagent.commands import drainrecord
from gpuagent.commands.cli import main
drainrecord.PATH = sys.argv[1]
main(["--config", sys.argv[2], "slurm-check"])
"""
