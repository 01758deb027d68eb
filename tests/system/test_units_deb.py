"""The static service user under a real systemd: the upgrade from the package that ran as a
dynamic user, and NVIDIA's units read over the system bus as that user, in the unit's sandbox.

Boots Debian 12 and 13 (../shared/tools/systemd-lab), as tests/system/test_deb.py does.  The
old package is built from OLD_COMMIT, the last commit whose service had ``DynamicUser=yes``.
The NVIDIA units are stand-ins (sleep, false) with the real units' names: running, stopped
and crash-looping.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any

import pytest

from gpuagent.logs import Event
from tests.system.test_deb import REPO, Container, container, deb, wait_for  # noqa: F401
from tests.system.test_package import build
from tests.tools import need

pytestmark = pytest.mark.system

# The last commit of main whose package ran the service as a dynamic user (0.1.0).
OLD_COMMIT = "59f171f193e806cd7ee71ef0388678ce18645cc3"
# And the last one before 0.3.0, a build between releases: 0.2.0+git14.de2c3d4, which
# debian/gpuagent.preinst must also take for a dynamic user's (dpkg orders it below 0.3.0).
BETWEEN_COMMIT = "de2c3d45f927b4e15e3f6e15519a7d5e10bdd090"
BETWEEN_VERSION = "0.2.0+git14.de2c3d4"
FM = "nvidia-fabricmanager.service"
PD = "nvidia-persistenced.service"
DCGM = "nvidia-dcgm.service"
STAND_INS = {
    FM: "[Service]\nExecStart=/bin/sleep infinity\n",
    PD: "[Service]\nExecStart=/bin/sleep infinity\n",
    # Crash-looping: exits at once, restarted forever.
    DCGM: "[Unit]\nStartLimitIntervalSec=0\n[Service]\nExecStart=/bin/false\n"
    "Restart=always\nRestartSec=200ms\n",
}
# Lines of the packaged unit a one-shot check cannot have, or must not share with the
# running service (its runtime directory would go when the check ends).
_NOT_FOR_A_CHECK = re.compile(
    r"^(Type|NotifyAccess|ExecStart|ExecStartPre|ExecReload|ExecStopPost|WatchdogSec|Restart"
    r"|RestartSec|RestartPreventExitStatus|RuntimeDirectory|RuntimeDirectoryMode|WantedBy)="
)
CHECK = "gpuagent-units-check.service"
# The container shares the host's network: a port for its node exporter, not test_deb.py's.
NODE_EXPORTER = "127.0.0.1:19102"
SCRAPE = (
    "import urllib.request; "
    f"print(urllib.request.urlopen('http://{NODE_EXPORTER}/metrics', timeout=5).read().decode())"
)
OUTPUT = "/run/gpuagent-units-check.json"


def _old_build(factory: pytest.TempPathFactory, commit: str, version: str | None) -> str:
    """The .deb of ``commit``, built from a scratch copy of that tree (as ``version``)."""
    src = str(factory.mktemp("old-src"))
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", commit], capture_output=True, check=False, timeout=60
    )
    need(archive.returncode == 0, f"{commit} is not in this checkout's history")
    subprocess.run(["tar", "-x", "-C", src], input=archive.stdout, check=True, timeout=60)
    # build-deb.sh lists git's files, and names the commit of a build between releases.
    git = ["git", "-C", src, "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", src], check=True, timeout=60)
    if version is not None:
        subprocess.run([*git, "add", "-A"], check=True, timeout=60)
        subprocess.run([*git, "commit", "-q", "-m", commit], check=True, timeout=60)
    out = str(factory.mktemp("old-deb"))
    env = {**os.environ, **({"GPUAGENT_VERSION": version} if version else {})}
    proc = subprocess.run(
        [os.path.join(src, "packaging", "build-deb.sh"), out],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def old_deb(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The .deb of OLD_COMMIT (0.1.0)."""
    return _old_build(tmp_path_factory, OLD_COMMIT, None)


