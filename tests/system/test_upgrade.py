"""No upgrade turns monitoring off: `apt-get install -y </dev/null` of this tree's build over
each released version, its main file edited, on Debian 12 and 13.

Until issue 26 /etc/gpuagent/gpuagent.toml was a conffile; an edited one made the upgrade stop
at dpkg's question, which `-y` does not answer, and the service stayed stopped. Each case
installs a release (built from its own commit, the one that wrote its changelog heading),
uncomments a key of the main file as an operator would, adds a drop-in, upgrades, and checks:
no question, the package `ii`, the service active on the new version with the edited setting,
the file in place as the operator's (no conffile, no .dpkg-* beside it); then purge removes
/etc/gpuagent. One container per Debian release serves all its cases, each purged after.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from gpuagent import RELEASE, version
from tests.system.test_deb import NODE_EXPORTER, REPO, Container, booted, wait_for
from tests.system.test_package import build

# Each release and the commit that wrote its entry's heading in debian/changelog (the last to
# change a heading while it was the top entry: what gpuagent/version.py calls the release).
RELEASES = {
    "0.1.0": "e1f54cbcaec34607d97fbce7df495b589b6136d7",
    "0.2.0": "35d4883380972eb307be4f66095da102c23940f0",
    "0.3.0": "4314eb920dc4107055f4ee477d9d5e00dee4c021",
    "0.4.0": "6d175d2094d0ff85c832ccfb9263f0283e51117f",
    "0.5.0": "da92ffbc4ccaa63bceead2b1ec23079068d9a4aa",
    "0.6.0": "af3173ff6096f114fafaecca23f04eab4bb9a1cc",
    "0.7.0": "b03f9a126b2d8c6fa4c80c8e8e76796e19296bb7",
    # The commit that builds as 0.8.0 (its heading's); its entry grew after it (issue 42).
    "0.8.0": "5bd6408048b9b24b3734d7fdbdc853396ac143ca",
}
LAST = list(RELEASES)[-1]
MAIN = "/etc/gpuagent/gpuagent.toml"
SITE = "/etc/gpuagent/gpuagent.toml.d/50-site.toml"
# Every release's shipped file has this line; the operator uncomments it with a value.
SHIPPED_LINE = "#interval = 10\n"
EDITED_LINE = "interval = 3\n"


def release_deb(work: str, commit: str) -> str:
    """The .deb of ``commit``, built by that commit's own build-deb.sh from an exported tree
    made a repository of its own (the checkout's repository is not touched): its version is
    the release's."""
    src = os.path.join(work, "src")
    os.makedirs(src)
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", commit], capture_output=True, check=True, timeout=60
    )
    subprocess.run(["tar", "-x", "-C", src], input=archive.stdout, check=True, timeout=60)
    ident = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    who = ["-c", "user.name=test", "-c", "user.email=test@example.org"]
    for args in (["init", "-q"], ["add", "-A"], [*who, "commit", "-q", "-m", "old"]):
        subprocess.run(
            ["git", "-C", src, *args], env={**os.environ, **ident}, check=True, timeout=60
        )
    return build(os.path.join(work, "out"), top=src)


def deb_version(path: str) -> str:
    return os.path.basename(path).split("_")[1]


@pytest.fixture(scope="module")
def new_deb(tmp_path_factory: pytest.TempPathFactory) -> str:
    """This tree's build, later than every release (on a release commit, +git0 after it)."""
    out = str(tmp_path_factory.mktemp("new"))
    deb = build(out)
    return build(out, version=f"{RELEASE}+git0.0000000") if deb_version(deb) == RELEASE else deb


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each release's .deb, built once for both Debian releases."""
    top = str(tmp_path_factory.mktemp("releases"))
    debs = {v: release_deb(os.path.join(top, v), c) for v, c in RELEASES.items()}
    assert {v: deb_version(d) for v, d in debs.items()} == {v: v for v in RELEASES}
    return debs


@pytest.fixture(scope="module", params=["bookworm", "trixie"])
def lab(request: pytest.FixtureRequest) -> Iterator[Container]:
    with booted(request.param) as c:
        c.write(
            "/etc/default/prometheus-node-exporter",
            f'ARGS="--web.listen-address={NODE_EXPORTER}"\n',
        )
        c.run("systemctl", "restart", "prometheus-node-exporter")
        c.apt("update")  # the dependencies come from Debian's archive
        yield c


def state(c: Container) -> dict[str, Any]:
    st: dict[str, Any] = json.loads(c.status("--json").stdout or "{}")
    return st


def running(c: Container, version: str) -> dict[str, Any]:
    """The state of the service's agent once it runs ``version`` and has ticked."""

    def ready() -> dict[str, Any]:
        st = state(c)
        pid = c.prop("MainPID")
        ok = st.get("version") == version and str(st.get("pid")) == pid and st.get("ticks")
        return st if ok else {}

    return wait_for(f"the service's agent {version} to tick", ready, 30)


def apt_install(c: Container, deb: str) -> str:
    """`apt-get install -y </dev/null` of ``deb``, as a fleet's upgrade runs it: no tty, no
    DEBIAN_FRONTEND, so any question fails it. Returns what it printed."""
    c.copy(deb, "/root/")
    proc = c.run(
        "apt-get", "install", "-y", "-q", f"/root/{os.path.basename(deb)}", stdin="", timeout=300
    )
    return proc.stdout + proc.stderr


def files_beside(c: Container) -> list[str]:
    return c.out("ls", "-A", "/etc/gpuagent").split()


# Each release with its main file edited; and once, from the last, a file left as shipped.
CASES = [pytest.param(v, True, id=f"{v}-edited") for v in RELEASES] + [
    pytest.param(LAST, False, id=f"{LAST}-as-shipped")
]


