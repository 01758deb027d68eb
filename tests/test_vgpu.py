"""vGPU guests' licences (issue 28): ``nvidia-smi -q``'s sections parsed from the captures in
data/corpus/vgpu (NVIDIA/gpu-operator#628 and #220, bottlerocket-kernel-kit#285) and the
whole ``-q`` captures in data/corpus/nvlink; the source's gate (no spawn without
``nvidia-gridd``), cadence, learning and outage with the fake nvidia-smi and the probe's
Runner; the licence server from ``gridd.conf``; the status row."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import pytest

from gpuagent.commands import statusrows, statustext
from gpuagent.config import Config
from gpuagent.edges.runner import Runner
from gpuagent.logs import Event, EventLog
from gpuagent.schema import ProbeState
from gpuagent.sources.vgpu import gridd, licence
from gpuagent.sources.vgpu.source import GRIDD, VgpuSource
from gpuagent.views import BusView, Gate, PciGpu, ProbeView, Tick, VgpuGpu, VgpuView
from tests import fakehost, states
from tests.conftest import Host
from tests.fakehost import FakeHost
from tests.replay import CORPUS

RESTRICTED = "query-q-vcs-unlicensed-restricted-gpu-operator628-TRIMMED.txt"
PLAIN = "query-q-vcs-unlicensed-gpu-operator220-TRIMMED.txt"
LICENSED = "query-q-vws-licensed-expiry-na-bottlerocket285-TRIMMED.txt"
H100 = "query-q-h100-80gb-hbm3-driver590.48.01-fabric-completed-clique0.txt"
HGX = "query-q-h100-80gb-hbm3-x8-driver535.161.08-gpu0-fabric-state-status-only-TRIMMED.txt"
L40S = "query-q-l40s-driver595.80-fabric-na-partition-assigned.txt"
SLOT = "0000:00:09.0"  # the H100 capture's GPU
# DCGM's words for NVML_GRID_LICENSE_STATE_UNLICENSED_UNRESTRICTED (NVIDIA/DCGM, DcgmVgpu.cpp,
# ConvertNvmlGridLicenseStateToString): the grace period; no public capture prints it.
GRACE = "Unlicensed (Unrestricted)"
SERVER = "the licence server 10.0.0.5:443 (ServerAddress in /etc/nvidia/gridd.conf)"


def capture(sub: str, name: str) -> str:
    with open(os.path.join(CORPUS, sub, name), encoding="utf-8") as f:
        return f.read()


def guest(section: str = RESTRICTED, status: str | None = None) -> str:
    """The H100's whole ``-q`` as a vGPU guest prints it: its mode ``VGPU`` and, after that
    block, a captured licence section (its status replaced by ``status``, where given)."""
    text = capture("nvlink", H100).replace(": Pass-Through", ": VGPU")
    lic = capture("vgpu", section)
    if status is not None:
        lic = lic.replace(": Unlicensed (Restricted)", f": {status}")
    anchor = "        vGPU Heterogeneous Mode                        : N/A\n"
    assert anchor in text
    return text.replace(anchor, anchor + lic, 1)


@pytest.mark.parametrize(
    ("name", "status", "product"),
    [
        (RESTRICTED, "Unlicensed (Restricted)", "NVIDIA Virtual Compute Server"),
        (PLAIN, "Unlicensed", "NVIDIA Virtual Compute Server"),
        (LICENSED, "Licensed (Expiry: N/A)", "NVIDIA RTX Virtual Workstation"),
    ],
)
def test_each_capture(name: str, status: str, product: str) -> None:
    (got,) = licence.parse(capture("vgpu", name))
    assert (got.slot, got.mode, got.product, got.status) == ("", None, product, status)


def test_a_guest_has_its_gpu_its_mode_and_its_licence() -> None:
    (got,) = licence.parse(guest())
    assert got == licence.Licence(
        SLOT, "VGPU", "NVIDIA Virtual Compute Server", "Unlicensed (Restricted)"
    )


@pytest.mark.parametrize(
    ("name", "mode"), [(H100, "Pass-Through"), (HGX, "None"), (L40S, "Pass-Through")]
)
def test_bare_metal_and_passthrough_have_no_licensed_product(name: str, mode: str | None) -> None:
    found = licence.parse(capture("nvlink", name))
    assert all(not g.licensed_product for g in found)
    assert [g.mode for g in found] == ([] if mode is None else [mode])
    assert all(licence.finding(g, SERVER) is None for g in found)


def test_unlicensed_restricted_is_critical_and_names_the_server() -> None:
    (got,) = licence.parse(guest())
    f = licence.finding(got, SERVER)
    assert f is not None
    assert (f.kind, f.severity, f.action) == (licence.UNLICENSED, "critical", "check_host")
    assert f.message == (
        "vGPU licence Unlicensed (Restricted): NVIDIA Virtual Compute Server is restricted, "
        f"CUDA fails or is throttled until nvidia-gridd gets a licence from {SERVER}; "
        "see journalctl -u nvidia-gridd"
    )
    assert f.ends == "when nvidia-smi -q says the guest is licensed"


def test_an_older_drivers_plain_unlicensed_is_restricted() -> None:
    (got,) = licence.parse(capture("vgpu", PLAIN))
    f = licence.finding(got, SERVER)
    assert f is not None and (f.kind, f.severity) == (licence.UNLICENSED, "critical")


def test_the_grace_period_is_a_warning() -> None:
    (got,) = licence.parse(guest(status=GRACE))
    f = licence.finding(got, SERVER)
    assert f is not None
    assert (f.kind, f.severity, f.action) == (licence.GRACE, "warning", "check_host")
    assert "runs in its grace period" in f.message and SERVER in f.message


@pytest.mark.parametrize(
    "status", ["Licensed (Expiry: N/A)", "Licensed (Expiry: 2026-12-3 0:0:0 GMT)"]
)
def test_a_licensed_guest_says_nothing(status: str) -> None:
    (got,) = licence.parse(guest(status=status))
    assert licence.finding(got, SERVER) is None


def test_sections_end_where_their_indentation_does() -> None:
    text = (
        "GPU 00000000:02:01.0\n"
        "    vGPU Software Licensed Product\n"
        "        License Status : Unlicensed (Restricted)\n"
        "    Product Name : NVIDIA H100-80C\n"  # the GPU's own name: not the licence's
        "GPU 00000000:03:01.0\n"
        "    Product Name : NVIDIA H100-80C\n"
    )
    assert licence.parse(text) == (
        licence.Licence("0000:02:01.0", None, None, "Unlicensed (Restricted)"),
    )


def test_the_licence_server_from_gridd_conf() -> None:
    # NVIDIA/nvidia-docker#1787's gridd.conf, its addresses masked there: ours stand in.
    conf = (
        "ServerAddress=10.0.0.5\nServerPort=443\nBackupServerAddress=10.0.0.6\n"
        "BackupServerPort=443\nFeatureType=1\nEnableUI=FALSE\nLicenseInterval=1440\n"
    )
    assert gridd.server(conf) == SERVER
    assert gridd.server("ServerAddress=dls.example\n") == (
        "the licence server dls.example (ServerAddress in /etc/nvidia/gridd.conf)"
    )
    by_token = f"the licence server of the client configuration token in {gridd.CLIENT_CONFIG_DIR}"
    assert gridd.server("#ServerAddress=10.0.0.5\nFeatureType=1\n") == by_token
    assert gridd.server(None) == by_token
    assert len(gridd.server("ServerAddress=" + "a" * 5000)) < 400


def test_gridd_conf_is_read_as_a_regular_file_or_not_at_all(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "gridd.conf")
    assert gridd.read(path) is None
    with open(path, "w", encoding="utf-8") as f:
        f.write("ServerAddress=10.0.0.5\n")
    assert gridd.read(path) == "ServerAddress=10.0.0.5\n"
    os.symlink(path, path + ".link")
    assert gridd.read(path + ".link") is None


# The source, with the fake nvidia-smi answering every call with the step's stdout.


@pytest.fixture
def one(tmp_path: str) -> FakeHost:
    """A fake host with one GPU, without an agent: the source alone reads through it."""
    return fakehost.create(str(tmp_path), gpus=1)


def source(
    host: FakeHost, installed: bool = True, every: float = 30.0
) -> tuple[VgpuSource, list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    logger = logging.getLogger(f"test.vgpu.{id(host)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.handlers[:] = [_Keep(records)]
    cfg = Config(interval=10.0, vgpu_interval=every, sysfs_root=host.root, backoff_after=3)
    runner = Runner(timeout=fakehost.PATIENT, kill_grace=0.3)

    def which(name: str) -> str | None:
        assert name == GRIDD
        return "/usr/bin/nvidia-gridd" if installed else None

    conf: Callable[[], str | None] = lambda: "ServerAddress=10.0.0.5\nServerPort=443\n"  # noqa: E731
    return VgpuSource(cfg, runner, EventLog(logger), which=which, gridd_conf=conf), records


class _Keep(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


def message_id(record: logging.LogRecord) -> str:
    return str(record.__dict__.get("MESSAGE_ID"))


def queries(host: FakeHost) -> int:
    return sum(1 for argv in host.calls() if argv == ["-q"])


def test_no_spawn_where_nvidia_gridd_is_not_installed(one: FakeHost) -> None:
    one.scenario(stdout=guest())
    s, _ = source(one, installed=False, every=10.0)
    assert all(s.read(one.smi, one.slots) == {} for _ in range(100))
    assert queries(one) == 0 and s.view.spawns_total == 0 and s.view.gpus == {}


def test_nvidia_gridd_is_looked_for_once_a_period(one: FakeHost) -> None:
    s, _ = source(one, installed=False, every=30.0)
    looked: list[str] = []

    def which(name: str) -> str | None:
        looked.append(name)
        return None

    s.which = which
    assert [s.read(one.smi, one.slots) for _ in range(6)] == [{}, None, None, {}, None, None]
    assert looked == [GRIDD, GRIDD]


def test_a_restricted_guest_is_critical_read_on_its_own_cadence(one: FakeHost) -> None:
    one.scenario(stdout=guest())
    s, records = source(one)
    found = s.read(one.smi, [SLOT])
    assert found is not None
    assert [(f.kind, f.severity) for f in found[SLOT]] == [(licence.UNLICENSED, "critical")]
    assert SERVER in found[SLOT][0].message
    assert s.view.gpus[SLOT].status == "Unlicensed (Restricted)"
    # Every 30 s at a 10 s tick: the next two ticks hold the last findings, the third reads.
    assert [s.read(one.smi, [SLOT]) is None for _ in range(3)] == [True, True, False]
    assert queries(one) == 2 and s.view.spawns_total == 2
    assert records == []
    # Licensed: the problem ends, the view says so.
    one.scenario(stdout=guest(status="Licensed (Expiry: N/A)"))
    s.expedite()
    assert s.read(one.smi, [SLOT]) == {}
    assert s.view.gpus[SLOT].status == "Licensed (Expiry: N/A)"


def test_no_licensed_product_is_learnt_once_per_set_of_gpus(one: FakeHost) -> None:
    one.scenario(stdout=capture("nvlink", H100))
    s, _ = source(one, every=10.0)
    assert s.read(one.smi, [SLOT]) == {}
    for _ in range(50):
        assert s.read(one.smi, [SLOT]) is None
    assert queries(one) == 1
    s.read(one.smi, [SLOT, "0000:01:00.0"])  # another set of GPUs is asked once more
    assert queries(one) == 2


def test_a_failing_read_is_one_warning_then_one_line(one: FakeHost) -> None:
    one.scenario(stdout="Unable to determine the device handle for GPU0000:00:09.0\n", exit=255)
    s, records = source(one, every=10.0)
    for _ in range(3):
        assert s.read(one.smi, [SLOT]) is None
    (warning,) = [r for r in records if r.levelno == logging.WARNING]
    assert message_id(warning) == Event.VGPU_READ_FAILED.value
    assert warning.getMessage().startswith("vGPU licences not read: nvidia-smi -q: exit 255")
    one.scenario(stdout=guest())
    for _ in range(8):  # backed off: a few ticks until the next try
        if s.read(one.smi, [SLOT]) is not None:
            break
    assert [message_id(r) for r in records[1:]] == [Event.VGPU_READ_RECOVERED.value]


def _tick(cfg: Config, probe: ProbeView) -> Tick:
    bus = BusView(gpus=(PciGpu(SLOT, "0x2330", "0x030200", "nvidia"),))
    return Tick(0.0, 0.0, cfg, bus=bus, probe=probe)


def test_a_gate_ends_the_findings_and_a_failing_probe_holds_them(one: FakeHost) -> None:
    one.scenario(stdout=guest())
    s, _ = source(one)
    cfg = Config(interval=10.0)
    gated = s.step(_tick(cfg, ProbeView(state=ProbeState.GATED, gate=Gate.DRIVER_NOT_LOADED)))
    assert gated.findings == {"vgpu": {}}
    assert s.step(_tick(cfg, ProbeView(state=ProbeState.FAILING))).findings == {}
    ok = s.step(_tick(cfg, ProbeView(state=ProbeState.OK, binary=one.smi)))
    assert [f.kind for f in ok.findings["vgpu"][SLOT]] == [licence.UNLICENSED]
    assert queries(one) == 1


def test_the_status_row() -> None:
    row = {"mode": "VGPU", "product": "NVIDIA Virtual Compute Server"}
    assert statusrows.vgpu_row({**row, "license_status": "Unlicensed (Restricted)"}) == (
        "vGPU NVIDIA Virtual Compute Server: Unlicensed (Restricted)"
    )
    assert statusrows.vgpu_row({"product": None, "license_status": None}) == (
        "vGPU: licence not known"
    )
    assert statusrows.vgpu_row(None) is None


def test_the_state_and_status_of_a_guest() -> None:
    (got,) = licence.parse(guest())
    f = licence.finding(got, SERVER)
    assert f is not None
    slot = states.SLOT
    view = VgpuView({slot: VgpuGpu(got.mode, got.product, got.status)}, 1)
    st = states.state(
        vgpu=view,
        problems={slot: [states.problem(f.kind, f.severity, f.action, message=f.message)]},
    )
    assert states.gpu(st)["vgpu"] == {
        "mode": "VGPU",
        "product": "NVIDIA Virtual Compute Server",
        "license_status": "Unlicensed (Restricted)",
    }
    text = statustext.render(st, st["updated_at"], 0, "", width=200)
    assert "      vGPU NVIDIA Virtual Compute Server: Unlicensed (Restricted)\n" in text
    assert "check_host: critical vgpu_unlicensed: vGPU licence Unlicensed (Restricted)" in text
    # Bare metal: no key, no row.
    plain = states.state()
    assert "vgpu" not in states.gpu(plain)
    assert "vGPU" not in statustext.render(plain, plain["updated_at"], 0, "", width=200)


def test_a_restricted_guest_is_critical_in_the_state_and_the_status_line(
    host: Host, tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    slot = host.slots[0]
    text = guest().replace("GPU 00000000:00:09.0", f"GPU 0000{slot.upper()}")
    host.healthy(query=text)
    daemon = os.path.join(tmp_path, "bin", GRIDD)
    os.makedirs(os.path.dirname(daemon))
    with open(daemon, "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n")
    os.chmod(daemon, 0o700)
    monkeypatch.setenv("PATH", f"{os.path.dirname(daemon)}:{os.environ['PATH']}")
    host.make_agent(vgpu_interval=30.0)
    st = host.tick(4).state
    assert sum(1 for argv in host.calls() if argv == ["-q"]) == 2  # ticks 1 and 4
    (p,) = [p for p in states.gpu(st, slot)["problems"] if p["kind"] == licence.UNLICENSED]
    assert (p["severity"], p["action"]) == ("critical", "check_host")
    assert "client configuration token" in p["message"]  # this host has no gridd.conf
    assert states.gpu(st, slot)["vgpu"]["license_status"] == "Unlicensed (Restricted)"
    assert st["status"].startswith(f"check the host: fixes {slot}; 1 critical")
    assert host.events(Event.PROBLEM_VGPU_UNLICENSED)


def test_a_healthy_host_without_nvidia_gridd_never_runs_q(host: Host) -> None:
    host.healthy()
    host.make_agent(vgpu_interval=10.0)
    st = host.tick(5).state
    assert not any(argv == ["-q"] for argv in host.calls())
    assert not any("vgpu" in g for g in st["gpus"]) and st["status"] == "8 GPUs, sampling"


def test_an_answer_for_a_slot_on_no_gpu_makes_no_phantom(one: FakeHost) -> None:
    # Issue 40: an -q answer naming a slot no GPU is in made a phantom GPU, critical.
    one.scenario(stdout=guest())
    s, _ = source(one)
    assert s.read(one.smi, ["0000:01:00.0"]) == {}
    assert s.view.gpus == {}