@pytest.fixture(scope="module")
def between_deb(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The .deb of BETWEEN_COMMIT, as the build between releases it was."""
    path = _old_build(tmp_path_factory, BETWEEN_COMMIT, BETWEEN_VERSION)
    assert BETWEEN_VERSION in os.path.basename(path), path
    return path


@pytest.fixture(scope="module")
def new_deb(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build(str(tmp_path_factory.mktemp("new-deb")))


def main_uid(c: Container) -> int:
    pid = c.prop("MainPID")
    status = c.out("cat", f"/proc/{pid}/status")
    m = re.search(r"^Uid:\s+(\d+)", status, re.M)
    assert m is not None, status
    return int(m[1])


def static_user(c: Container) -> int | None:
    """gpuagent's uid in /etc/passwd (where sysusers writes), None when it is not there."""
    line = c.run("grep", "^gpuagent:", "/etc/passwd", check=False).stdout.strip()
    return int(line.split(":")[2]) if line else None


def node_exporter_on_its_port(c: Container) -> None:
    """Debian's node exporter (in the lab's root file system), listening on NODE_EXPORTER."""
    c.write(
        "/etc/default/prometheus-node-exporter", f'ARGS="--web.listen-address={NODE_EXPORTER}"\n'
    )
    c.run("systemctl", "restart", "prometheus-node-exporter")


def scraped(c: Container) -> str:
    """What node_exporter serves over HTTP, as Prometheus scrapes it ("" while it cannot)."""
    got = c.run("python3", "-c", SCRAPE, check=False)
    return got.stdout if got.returncode == 0 else ""


def install(c: Container, deb_path: str) -> str:
    c.copy(deb_path, "/root/")
    return c.apt("install", f"/root/{os.path.basename(deb_path)}")


def upgrade(c: Container, old: str, new: str, *, nss_systemd: bool) -> None:
    """From the dynamic user's package to the static user's: the service keeps running."""
    install(c, old)
    assert c.out("systemctl", "is-active", "gpuagent") == "active"
    assert c.prop("DynamicUser") == "yes"
    dynamic = main_uid(c)
    assert dynamic >= 61184, dynamic  # systemd's range for dynamic users
    assert static_user(c) is None
    if nss_systemd:
        # What fooled systemd-sysusers: the running dynamic user, seen through NSS.
        assert c.out("getent", "passwd", "gpuagent").split(":")[2] == str(dynamic)
    printed = install(c, new)
    assert "gpuagent.service failed" not in printed, printed
    uid = static_user(c)
    assert uid is not None and uid < 1000, printed
    wait_for("the new service", lambda: c.out("systemctl", "is-active", "gpuagent") == "active", 20)
    assert (c.prop("User"), c.prop("DynamicUser")) == ("gpuagent", "no")
    assert main_uid(c) == uid
    assert c.prop("NRestarts") == "0"
    status = c.status()
    assert status.returncode == 0, status.stdout + status.stderr


def check_unit(c: Container, args: str) -> str:
    """The installed gpuagent.service, made a one-shot `gpuagent units ARGS`: the same user,
    groups and sandbox as the agent."""
    text = c.out("cat", c.prop("FragmentPath"))
    lines = [ln for ln in text.splitlines() if not _NOT_FOR_A_CHECK.match(ln)]
    lines = [ln for ln in lines if not ln.startswith(("After=", "Documentation="))]
    body = "\n".join(lines).replace("[Install]", "")
    return body.replace(
        "[Service]",
        f"[Service]\nType=oneshot\nExecStart=/usr/bin/gpuagent units {args}\n"
        f"StandardOutput=truncate:{OUTPUT}\n",
    )


def units_as_the_service(c: Container, args: str = "--json") -> dict[str, Any]:
    c.write(f"/etc/systemd/system/{CHECK}", check_unit(c, args))
    c.run("systemctl", "daemon-reload")
    started = c.run("systemctl", "start", CHECK, check=False)
    # Opened by systemd before the sandbox applies: the check's stdout, whole once it ends.
    out = c.out("cat", OUTPUT)
    assert started.returncode == 0, out + started.stderr + c.out("journalctl", "-u", CHECK)
    result: dict[str, Any] = json.loads(out[out.index("{") : out.rindex("}") + 1])
    c.run("systemctl", "reset-failed", CHECK, check=False)
    return result


def nvidia_units(c: Container) -> None:
    """Running, stopped and crash-looping stand-ins, read by the service's user."""
    for name, text in STAND_INS.items():
        c.write(f"/etc/systemd/system/{name}", text)
    c.run("systemctl", "daemon-reload")
    c.run("systemctl", "start", FM, DCGM)
    c.run("systemctl", "start", PD)
    c.run("systemctl", "stop", PD)
    restarts = ("systemctl", "show", "-p", "NRestarts", "--value", DCGM)
    wait_for("the crash loop", lambda: int(c.out(*restarts)) >= 2, 20)
    fm_pid = c.out("systemctl", "show", "-p", "MainPID", "--value", FM)

    def between_restarts() -> dict[str, Any] | None:
        # systemd sets Result back to success as each restart starts: a read may land there.
        got = units_as_the_service(c, f"--json --pid {fm_pid}")
        ok = got["watch"] == "ok"
        return got if not ok or got["units"][DCGM]["result"] == "exit-code" else None

    got = wait_for("a read between the crash loop's restarts", between_restarts, 20)
    assert got is not None
    assert got["watch"] == "ok", got
    units = got["units"]
    assert {k: units[FM][k] for k in ("load_state", "active_state", "sub_state", "result")} == {
        "load_state": "loaded",
        "active_state": "active",
        "sub_state": "running",
        "result": "success",
    }
    assert units[FM]["n_restarts"] == 0
    assert (units[PD]["active_state"], units[PD]["sub_state"]) == ("inactive", "dead")
    assert units[DCGM]["n_restarts"] >= 2
    assert units[DCGM]["result"] == "exit-code"
    assert units[DCGM]["active_state"] in ("activating", "failed", "inactive")
    # GetUnitByPID under ProtectProc=invisible: systemd looks the process up, not the caller.
    assert got["pid"] == {"pid": int(fm_pid), "unit": FM, "error": ""}
    the_agent_reports_them(c)
    # Not installed: a fact, not an error.
    c.run("systemctl", "stop", FM)
    c.run("rm", f"/etc/systemd/system/{FM}")
    c.run("systemctl", "daemon-reload")
    gone = units_as_the_service(c)["units"][FM]
    assert (gone["load_state"], gone["n_restarts"]) == ("not-found", None)
    # No NVSwitch here: not installed is no problem, and the agent says so.
    wait_for(
        "the agent's read of the removed unit",
        lambda: "fabric manager not installed" in c.status().stdout,
        25,
    )
    # The other stand-ins go too: the upgrade after this one starts from a host without them.
    c.run("systemctl", "stop", PD, DCGM)
    c.run("rm", f"/etc/systemd/system/{PD}", f"/etc/systemd/system/{DCGM}")
    c.run("systemctl", "daemon-reload")
    c.run("systemctl", "reset-failed", check=False)


def the_agent_reports_them(c: Container) -> None:
    """The packaged agent's own reads (no GPU here): fabric manager running, persistenced
    stopped, DCGM crash-looping, in `gpuagent status`, the journal and the textfile that
    node_exporter serves, within two ticks (the packaged interval is 10 s)."""

    def state() -> dict[str, Any]:
        st: dict[str, Any] = json.loads(c.status("--json").stdout)
        return st

    def seen() -> bool:
        # Read before the stand-ins were there, both were not-found (and inactive).
        units = state().get("services", {})
        fm, pd = units.get(FM, {}), units.get(PD, {})
        return bool(
            fm.get("active_state") == "active"
            and (pd.get("load_state"), pd.get("active_state")) == ("loaded", "inactive")
        )

    wait_for("the agent's read of the units", seen, 25)
    st = state()
    assert st["services"][FM]["active_state"] == "active", st
    assert st["services"][DCGM]["restarts"] >= 2, st
    assert st["problems"] == {}, st  # the bus works for the static user
    assert [p["kind"] for p in st["host_problems"]] == ["persistenced_down"], st
    text = c.status().stdout
    assert "services: fabric manager active, persistenced inactive (dead)" in text, text
    assert c.events(Event.PROBLEM_PERSISTENCED_DOWN), c.journal()
    # The textfile the agent writes, into the runtime directory node_exporter's link names.
    prom = c.out("cat", "/run/gpuagent/gpuagent.prom")
    assert f'gpuagent_service_active{{unit="{PD}"}} 0.0' in prom, prom
    assert f'gpuagent_service_active{{unit="{FM}"}} 1.0' in prom, prom
    assert f'gpuagent_service_restarts_total{{unit="{DCGM}"}}' in prom, prom
    # And node_exporter's HTTP endpoint, through the package's link in its textfile
    # directory: the services' series, the host problem's, and no scrape error.
    active = re.compile(rf'^gpuagent_service_active{{unit="{re.escape(FM)}"}} 1$', re.M)
    served = wait_for("the services in node_exporter", lambda: active.search(scraped(c)), 15)
    assert served is not None
    text = served.string
    assert re.search(rf'^gpuagent_service_active{{unit="{re.escape(PD)}"}} 0$', text, re.M), text
    dcgm = re.search(
        rf'^gpuagent_service_restarts_total{{unit="{re.escape(DCGM)}"}} (\d+)$', text, re.M
    )
    assert dcgm is not None and int(dcgm[1]) >= 2, text
    assert re.search(r"^node_textfile_scrape_error 0$", text, re.M), text
    assert 'kind="persistenced_down"' in text, text


def purge_keeps_the_user(c: Container) -> None:
    uid = static_user(c)
    c.apt("purge", "gpuagent")
    assert c.prop("LoadState") == "not-found"
    assert static_user(c) == uid  # as Debian leaves every system user
    c.run("sh", "-c", "userdel gpuagent 2>/dev/null; groupdel gpuagent 2>/dev/null; true")
    assert static_user(c) is None


def test_upgrade_and_units_over_the_bus(
    container: Container,  # noqa: F811
    old_deb: str,
    between_deb: str,
    new_deb: str,
) -> None:
    c = container
    try:
        c.apt("update")
        node_exporter_on_its_port(c)
        upgrade(c, old_deb, new_deb, nss_systemd=False)
        security = c.out("systemd-analyze", "security", "--no-pager", "gpuagent.service")
        m = re.search(r"Overall exposure level for gpuagent\.service: (\d+\.\d+)", security)
        assert m is not None and float(m.group(1)) <= 1.5, security
        nvidia_units(c)
        # Stopped: `gpuagent status` still says so (systemd is asked).
        c.run("systemctl", "stop", "gpuagent")
        assert "gpuagent has been stopped since" in c.status().stdout
        purge_keeps_the_user(c)
        # Again with nss-systemd in the passwd: line, which shows the running dynamic user.
        c.apt("install", "libnss-systemd")
        c.run("sed", "-i", r"s/^\(passwd:.*\)$/\1 systemd/", "/etc/nsswitch.conf")
        c.run("sed", "-i", r"s/ systemd systemd$/ systemd/", "/etc/nsswitch.conf")
        assert re.search(r"^passwd:.* systemd\b", c.out("cat", "/etc/nsswitch.conf"), re.M)
        # From a build between releases (0.2.0+gitN, still a dynamic user's) this time.
        upgrade(c, between_deb, new_deb, nss_systemd=True)
    except BaseException:
        tail = c.run("journalctl", "--no-pager", "-n", "200", check=False).stdout
        print(f"--- journalctl ---\n{tail}")
        raise