def test_every_release_is_upgraded_from() -> None:
    """Each release before the tree's own (its top entry of debian/changelog, the release
    being built) needs its commit in RELEASES: once a newer entry is written, the one it
    follows is out and is upgraded from."""
    with open(os.path.join(REPO, "debian", "changelog"), encoding="utf-8") as f:
        released = {version.release_of(line) for line in f if line.startswith("gpuagent (")}
    assert set(RELEASES) == released - {RELEASE}


@pytest.mark.system
@pytest.mark.parametrize(("before", "edited"), CASES)
def test_an_upgrade_keeps_the_operators_settings_and_the_service(
    lab: Container, releases: dict[str, str], new_deb: str, before: str, edited: bool
) -> None:
    c = lab
    new = deb_version(new_deb)
    try:
        apt_install(c, releases[before])
        wait_for("the old service", lambda: c.prop("ActiveState") == "active", 30)
        shipped = c.out("cat", MAIN) + "\n"
        assert SHIPPED_LINE in shipped
        if edited:
            c.write(MAIN, shipped.replace(SHIPPED_LINE, EDITED_LINE, 1))
        c.write(SITE, "retry_max = 30\n")
        starts = c.count(f"gpuagent {new} started: ")

        printed = apt_install(c, new_deb)

        assert "Configuration file" not in printed, printed
        assert "conffile" not in printed, printed
        line = f"gpuagent: upgraded from {before} to {new}; the service restarted on {new}"
        assert line in printed.splitlines(), printed
        assert c.out("dpkg-query", "-W", "-f", "${db:Status-Abbrev}${Version}", "gpuagent") == (
            f"ii {new}"
        )
        assert c.out("systemctl", "is-active", "gpuagent") == "active"
        assert running(c, new)["interval"] == (3.0 if edited else 10.0)
        assert c.count(f"gpuagent {new} started: ") == starts + 1
        # The operator's file, no longer the package's: dpkg forgot it, and nothing beside it.
        assert c.out("dpkg-query", "-W", "-f", "${Conffiles}", "gpuagent") == ""
        if edited:
            assert c.out("cat", MAIN) + "\n" == shipped.replace(SHIPPED_LINE, EDITED_LINE, 1)
            assert files_beside(c) == ["gpuagent.toml", "gpuagent.toml.d"]
        else:
            assert files_beside(c) == ["gpuagent.toml.d"]
        checked = c.out("gpuagent", "check-config")
        assert f"{SITE}: OK" in checked.splitlines(), checked
        shared = c.out("cat", "/usr/share/gpuagent/gpuagent.toml")
        assert "/etc/gpuagent/gpuagent.toml, yours alone" in shared

        removed = c.apt("remove", "gpuagent")
        assert "systemd/system' not empty" not in removed, removed
        assert c.prop("LoadState") == "not-found"
        assert c.run("test", "-e", SITE, check=False).returncode == 0  # remove keeps it
        c.apt("purge", "gpuagent")
        assert c.run("test", "!", "-e", "/etc/gpuagent", check=False).returncode == 0
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}")
        c.run("apt-get", "purge", "-y", "-q", "gpuagent", check=False, timeout=300)
        c.run("rm", "-rf", "/etc/gpuagent", check=False)
        raise


@pytest.mark.system
def test_a_host_left_at_the_conffile_prompt_recovers(
    lab: Container, releases: dict[str, str], new_deb: str
) -> None:
    """The bug itself, then its cure: 0.6.0 -> 0.7.0 over an edited file stops at dpkg's
    question and leaves the package half-configured; the next `apt-get install -y` (of this
    build) finishes without a question, the edit in effect and nothing left beside it."""
    c = lab
    new = deb_version(new_deb)
    edited = ""
    try:
        apt_install(c, releases["0.6.0"])
        wait_for("the old service", lambda: c.prop("ActiveState") == "active", 30)
        edited = (c.out("cat", MAIN) + "\n").replace(SHIPPED_LINE, EDITED_LINE, 1)
        c.write(MAIN, edited)
        c.copy(releases["0.7.0"], "/root/")
        argv = ("apt-get", "install", "-y", "-q", f"/root/{os.path.basename(releases['0.7.0'])}")
        stuck = c.run(*argv, stdin="", check=False, timeout=300)
        assert stuck.returncode != 0, stuck.stdout + stuck.stderr
        assert "end of file on stdin at conffile prompt" in stuck.stdout + stuck.stderr
        assert c.out("dpkg-query", "-W", "-f", "${db:Status-Abbrev}", "gpuagent") != "ii"

        printed = apt_install(c, new_deb)

        assert "Configuration file" not in printed, printed
        ending = f"; the service restarted on {new}"
        assert any(
            line.startswith("gpuagent: upgraded from ") and line.endswith(ending)
            for line in printed.splitlines()
        ), printed
        assert c.out("dpkg-query", "-W", "-f", "${db:Status-Abbrev}${Version}", "gpuagent") == (
            f"ii {new}"
        )
        assert running(c, new)["interval"] == 3.0
        assert c.out("dpkg-query", "-W", "-f", "${Conffiles}", "gpuagent") == ""
        assert c.out("cat", MAIN) + "\n" == edited
        assert files_beside(c) == ["gpuagent.toml", "gpuagent.toml.d"]
        c.apt("purge", "gpuagent")
        assert c.run("test", "!", "-e", "/etc/gpuagent", check=False).returncode == 0
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}")
        print(f"--- /etc/gpuagent ---\n{c.run('ls', '-la', '/etc/gpuagent', check=False).stdout}")
        c.run("dpkg", "--purge", "--force-all", "gpuagent", check=False, timeout=300)
        c.run("rm", "-rf", "/etc/gpuagent", check=False)
        raise
