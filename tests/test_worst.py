"""One order of "the worst" (:func:`gpuagent.health.rank`) on every surface: over a table of
states, the state's own lists, the host's remedy and the status line, ``status``, the
metrics' worst problem, ``slurm-check`` (its reason and its decision), ``status
--format=npd`` and NHC's check all name the same problem.  The first two rows are issue 24's
orders, and its counterexamples (a stuck nvidia-smi, exit 18 before and after the reboot) rows
of their own: each surface once chose its own."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import pytest

from gpuagent import metrics
from gpuagent.commands import drain
from gpuagent.commands.status import judge
from gpuagent.health import CRITICAL, WARNING, rank, ranked
from gpuagent.schema import ProbeState, State
from gpuagent.sources.driver.driver import driver_mismatch, mismatch_evidence
from gpuagent.sources.driver.hangs import ProbeHangs
from gpuagent.sources.kernel import clears
from gpuagent.sources.probe.outage import outage
from gpuagent.verdict import Tracker
from gpuagent.views import Failure, Finding, ProbeView, Problem
from tests import states
from tests.test_drain import nhc, node

A, B, C = "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"
HOST = ""


def xid(code: int, action: str, severity: str = CRITICAL) -> Finding:
    return Finding("xid", severity, action, f"Xid {code}", (("xid", code),))


FM_DOWN = Finding("fabricmanager_down", CRITICAL, "restart_service", "no fabric manager")
GPU_COUNT = Finding("gpu_count", CRITICAL, "check_host", "7 GPUs where expected_gpus is 8")
FABRIC = Finding("fabric", CRITICAL, "check_host", "fabric not ready")
FOLDED = Finding("fabric", CRITICAL, "check_host", "fabric", (("cause", "fabricmanager_down"),))
GONE = Finding("gone_from_bus", CRITICAL, "reboot", "no longer on the PCI bus")
LOST = Finding("lost", CRITICAL, "reboot", "GPU is lost")
REMAP = Finding("row_remap_failed", CRITICAL, "drain_and_rma", "row remapping failed")
INFOROM = Finding("inforom", WARNING, "drain_and_rma", "infoROM checksum invalid")
HOT = Finding("throttled", WARNING, "none", "thermal slowdown")
PERSISTENCE = Finding("persistence_off", WARNING, "restart_service", "persistence mode off")


def hung(*, stuck: bool) -> Finding:
    """driver_hung as the driver's source writes it for a child that outlived SIGKILL, or
    smi_timeout for timeouts."""
    hangs = ProbeHangs()
    hangs.observe(0.0, module_loaded=True, stuck=stuck, timed_out=not stuck)
    f = hangs.finding(0.0)
    assert f is not None
    return f


def mismatch(*, installed_after_boot: bool) -> Finding:
    """driver_mismatch as the driver's source writes it for nvidia-smi's exit 18, before the
    reboot (the library newer than the boot) and after it (older: the reboot did not help)."""
    f = driver_mismatch(mismatch_evidence(None, None, refused=True), installed_after_boot)
    assert f is not None
    return f


STUCK = hung(stuck=True)
BLIP = hung(stuck=False)
MISMATCH_BEFORE = mismatch(installed_after_boot=True)
MISMATCH_AFTER = mismatch(installed_after_boot=False)
SMI_FAILING = outage(ProbeView(state=ProbeState.FAILING, failure=Failure.GPU_LOST, failures=3), 3)[
    0
]
# nvidia-smi failing for a reason that may be the agent's own (its sandbox): no drain.
SMI_BLIND = outage(ProbeView(state=ProbeState.FAILING, failure=Failure.OTHER, failures=3), 3)[0]

# (what it shows, the findings by slot, the worst: its slot and kind)
TABLE: list[tuple[str, dict[str, list[Finding]], tuple[str, str]]] = [
    (
        "a reboot beats the host's restart_service and check_host",
        {HOST: [FM_DOWN, GPU_COUNT], A: [xid(79, "reboot")]},
        (A, "xid"),
    ),
    (
        "a reboot beats a drain_and_reset",
        {A: [xid(48, "drain_and_reset")], B: [xid(79, "reboot")]},
        (B, "xid"),
    ),
    (
        "critical before warning, whatever the action",
        {HOST: [FM_DOWN], A: [INFOROM]},
        (HOST, "fabricmanager_down"),
    ),
    ("drain_and_rma beats a reboot", {A: [LOST], B: [REMAP]}, (B, "row_remap_failed")),
    ("the host before the GPUs", {HOST: [GPU_COUNT], A: [FABRIC]}, (HOST, "gpu_count")),
    ("then by PCI slot", {C: [LOST], A: [LOST], B: [LOST]}, (A, "lost")),
    ("then by kind", {A: [xid(79, "reboot"), GONE]}, (A, "gone_from_bus")),
    (
        "a folded problem after its cause",
        {HOST: [FM_DOWN], A: [FOLDED]},
        (HOST, "fabricmanager_down"),
    ),
    # Issue 24's counterexamples: each surface once read the probe's state its own way.
    (
        "a stuck nvidia-smi is a critical driver_hung at once",
        {HOST: [STUCK], A: [HOT]},
        (HOST, "driver_hung"),
    ),
    ("timeouts alone are a warning, no drain", {HOST: [BLIP]}, (HOST, "smi_timeout")),
    (
        "exit 18 before the reboot: driver_mismatch, reboot",
        {HOST: [MISMATCH_BEFORE], A: [INFOROM]},
        (HOST, "driver_mismatch"),
    ),
    (
        "exit 18 after the reboot: driver_mismatch, check_host",
        {HOST: [MISMATCH_AFTER], A: [HOT]},
        (HOST, "driver_mismatch"),
    ),
    (
        "nvidia-smi failing: smi_failing",
        {HOST: [SMI_FAILING], A: [PERSISTENCE]},
        (HOST, "smi_failing"),
    ),
    (
        "nvidia-smi failing, maybe the agent's own trouble: a warning, no drain",
        {HOST: [SMI_BLIND]},
        (HOST, "smi_failing"),
    ),
    (
        "warnings alone: the action that takes most",
        {A: [HOT], B: [PERSISTENCE]},
        (B, "persistence_off"),
    ),
]
IDS = [row[0] for row in TABLE]


def held(found: Mapping[str, Sequence[Finding]], now: float) -> dict[str, list[Problem]]:
    """The problems as the agent's tracker holds them, each slot's worst first."""
    tracker = Tracker()
    tracker.report("test", found)
    tracker.settle(now)
    return {slot: tracker.problems(slot) for slot in sorted(tracker.slots())}


def made(found: Mapping[str, Sequence[Finding]], now: float) -> State:
    bus = [states.nvidia(slot) for slot in sorted(found) if slot]
    return states.state(now=now, bus=bus, problems=held(found, now))


def series(st: State, name: str) -> list[dict[str, str]]:
    """The labels of the metric ``name``'s series."""
    return [s.labels for f in metrics.families(st) if f.name == name for s in f.samples]


