"""The .deb under a real systemd: install, status, the driver-upgrade story, watchdog, purge.

Boots a Debian 12 and a Debian 13 container with ../shared/tools/systemd-lab
(systemd-nspawn --boot), as root, and installs the same .deb in each. The rootfs is cached
under /var/tmp; each release takes a few minutes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from gpuagent.logs import Event
from gpuagent.sources.bus import pci
from tests import fakesysfs, journalfeed, xidcorpus
from tests.system.test_package import build
from tests.tools import need

pytestmark = pytest.mark.system

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = os.path.join(os.path.dirname(REPO), "shared", "tools", "systemd-lab")
ROOTFS = "/var/tmp/gpuagent-systemd-lab/{suite}.tar.zst"
# Beyond systemd-lab's base: man for `systemd-analyze verify`, and Debian's node exporter,
# installed before gpuagent as on an operator's host. No procps: a minimal image has no
# kill(1), and reloads must work there.
ROOTFS_PACKAGES = "man-db,prometheus-node-exporter"
# The container shares the host's network: a port of its own for its node exporter.
NODE_EXPORTER = "127.0.0.1:19100"
LINK = "/var/lib/prometheus/node-exporter/gpuagent.prom"
FETCH = (
    "import urllib.request; "
    f"print(urllib.request.urlopen('http://{NODE_EXPORTER}/metrics').read().decode())"
)
NO_GPU = "no NVIDIA GPU on the PCI bus"
CAPTURE = "h200-linux-driver590.48.01-load-query-gpu-all-fields.csv"
MISMATCH = "driver-library-version-mismatch-exit18-nvml535.161.txt"
# The fake GPU host inside the container: tests/ (fakes and corpus) and the agent's config.
FAKE = "/opt/gpuagent-test"
FAKE_CONFIG = f"""\
interval = 0.5
retry_max = 2
nvidia_smi = "{FAKE}/tests/fake_nvidia_smi.py"
sysfs_root = "{FAKE}/sys"
"""
DROP_IN = f"""\
[Service]
Environment=GPUAGENT_CONFIG={FAKE}/gpuagent.toml FAKE_NVIDIA_SMI_SCENARIO={FAKE}/scenario.json
WatchdogSec=3
"""
# The host's remedy leads (driver_mismatch's action, by its name where its words do not fit);
# the probe's detail has no room left.
FAILING_STATUS = re.compile(
    r"^(?:check_host|reboot|[a-z ]+: fixes [^;]*); 1 critical; "
    r"8 GPUs, nvidia-smi failing \(version_mismatch\)$"
)

# pgrep -f /usr/bin/gpuagent, without procps: the pids whose command line has that argument.
PGREP = """
import os
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\\0")
    except OSError:
        continue  # gone meanwhile
    if "/usr/bin/gpuagent".encode() in argv:
        found.append(int(pid))
print(found)
"""

T = TypeVar("T")


def one(entries: list[dict[str, Any]], what: str) -> dict[str, Any]:
    assert len(entries) == 1, f"{len(entries)} journal entries for {what}, not one: {entries}"
    return entries[0]


def wait_for(what: str, check: Callable[[], T], timeout: float) -> T:
    """Poll ``check`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.25)


class Container:
    """A booted container and the gpuagent unit in it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(
        self, *argv: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [LAB, "exec", self.name, *argv],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            pytest.fail(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
        return proc

    def out(self, *argv: str) -> str:
        return self.run(*argv).stdout.strip()

    def copy(self, src: str, dst: str) -> None:
        subprocess.run([LAB, "copy", self.name, src, dst], check=True, timeout=60)

    def write(self, path: str, text: str) -> None:
        """Replace ``path`` atomically (the agent and the fake read these files any time)."""
        script = 'mkdir -p "${1%/*}" && cat >"$1.tmp" && chmod 644 "$1.tmp" && mv "$1.tmp" "$1"'
        self.run("sh", "-c", script, "sh", path, stdin=text)

    def apt(self, *args: str) -> str:
        """Run apt-get; returns what it printed."""
        env = ("env", "DEBIAN_FRONTEND=noninteractive")
        proc = self.run(*env, "apt-get", "-q", "-y", *args, timeout=300)
        return proc.stdout + proc.stderr

    def prop(self, name: str) -> str:
        return self.out("systemctl", "show", "-p", name, "--value", "gpuagent")

    def events(self, event: Event) -> list[dict[str, Any]]:
        """The unit's journal entries with ``event``'s MESSAGE_ID."""
        text = self.out("journalctl", "-u", "gpuagent", "-o", "json", "--no-pager")
        entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [e for e in entries if e.get("MESSAGE_ID") == event.value]

    def status(
        self, *args: str, config: str = "", columns: int = 0
    ) -> subprocess.CompletedProcess[str]:
        """``gpuagent status`` as an unprivileged user (``gpuagent detect`` etc. with args),
        in a terminal ``columns`` wide where that is given."""
        command = args if args and not args[0].startswith("-") else ("status", *args)
        pairs = [f"GPUAGENT_CONFIG={config}"] if config else []
        pairs += [f"COLUMNS={columns}"] if columns else []
        env = ("env", *pairs) if pairs else ()
        return self.run("runuser", "-u", "nobody", "--", *env, "gpuagent", *command, check=False)

    def ticks(self) -> int:
        """The running agent's tick count, from its state file."""
        st = json.loads(self.status("--json").stdout)
        return int(st.get("ticks", 0))

    def wait_ticks(self, n: int) -> None:
        """Wait until the agent has ticked ``n`` more times: to see that something does not
        happen again, count ticks, not seconds (a busy machine ticks late)."""
        start = self.ticks()
        wait_for(f"{n} more ticks", lambda: self.ticks() >= start + n, 30)

    def metrics(self) -> str:
        """What the node exporter serves."""
        return self.out("python3", "-c", FETCH)

    def count(self, text: str) -> int:
        """Lines of the unit's journal that contain ``text``."""
        return sum(text in line for line in self.journal().splitlines())

    def journal(self) -> str:
        return self.run(
            "journalctl", "-u", "gpuagent", "--no-pager", "-o", "short-precise", check=False
        ).stdout


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build(str(tmp_path_factory.mktemp("deb")))


@pytest.fixture(params=["bookworm", "trixie"])
def container(request: pytest.FixtureRequest) -> Iterator[Container]:
    with booted(request.param) as c:
        yield c


@contextlib.contextmanager
def booted(suite: str) -> Iterator[Container]:
    """A container of Debian ``suite`` ("bookworm", "trixie"), booted, stopped after."""
    need(os.geteuid() == 0, "systemd-lab needs root")
    need(os.access(LAB, os.X_OK), f"{LAB} is missing")
    env = {**os.environ, "SYSTEMD_LAB_SUITE": suite}
    rootfs = ROOTFS.format(suite=suite)
    made = subprocess.run(
        [LAB, "rootfs", rootfs, ROOTFS_PACKAGES],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    c = Container(f"gpuagent-test-{suite}-{os.getpid()}")
    try:
        boot = subprocess.run(
            [LAB, "boot", c.name, rootfs],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=180,
        )
        assert boot.returncode == 0, boot.stderr
        yield c
    finally:
        subprocess.run([LAB, "stop", c.name], check=False, timeout=120)


def test_package_under_systemd(deb: str, container: Container) -> None:
    c = container
    try:
        install(c, deb)
        no_gpu(c)
        fake_gpu_host(c)
        driver_upgrade(c)
        second_agent(c)
        node_exporter(c)
        gpu_problem(c)
        watchdog(c)
        purge(c)
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}")
        raise


def install(c: Container, deb: str, *, current: bool = True) -> None:
    """Install ``deb`` in ``c`` and check the service it starts; ``current``: the package is
    this tree's, so its journal catalog has every MESSAGE_ID this tree logs (an older package
    knows fewer)."""
    c.write(
        "/etc/default/prometheus-node-exporter", f'ARGS="--web.listen-address={NODE_EXPORTER}"\n'
    )
    c.run("systemctl", "restart", "prometheus-node-exporter")
    for kill in ("/bin/kill", "/usr/bin/kill"):
        assert c.run("test", "!", "-e", kill, check=False).returncode == 0, f"{kill} is there"
    c.copy(deb, "/root/")
    c.apt("update")  # the dependencies come from Debian's archive
    c.apt("install", f"/root/{os.path.basename(deb)}")
    assert c.out("systemctl", "is-enabled", "gpuagent") == "enabled"
    assert c.out("systemctl", "is-active", "gpuagent") == "active"
    verify = c.run("systemd-analyze", "verify", "gpuagent.service", check=False)
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    security = c.out("systemd-analyze", "security", "--no-pager", "gpuagent.service")
    m = re.search(r"Overall exposure level for gpuagent\.service: (\d+\.\d+)", security)
    assert m is not None and float(m.group(1)) <= 1.5, security
    # No device allow-list (ProtectClock=yes would be one before systemd 252): /dev/nvidia* open.
    assert (c.prop("ProtectClock"), c.prop("DevicePolicy"), c.prop("DeviceAllow")) == (
        "no",
        "auto",
        "",
    )
    assert c.prop("LimitNOFILE") == "1024"
    # systemd's dpkg trigger compiled the catalog.
    catalog = c.out("journalctl", "--list-catalog")
    assert not current or all(e.value in catalog for e in Event)


def no_gpu(c: Container) -> None:
    """On a host without GPUs: the status line, and `gpuagent status` for any user."""
    if pci.scan("/sys")[0]:
        # The container sees the host's sysfs: on a host with GPUs, the agent sees them.
        assert re.match(r"\d+ GPUs?, ", c.prop("StatusText"))
        return
    assert c.prop("StatusText") == NO_GPU
    status = c.status()
    assert status.returncode == 0, status.stdout + status.stderr
    assert NO_GPU in status.stdout


def fake_gpu_host(c: Container) -> None:
    """8 H200s on a fake bus, the fake nvidia-smi failing with exit 18 (an upgrade)."""
    fake_host(c, {"error": MISMATCH, "exit": 18})


def fake_host(c: Container, scenario: dict[str, object], config: str = "") -> None:
    """8 H200s on a fake bus for the service, the fake nvidia-smi playing ``scenario``;
    ``config`` is more lines of its config file."""
    c.copy(os.path.join(REPO, "tests"), f"{FAKE}/tests")
    c.run("rm", "-rf", f"{FAKE}/tests/system")
    c.run("chmod", "-R", "a+rX", FAKE)
    make = f"from tests import fakesysfs; fakesysfs.gpu_host('{FAKE}/sys', 8)"
    c.run("env", f"PYTHONPATH={FAKE}", "python3", "-c", make)
    c.write(f"{FAKE}/gpuagent.toml", FAKE_CONFIG + config)
    c.write(f"{FAKE}/scenario.json", json.dumps(scenario))
    c.write("/etc/systemd/system/gpuagent.service.d/test.conf", DROP_IN)
    c.run("systemctl", "daemon-reload")
    c.run("systemctl", "restart", "gpuagent")


def driver_upgrade(c: Container) -> None:
    """Failing with a version mismatch: one error (driver_mismatch's, which tells exit 18's
    outage); then healthy: one line of its end."""
    mismatch = Event.PROBLEM_DRIVER_MISMATCH
    wait_for("the version-mismatch error", lambda: c.events(mismatch), 20)
    wait_for("the failing status", lambda: FAILING_STATUS.match(c.prop("StatusText")), 10)
    c.wait_ticks(4)  # four more ticks, to see that the line is not repeated
    error = one(c.events(mismatch), "the version mismatch")
    assert {k: error.get(k) for k in ("PRIORITY", "PROBLEM", "SEVERITY")} == {
        "PRIORITY": "3",
        "PROBLEM": "driver_mismatch",
        "SEVERITY": "critical",
    }
    assert error["SYSLOG_IDENTIFIER"] == "gpuagent"
    assert "Driver/library version mismatch (exit 18)" in error["MESSAGE"]
    assert c.status().returncode == 2  # critical: nothing is known about the GPUs

    slots = fakesysfs.gpu_slots(8)
    c.write(f"{FAKE}/scenario.json", json.dumps({"capture": CAPTURE, "slots": slots}))
    wait_for("the end of the mismatch", lambda: c.events(Event.PROBLEM_CLEARED), 10)

    def fresh() -> dict[str, Any]:
        st: dict[str, Any] = json.loads(c.status("--json").stdout)
        gpus = st["gpus"]
        ok = len(gpus) == 8 and not any(g["stale"] for g in gpus)
        return st if ok and all(time.time() - g["sampled_at"] < 5 for g in gpus) else {}

    st = wait_for("8 fresh samples in gpuagent status --json", fresh, 10)
    assert sorted(g["pci_slot"] for g in st["gpus"]) == slots
    cleared = one(c.events(Event.PROBLEM_CLEARED), "the end of the mismatch")
    assert cleared["MESSAGE"] == "host: driver_mismatch cleared"
    assert c.events(Event.RECOVERED) == []
    assert c.prop("StatusText") == "8 GPUs, sampling"
    status = c.status()
    assert status.returncode == 0, status.stdout + status.stderr
    # StateDirectory=gpuagent: the GPUs this host had, remembered (known.py).
    known = json.loads(c.out("cat", "/var/lib/gpuagent/gpus.json"))
    assert sorted(g["pci_slot"] for g in known["gpus"]) == slots


def second_agent(c: Container) -> None:
    """`gpuagent run` by hand beside the service: "already running", nothing touched."""
    pid = c.prop("MainPID")
    env = ("env", f"GPUAGENT_CONFIG={FAKE}/gpuagent.toml")
    second = c.run(*env, "gpuagent", "run", check=False)
    assert second.returncode == 75, second.stdout + second.stderr
    assert f"already running (pid {pid})" in second.stderr
    assert json.loads(c.status("--json").stdout)["pid"] == int(pid)
    assert c.run("test", "-s", "/run/gpuagent/gpuagent.prom", check=False).returncode == 0
    # With a config of its own, a state file of its own and no textfile named: it runs, says
    # in one line that it writes no metrics, and leaves the service's textfile alone.
    c.write("/root/try.toml", FAKE_CONFIG + 'state_file = "/root/try/state.json"\n')
    c.run("mkdir", "-p", "/root/try")
    hand = c.run("gpuagent", "--config", "/root/try.toml", "run", "--ticks", "3", check=False)
    assert hand.returncode == 0, hand.stderr
    said = [line for line in hand.stderr.splitlines() if "Prometheus" in line]
    assert len(said) == 1, hand.stderr
    assert "not started by systemd, and no textfile set: writing no Prometheus" in said[0]
    assert json.loads(c.out("cat", "/root/try/state.json"))["ticks"] == 3
    assert c.out("readlink", LINK) == "/run/gpuagent/gpuagent.prom"
    owner = c.out("stat", "-c", "%U", "/run/gpuagent/gpuagent.prom")
    assert owner == c.out("stat", "-c", "%U", "/run/gpuagent/state.json") != "root"
    assert c.prop("MainPID") == pid


def node_exporter(c: Container) -> None:
    """Debian's node exporter serves gpuagent's series with no step beyond `apt install`."""

    def series() -> str:
        text = c.metrics()
        return text if "gpuagent_gpu_info{" in text else ""

    text = wait_for("gpuagent_ series from the node exporter", series, 15)
    assert re.search(r"^gpuagent_probe_up 1$", text, re.M), text
    assert len(re.findall(r"^gpuagent_gpu_temperature_celsius\{", text, re.M)) == 8
    assert re.search(r"^node_textfile_scrape_error 0$", text, re.M), text
    # Stopped: no series, and no dangling link for node_exporter to report an error about.
    c.run("systemctl", "stop", "gpuagent")
    text = c.metrics()
    assert "gpuagent_" not in text
    assert re.search(r"^node_textfile_scrape_error 0$", text, re.M), text
    # ...and `gpuagent status` says it is stopped and since when, not that it never ran.
    status = c.status()
    assert status.returncode == 3, status.stdout + status.stderr
    assert re.match(r"\u25cb gpuagent - gpuagent has been stopped since \w+ \d{4}-", status.stdout)
    # `gpuagent run` as root meanwhile: no /run/gpuagent, and it says how to run by hand.
    hand = c.run("gpuagent", "run", check=False)
    assert hand.returncode == 78, hand.stderr
    assert "/run/gpuagent, the service's state directory, is not there" in hand.stderr
    assert "--config FILE, FILE setting another state_file" in hand.stderr
    # The files it read, then why it does not start: nothing else.
    read, refused = hand.stderr.splitlines()
    # The package ships no /etc/gpuagent/gpuagent.toml: the defaults are built in.
    want = "info: configuration: the defaults; /etc/gpuagent/gpuagent.toml: no such file"
    assert read.startswith(want), read
    assert refused.startswith("error: not starting: "), refused
    c.run("systemctl", "start", "gpuagent")
    wait_for("gpuagent_ series again", series, 15)
    # Installed after gpuagent: the package's trigger links the textfile, no restart needed;
    # its reload needs no kill(1).
    link = LINK
    c.run("systemctl", "stop", "gpuagent")
    c.apt("remove", "prometheus-node-exporter")  # (its /etc/default, with our port, stays)
    assert c.run("test", "-e", "/var/lib/prometheus/node-exporter", check=False).returncode
    c.run("systemctl", "start", "gpuagent")
    pid = c.prop("MainPID")
    assert c.run("test", "-L", link, check=False).returncode  # nothing to link into
    errors = errors_logged(c)
    printed = c.apt("install", "prometheus-node-exporter")
    assert "gpuagent.service failed" not in printed, printed
    assert c.out("readlink", link) == "/run/gpuagent/gpuagent.prom"
    wait_for("gpuagent_ series after node_exporter came", series, 15)
    assert c.prop("MainPID") == pid
    # Its directory came before the trigger relinked: the agent, writing its own file under
    # /run/gpuagent, had nothing to fail on meanwhile.
    c.wait_ticks(2)
    assert errors_logged(c) == errors, c.journal()


def errors_logged(c: Container) -> list[str]:
    """The unit's journal lines at priority error or worse."""
    return c.out("journalctl", "-u", "gpuagent", "-p", "err", "-o", "cat", "--no-pager").split("\n")


def gpu_problem(c: Container) -> None:
    """One critical problem (the driver asks for a reset of one GPU) on every surface."""
    slots = fakesysfs.gpu_slots(8)
    sick = slots[0]
    step = {
        "capture": CAPTURE,
        "slots": slots,
        "override": {sick: {"gpu_recovery_action": "Reset"}},
    }
    c.write(f"{FAKE}/scenario.json", json.dumps(step))
    wait_for("the problem's journal line", lambda: c.events(Event.PROBLEM_RECOVERY_ACTION), 10)
    attention = f"reset the GPU: fixes {sick}; 1 critical; 8 GPUs, sampling"
    wait_for("the status line", lambda: c.prop("StatusText") == attention, 10)
    assert f'Status: "{attention}"' in c.run("systemctl", "status", "gpuagent", check=False).stdout
    c.wait_ticks(4)  # four more ticks, to see that the line is not repeated
    line = one(c.events(Event.PROBLEM_RECOVERY_ACTION), "the recovery action")
    assert {k: line.get(k) for k in ("PRIORITY", "PCI_SLOT", "PROBLEM", "ACTION")} == {
        "PRIORITY": "3",
        "PCI_SLOT": sick,
        "PROBLEM": "recovery_action",
        "ACTION": "reset_gpu",
    }
    explained = c.out("journalctl", "-u", "gpuagent", "-x", "--no-pager")
    assert "The NVIDIA driver asks for a GPU recovery action" in explained
    assert "Reset: drain the GPU and reset it" in explained
    status = c.status(columns=80)
    assert status.returncode == 2, status.stdout + status.stderr
    assert re.search(rf"^    {sick} +0 +CRITICAL ", status.stdout, re.M), status.stdout
    assert "reset_gpu: critical recovery_action: the driver asks for recovery" in status.stdout
    assert [ln for ln in status.stdout.splitlines() if len(ln) > 80] == [], status.stdout
    wide = c.status("--wide").stdout
    assert re.search(rf"^    {sick} +0 GPU-\S+ +CRITICAL ", wide, re.M), wide
    st = json.loads(c.status("--json").stdout)
    assert st["health"] == "critical"
    problem = re.compile(
        rf'^gpuagent_gpu_problem\{{action="reset_gpu",kind="recovery_action",pci_slot="{sick}",'
        r'severity="critical",uuid="GPU-[^"]+"\} 1(\.0)?$',
        re.M,
    )

    def with_problem() -> str:
        text = c.metrics()
        return text if problem.search(text) else ""

    text = wait_for("the problem in node_exporter", with_problem, 15)
    assert re.search(
        rf'^gpuagent_gpu_healthy\{{pci_slot="{sick}",uuid="[^"]+"\}} 0(\.0)?$', text, re.M
    )
    assert len(re.findall(r"^gpuagent_gpu_temperature_celsius\{", text, re.M)) == 8

    c.write(f"{FAKE}/scenario.json", json.dumps({"capture": CAPTURE, "slots": slots}))
    wait_for("the problem to clear", lambda: c.events(Event.PROBLEM_CLEARED), 10)
    wait_for("the status line", lambda: c.prop("StatusText") == "8 GPUs, sampling", 10)
    assert c.status().returncode == 0


def watchdog(c: Container) -> None:
    """A frozen agent stops pinging; systemd kills and restarts it."""
    pid, restarts = c.prop("MainPID"), int(c.prop("NRestarts"))
    c.run("sh", "-c", 'kill -STOP "$1"', "sh", pid)  # the shell's kill: no procps here
    wait_for("a watchdog restart", lambda: int(c.prop("NRestarts")) > restarts, 30)
    wait_for(
        "the restarted agent to be ready",
        lambda: c.prop("SubState") == "running" and c.prop("MainPID") not in ("0", pid),
        20,
    )
    journal = c.journal()
    assert "Watchdog timeout" in journal
    assert "Failed with result 'watchdog'" in journal


def test_a_typo_and_a_restart_keep_the_agent_running(deb: str, container: Container) -> None:
    """Issue 26: a typo in a drop-in never stops the service."""
    c = container
    try:
        install(c, deb)
        fake_host(c, {"capture": CAPTURE, "slots": fakesysfs.gpu_slots(8)})
        wait_for("the healthy status", lambda: c.prop("StatusText") == "8 GPUs, sampling", 30)
        bad_config(c)
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}")
        raise


def bad_config(c: Container) -> None:
    """The issue's typo, in a drop-in: a reload fails visibly and changes nothing, status and
    detect go on; a restart runs on the valid keys and pages (state, STATUS, the textfile
    through node_exporter), the link made all the same; a good reload ends the problem."""
    config = f"{FAKE}/gpuagent.toml"
    dropin = f"{config}.d/50-typo.toml"
    typo = "unknown key 'intervall'"
    pid = c.prop("MainPID")
    c.write(dropin, "intervall = 5\n")
    errors = len(c.events(Event.CONFIG_ERROR))
    reload = c.run("systemctl", "reload", "gpuagent", check=False)
    assert reload.returncode != 0
    assert "gpuagent.service" in reload.stderr  # "Job for gpuagent.service failed ..."
    error = one(c.events(Event.CONFIG_ERROR)[errors:], "the reload's config error")
    assert f"{dropin}: {typo}" in error["MESSAGE"]
    assert (error["PRIORITY"], error["CONFIG_FILE"]) == ("3", config)
    assert c.out("systemctl", "is-active", "gpuagent") == "active"
    assert c.prop("MainPID") == pid
    assert c.prop("StatusText") == "8 GPUs, sampling"
    for command in ("status", "detect"):
        res = c.status(command, config=config)
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stderr.startswith(f"gpuagent: warning: {dropin}: {typo}"), res.stderr

    c.run("systemctl", "restart", "gpuagent")
    problem = "8 GPUs, sampling; agent problem: config"
    wait_for("the problem on the STATUS line", lambda: c.prop("StatusText") == problem, 30)
    assert c.out("systemctl", "is-active", "gpuagent") == "active"
    assert c.prop("MainPID") != pid
    start = one(c.events(Event.CONFIG_ERROR)[errors + 1 :], "the start's config error")
    assert start["MESSAGE"].startswith(f"{dropin}: {typo}"), start
    assert start["MESSAGE"].endswith("; not used"), start
    st = json.loads(c.status("--json", config=config).stdout)
    assert st["problems"]["config"].startswith(f"{dropin}: {typo}"), st["problems"]
    assert st["interval"] == 0.5  # the main file's keys, and the drop-in's valid ones, hold
    # ExecStartPre's link-textfile linked all the same: node_exporter sees the problem.
    assert c.out("readlink", LINK) == "/run/gpuagent/gpuagent.prom"

    def paged() -> bool:
        return 'gpuagent_agent_problem{kind="config"} 1' in c.metrics()

    wait_for("the problem from node_exporter", paged, 15)
    assert re.search(r"^node_textfile_scrape_error 0$", c.metrics(), re.M)

    c.run("rm", dropin)
    c.run("systemctl", "reload", "gpuagent")
    reloaded = wait_for("the reload", lambda: c.events(Event.RELOADED), 10)
    assert reloaded[-1]["MESSAGE"] == f"configuration reloaded from {config}; probing now"
    # The reload's check-config --quiet: an OK file adds no line of its own to the journal.
    assert f"{config}: OK" not in c.journal()
    wait_for("the problem ended", lambda: c.prop("StatusText") == "8 GPUs, sampling", 10)
    assert "config" not in json.loads(c.status("--json", config=config).stdout)["problems"]


def purge(c: Container) -> None:
    """`apt purge` leaves no unit, no process and nothing under /etc/gpuagent."""
    c.run("rm", "-r", "/etc/systemd/system/gpuagent.service.d")  # the test's own drop-in
    c.apt("purge", "gpuagent")
    assert c.prop("LoadState") == "not-found"
    assert c.out("python3", "-c", PGREP) == "[]"
    for path in (
        "/etc/gpuagent",
        "/lib/systemd/system/gpuagent.service",
        "/usr/lib/systemd/system/gpuagent.service",
        "/etc/systemd/system/multi-user.target.wants/gpuagent.service",
        "/run/gpuagent",
        "/var/lib/gpuagent",
        "/var/lib/private/gpuagent",
        "/usr/lib/systemd/catalog/gpuagent.catalog",
        "/usr/bin/gpuagent",
    ):
        assert c.run("test", "!", "-e", path, check=False).returncode == 0, f"{path} is left"
    assert c.run("test", "!", "-L", LINK, check=False).returncode == 0, f"{LINK} is left"


# Kernel records for the fake host's GPUs, in the driver's own words (../shared/corpus/xid,
# moved to the fake slots): GPU 0 fell off the bus, GPU 1 had two application Xids, and a user
# logged a forged Xid 48 for GPU 2 on stdout, which must count for nothing.
def xid_journal() -> str:
    def corpus(name: str, device: str, slot: str) -> str:
        with open(xidcorpus.path(name), encoding="utf-8") as f:
            return f.read().replace(device, slot.rpartition(".")[0])

    slots = fakesysfs.gpu_slots(3)
    return (
        corpus("xid-79-driver535-pid-unknown-crashdump", "0000:a1:00", slots[0])
        + corpus("xid-13-driver535-a800-pid-unknown", "0000:43:00", slots[1])
        + "#@transport stdout\n#@identifier evil\n"
        + f"NVRM: Xid (PCI:{slots[2][:-2]}): 48, pid=1, name=evil, DBE (0x1,0x0)\n"
    )


def logged_now(text: str, uptime: float) -> str:
    """Kernel lines (make-test-journal's input) as logged ``uptime`` s into the boot, a
    millisecond apart: the corpus's own times (``[93297.02]``, ``[Fri Apr  5 …]``) would make
    them faults from before the agent started, or order them after root's later clear (a
    boot's entries are ordered by their monotonic time)."""
    lines = re.sub(r"^\[[^]]*\] ", "", text, flags=re.M).splitlines(keepends=True)
    # A record's continuation lines (indented) and the directives take no time of their own.
    return "".join(
        line if line[:1].isspace() or line.startswith("#") else f"[{uptime + i / 1000:.6f}] {line}"
        for i, line in enumerate(lines)
    )


def place_journal(c: Container, work: str, text: str, name: str = "gpuagent-test") -> None:
    """Kernel records (``text``, make-test-journal's input) logged now in ``c``'s system
    journal: a journal file of this boot placed in /var/log/journal/<machine-id>/.

    The boot is the one journald stamps: nspawn gives the container a boot id of its own over
    /proc/sys/kernel/random/boot_id, which on Debian 12 the unit's ProtectProc= and
    ProtectKernelTunables= hide (a /proc showing the kernel's); the agent takes journald's
    (journalboot.journal_boot), the one root's ``gpuagent clear`` is stamped with."""
    make = os.path.join(os.path.dirname(REPO), "shared", "tools", "make-test-journal")
    need(os.access(make, os.X_OK), f"{make} is missing")
    need(
        journalfeed.journal_remote() is not None,
        "systemd-journal-remote is not installed",
    )
    machine = c.out("cat", "/etc/machine-id")
    boot = c.out("cat", "/proc/sys/kernel/random/boot_id").replace("-", "")
    uptime = float(c.out("cat", "/proc/uptime").split()[0])
    source = os.path.join(work, f"{name}.txt")
    with open(source, "w", encoding="utf-8") as f:
        f.write(logged_now(text, uptime))
    made = os.path.join(work, f"{name}.journal")
    started = str(int((time.time() - uptime) * 1e6))
    argv = [make, "--boot-id", boot, "--start-usec", started, source, made]
    subprocess.run(argv, check=True, timeout=60, capture_output=True)
    system_journal(c, made, name, machine)


def system_journal(c: Container, made: str, name: str, machine: str) -> None:
    """The journal file ``made`` (here) in ``c``'s system journal as ``system@NAME.journal``
    (the system journal is the files named system.journal and system@*.journal)."""
    target = f"/var/log/journal/{machine}/system@{name}.journal"
    c.run("mkdir", "-p", f"/var/log/journal/{machine}")
    # Whole and readable when it appears, as journald's own files are: the running agent
    # watches the directory and reads it at once.
    c.copy(made, f"{target}.tmp")
    c.run("chown", "root:systemd-journal", f"{target}.tmp")
    c.run("chmod", "0640", f"{target}.tmp")
    c.run("mv", f"{target}.tmp", target)


def test_xids_from_the_system_journal_under_systemd(
    deb: str, container: Container, tmp_path: str
) -> None:
    """The packaged service (user gpuagent, the sandbox as shipped) reads the container's own
    journal: a journal file of this boot placed in /var/log/journal/<machine-id>/; then root's
    ``gpuagent clear``, which journald stamps with the same boot, ends the Xid problem."""
    c = container
    try:
        install(c, deb)
        fake_gpu_host(c)
        slots = fakesysfs.gpu_slots(8)
        c.write(f"{FAKE}/scenario.json", json.dumps({"capture": CAPTURE, "slots": slots}))
        wait_for("8 GPUs sampled", lambda: c.prop("StatusText") == "8 GPUs, sampling", 20)
        place_journal(c, tmp_path, xid_journal())
        xids_under_systemd(c, slots)
        cleared_under_systemd(c, slots[0])
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}")
        raise


MAKE_JOURNAL = os.path.join(os.path.dirname(REPO), "shared", "tools", "make-test-journal")


def need_make_journal() -> None:
    """Skip without what :func:`place_journal` needs on the host."""
    need(os.access(MAKE_JOURNAL, os.X_OK), f"{MAKE_JOURNAL} is missing")
    need(
        journalfeed.journal_remote() is not None,
        "systemd-journal-remote is not installed",
    )


def xids_under_systemd(c: Container, slots: list[str]) -> None:
    fell, app = slots[0], slots[1]
    problem = one(
        wait_for("the Xid's journal line", lambda: c.events(Event.XID_PROBLEM), 15), "Xid 79"
    )
    assert {k: problem.get(k) for k in ("PRIORITY", "PCI_SLOT", "XID", "ACTION")} == {
        "PRIORITY": "3",
        "PCI_SLOT": fell,
        "XID": "79",
        "ACTION": "reboot",
    }
    counted = one(c.events(Event.XID_COUNTED), "Xid 13")
    assert (counted["PCI_SLOT"], counted["XID"]) == (app, "13")
    c.wait_ticks(4)  # four more ticks: no line repeats, the forged line says nothing
    assert len(c.events(Event.XID_PROBLEM)) == 1
    assert len(c.events(Event.XID_COUNTED)) == 1
    assert c.count("Xid 48") == 0
    assert c.events(Event.JOURNAL_UNREADABLE) == []
    explained = c.out("journalctl", "-u", "gpuagent", "-x", "--no-pager")
    assert "GPU fault reported by the NVIDIA driver (Xid)" in explained

    def counts() -> dict[tuple[str, int], int]:
        st = json.loads(c.status("--json").stdout)
        return {(g["pci_slot"], x["xid"]): x["count"] for g in st["gpus"] for x in g["xids"]}

    assert counts() == {(fell, 79): 1, (app, 13): 2}
    status = c.status()
    assert status.returncode == 2, status.stdout + status.stderr
    assert "Xid 79 \u00d71, last " in status.stdout
    assert "Xid 13 \u00d72, last " in status.stdout
    # The remedy leads, the Xid 79's GPU the one it fixes (its slot short where room is tight).
    assert re.match(rf"^(drain and )?reboot: fixes (0000:)?{fell[5:]}", c.prop("StatusText"))
    series = re.compile(
        rf'^gpuagent_gpu_xid_errors_total\{{pci_slot="{fell}",'
        r'uuid="GPU-11111111-2222-3333-4444-555555555555",xid="79"\} 1(\.0)?$',
        re.M,
    )
    wait_for("the Xid counter in node_exporter", lambda: series.search(c.metrics()), 15)
    # A restart reads the boot again: the same counts, and the fault is restated at info, with
    # its first start (problems.json): not a new fault, no new Xid line.
    c.run("systemctl", "restart", "gpuagent")

    def restated() -> list[dict[str, Any]]:
        said = f"GPU {fell}: still critical xid: Xid 79 "
        return [e for e in c.events(Event.STILL_HOLDS) if e["MESSAGE"].startswith(said)]

    wait_for("the restarted agent's restatement", restated, 15)
    (again,) = restated()
    assert again["PRIORITY"] == "6", again
    assert re.search(r"; since \d\d:\d\d:\d\d, seen before the restart$", again["MESSAGE"])
    assert len(c.events(Event.XID_PROBLEM)) == 1
    assert counts() == {(fell, 79): 1, (app, 13): 2}
    wait_for("the counter after the restart", lambda: series.search(c.metrics()), 15)


def cleared_under_systemd(c: Container, fell: str) -> None:
    """Root's ``gpuagent clear`` after a repair: the service ends the Xid problem, saying an
    operator cleared it, and a restart applies the clear again (no Xid line anew)."""
    said = c.out("gpuagent", "clear", fell, "xid")
    assert said.startswith(f"{fell}: xid cleared by root"), said

    def operator_end() -> list[dict[str, Any]]:
        ends = c.events(Event.PROBLEM_CLEARED)
        return [e for e in ends if "cleared by an operator" in e["MESSAGE"]]

    try:
        end = one(wait_for("the clear's end line", operator_end, 15), "the clear")
    except BaseException:
        clear = "MESSAGE_ID=" + Event.OPERATOR_CLEAR.value
        for argv in (
            ("journalctl", "-o", "export", "--no-pager", clear),
            ("journalctl", "--list-boots", "--no-pager"),
            ("journalctl", "-o", "export", "-n", "2", "--no-pager"),
            ("sh", "-c", "ls -la /run/log/journal/* /var/log/journal/*; cat /proc/1/environ"),
        ):
            print(f"--- {' '.join(argv)} ---\n{c.run(*argv, check=False).stdout[-3000:]}")
        raise
    assert end["MESSAGE"].startswith(f"GPU {fell}: Xid 79 cleared by an operator (root at "), end
    status = c.status()
    assert status.returncode == 0, status.stdout + status.stderr
    assert "cleared by root at " in status.stdout
    lines = len(c.events(Event.XID_PROBLEM))
    c.run("systemctl", "restart", "gpuagent")

    def restarted() -> bool:
        st = json.loads(c.status("--json").stdout or "{}")
        return str(st.get("pid")) == c.prop("MainPID") and int(st.get("ticks", 0)) >= 3

    wait_for("the restarted agent's first ticks", restarted, 30)
    status = c.status()
    assert status.returncode == 0, status.stdout + status.stderr
    assert len(c.events(Event.XID_PROBLEM)) == lines