def worst_series(st: State) -> dict[str, str]:
    """``gpuagent_gpu_worst_problem``'s kind, by slot."""
    return {s["pci_slot"]: s["kind"] for s in series(st, "gpuagent_gpu_worst_problem")}


def xid_of(f: Finding) -> int | None:
    code = dict(f.extra).get("xid")
    return code if f.kind == "xid" and isinstance(code, int) else None


def latches(where: str, f: Finding) -> bool:
    """Whether only a clear ends ``f`` on ``where`` (``host``: the host's)."""
    return clears.ending("" if where == "host" else where, f.kind, f.ends)[1]


def reason_of(where: str, f: Finding) -> str:
    """The drain reason slurm-check and NHC give for ``f`` on ``where``."""
    said = f"gpuagent: {where} {f.kind} {f.action}"
    code = xid_of(f)
    said = said if code is None else f"{said} (Xid {code})"
    return said + drain.THEN_CLEAR if latches(where, f) else said


@pytest.mark.parametrize(("name", "found", "expected"), TABLE, ids=IDS)
def test_every_surface_names_the_same_worst(
    name: str, found: dict[str, list[Finding]], expected: tuple[str, str]
) -> None:
    now = time.time()
    st = made(found, now)
    slot, kind = expected
    (f,) = [f for f in found[slot] if f.kind == kind]
    where = slot or "host"
    # The state's own list of the worst's slot leads with it.
    owner = st["host_problems"] if slot == HOST else states.gpu(st, slot)["problems"]
    assert owner[0]["kind"] == kind
    # The host's remedy is the worst's action and fixes it first; the status line leads with it.
    cure = st.get("remedy")
    assert cure is not None and cure["action"] == f.action
    assert cure["fixes"][0] == f"{where} {f.name}"
    assert st["status"].startswith((cure["says"], cure["action"])), st["status"]
    # status: its reason leads with it.
    assert judge(st, now)[1].startswith(f"{where} {kind}: {f.action}")
    if slot == HOST:
        # The host's problems page each on its own: one series a kind.
        assert kind in [s["kind"] for s in series(st, "gpuagent_host_problem")]
        assert HOST not in worst_series(st)
    else:
        assert worst_series(st)[slot] == kind
    bad = drain.worst(st)
    assert bad == drain.Worst(f.severity, where, kind, f.action, xid_of(f), latches(where, f))
    said = reason_of(where, f) if f.severity == CRITICAL else ""
    assert drain.reason(st, "", now) == (True, said)
    update = drain.decide(node(), st, "", now).update
    assert update == (("update", "NodeName=n1", "State=DRAIN", f"Reason={said}") if said else ())
    said = f"{where} {kind}: {f.action}"
    # node-problem-detector: the worst critical sets the condition, the worst warning its event.
    warned = [(s or "host", p) for s, p in ranked(st) if p["severity"] == WARNING]
    if warned:
        (s, p) = warned[0]
        assert drain.npd_warning(st, "", now) == (1, f"warning: {s} {p['kind']}: {p['action']}")
    else:
        assert drain.npd_warning(st, "", now) == (0, "ok: no warning")
    if f.severity == CRITICAL:
        assert drain.npd(st, "", now) == (1, f"critical: {said}")
    else:
        assert drain.npd(st, "", now) == (0, f"ok; warning: {said}")


# NHC's check runs a shell: the first rows, and issue 24's criticals.
ISSUE = {id(f) for f in (STUCK, MISMATCH_BEFORE, MISMATCH_AFTER, SMI_FAILING)}
NHC = TABLE[:3] + [row for row in TABLE if any(id(f) in ISSUE for f in row[1].get(HOST, []))]


@pytest.mark.parametrize(("name", "found", "expected"), NHC, ids=[row[0] for row in NHC])
def test_nhc_names_the_same_worst(
    tmp_path: str, name: str, found: dict[str, list[Finding]], expected: tuple[str, str]
) -> None:
    slot, kind = expected
    (f,) = [f for f in found[slot] if f.kind == kind]
    proc = nhc(str(tmp_path), made(found, time.time()))
    assert proc.stdout == f"die 1: {reason_of(slot or 'host', f)}\nrc 1\n"


def test_the_order_of_actions() -> None:
    order = [
        "drain_and_rma",
        "reboot",
        "drain_and_reset",
        "reset_gpu",
        "check_host",
        "drain_p2p",
        "restart_service",
        "restart_app",
        "none",
    ]
    assert sorted(order, key=lambda a: rank(CRITICAL, a, A, "x")) == order
    # One this version does not know (a newer agent's) may take more than any.
    assert rank(CRITICAL, "replace_tray", A, "x") < rank(CRITICAL, "drain_and_rma", A, "x")


def test_the_issue_s_counterexamples_drain_with_the_reason_they_name() -> None:
    # A stuck nvidia-smi and a driver/library mismatch drain; the mismatch that a reboot did
    # not end asks for check_host, never a reboot again.
    now = time.time()
    for f, reason in [
        (STUCK, "gpuagent: host driver_hung reboot"),
        (MISMATCH_BEFORE, "gpuagent: host driver_mismatch reboot"),
        (MISMATCH_AFTER, "gpuagent: host driver_mismatch check_host"),
        (SMI_FAILING, "gpuagent: host smi_failing check_host"),
    ]:
        st = made({HOST: [f]}, now)
        assert drain.reason(st, "", now) == (True, reason)
        assert judge(st, now)[0] == 2
    for f in (BLIP, SMI_BLIND):
        st = made({HOST: [f]}, now)
        assert drain.reason(st, "", now) == (True, "")
        assert judge(st, now)[0] == 1
