"""The .debs (gpuagent, gpuagent-prometheus) as this release's Debian tools build them:
lintian-clean, this commit's version, the unit under /usr on both releases, the rules apart.

Runs wherever the suite runs (no booted systemd needed), so the bookworm host and the trixie
container of `.ci/run` each check the package with their own debhelper and lintian.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

from gpuagent import RELEASE, version
from tests.tools import need

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(REPO, "packaging", "gpuagent.service")
SHIPPED = os.path.join(REPO, "packaging", "gpuagent.toml")


def build(out: str, version: str | None = None, top: str = REPO) -> str:
    """Build the .deb (with its .changes) of checkout ``top`` into directory ``out``, as
    ``version`` if given; returns the .deb's path."""
    need(shutil.which("dpkg-buildpackage") is not None, "dpkg-buildpackage is not installed")
    need(shutil.which("dh") is not None, "debhelper is not installed")
    script = os.path.join(top, "packaging", "build-deb.sh")
    env = {**os.environ, "GPUAGENT_VERSION": version} if version else None
    proc = subprocess.run(
        [script, out], capture_output=True, text=True, check=False, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build(str(tmp_path_factory.mktemp("deb")))


def test_lintian_is_clean(deb: str) -> None:
    need(shutil.which("lintian") is not None, "lintian is not installed")
    (changes,) = glob.glob(os.path.join(os.path.dirname(deb), "*.changes"))
    proc = subprocess.run(
        ["lintian", "--fail-on", "error,warning", changes, deb],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_package_is_this_commits_build(deb: str, tmp_path: str) -> None:
    want = version.from_git(REPO) or RELEASE
    assert os.path.basename(deb) == f"gpuagent_{want}_all.deb"
    field = subprocess.run(
        ["dpkg-deb", "-f", deb, "Version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert field.stdout.strip() == want
    subprocess.run(["dpkg-deb", "-x", deb, str(tmp_path)], check=True, timeout=60)
    code = os.path.join(tmp_path, "usr", "lib", "python3", "dist-packages")
    said = subprocess.run(
        [sys.executable, "-m", "gpuagent", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": code},
        cwd=str(tmp_path),
    )
    assert said.stdout == f"gpuagent, version {want}\n"
    log = subprocess.run(
        ["zcat", os.path.join(tmp_path, "usr", "share", "doc", "gpuagent", "changelog.gz")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert version.release_of(log.stdout) == want


def test_debhelper_places_and_enables_the_unit(deb: str, tmp_path: str) -> None:
    # Under /usr, wherever it is built: Debian 12's debhelper puts it under /lib, and
    # debian/rules moves it (see there).
    unit_dir = "usr/lib/systemd/system"
    subprocess.run(["dpkg-deb", "-R", deb, str(tmp_path)], check=True, timeout=60)
    units = glob.glob(os.path.join(tmp_path, "**", "gpuagent.service"), recursive=True)
    assert [os.path.relpath(u, tmp_path) for u in units] == [f"{unit_dir}/gpuagent.service"]
    with open(units[0], "rb") as got, open(UNIT, "rb") as shipped:
        assert got.read() == shipped.read()
    with open(os.path.join(tmp_path, "DEBIAN", "postinst"), encoding="utf-8") as f:
        postinst = f.read()
    assert "deb-systemd-helper enable 'gpuagent.service'" in postinst
    assert "deb-systemd-invoke $_dh_action 'gpuagent.service'" in postinst
    assert "try-reload-or-restart gpuagent.service" in postinst  # the node_exporter trigger
    # After debhelper's restart on upgrade: the line that says so.
    assert postinst.index("_dh_action=restart") < postinst.index('"gpuagent: upgraded from $2')


def test_etc_is_the_operators_and_the_defaults_are_under_usr(deb: str, tmp_path: str) -> None:
    # No conffile: an upgrade never asks (see debian/gpuagent.preinst); the drop-in directory
    # is there to be found, and the reference file is the tree's, which the agent's defaults
    # equal (test_default_config).
    subprocess.run(["dpkg-deb", "-R", deb, str(tmp_path)], check=True, timeout=60)
    assert not os.path.exists(os.path.join(tmp_path, "DEBIAN", "conffiles"))
    etc = os.path.join(tmp_path, "etc", "gpuagent")
    assert [(d, names) for d, _, names in os.walk(etc)] == [
        (etc, []),
        (os.path.join(etc, "gpuagent.toml.d"), []),
    ]
    shipped = os.path.join(tmp_path, "usr", "share", "gpuagent", "gpuagent.toml")
    with open(shipped, "rb") as got, open(SHIPPED, "rb") as want:
        assert got.read() == want.read()


def rules_deb(deb: str) -> str:
    """gpuagent-prometheus's .deb, which build-deb.sh leaves beside gpuagent's."""
    path = os.path.join(
        os.path.dirname(deb), os.path.basename(deb).replace("gpuagent_", "gpuagent-prometheus_", 1)
    )
    assert os.path.isfile(path), os.listdir(os.path.dirname(deb))
    return path


def test_the_rules_package_is_rules_and_the_dashboard_only(deb: str) -> None:
    rules = rules_deb(deb)
    listing = subprocess.run(
        ["dpkg-deb", "-c", rules], capture_output=True, text=True, check=True, timeout=60
    )
    files = sorted(
        line.split()[-1] for line in listing.stdout.splitlines() if not line.startswith("d")
    )
    assert files == [
        "./usr/share/doc/gpuagent-prometheus/NEWS.Debian.gz",
        "./usr/share/doc/gpuagent-prometheus/changelog.gz",
        "./usr/share/doc/gpuagent-prometheus/copyright",
        "./usr/share/gpuagent-prometheus/gpuagent-alerts.test.yml",
        "./usr/share/gpuagent-prometheus/gpuagent-alerts.yml",
        "./usr/share/gpuagent-prometheus/gpuagent.json",
    ]
    fields = subprocess.run(
        ["dpkg-deb", "-f", rules, "Architecture", "Version", "Depends", "Pre-Depends"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "Architecture: all\n" in fields
    assert f"Version: {deb_version(deb)}\n" in fields
    assert "python" not in fields.lower()
    # No file of both packages: either installs without the other. The agent's package keeps
    # the old paths only as links into this one, for a Prometheus server that named them.
    main = subprocess.run(
        ["dpkg-deb", "-c", deb], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    old = sorted(
        line.split(maxsplit=5)[-1] for line in main.splitlines() if "gpuagent-prom" in line
    )
    assert old == [
        "./usr/share/gpuagent/gpuagent-alerts.test.yml -> "
        "../gpuagent-prometheus/gpuagent-alerts.test.yml",
        "./usr/share/gpuagent/gpuagent-alerts.yml -> ../gpuagent-prometheus/gpuagent-alerts.yml",
        "./usr/share/gpuagent/gpuagent.json -> ../gpuagent-prometheus/gpuagent.json",
    ]
    recommends = subprocess.run(
        ["dpkg-deb", "-f", deb, "Recommends"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert recommends.strip() == "gpuagent-prometheus"


def deb_version(deb: str) -> str:
    field = subprocess.run(
        ["dpkg-deb", "-f", deb, "Version"], capture_output=True, text=True, check=True, timeout=60
    )
    return field.stdout.strip()


def test_the_rules_work_in_place_and_the_news_comes_along(deb: str, tmp_path: str) -> None:
    subprocess.run(["dpkg-deb", "-x", deb, str(tmp_path)], check=True, timeout=60)
    subprocess.run(["dpkg-deb", "-x", rules_deb(deb), str(tmp_path)], check=True, timeout=60)
    share = os.path.join(tmp_path, "usr", "share", "gpuagent-prometheus")
    assert os.path.isfile(os.path.join(share, "gpuagent-alerts.test.yml"))
    for package in ("gpuagent", "gpuagent-prometheus"):
        news = os.path.join(tmp_path, "usr", "share", "doc", package, "NEWS.Debian.gz")
        assert os.path.isfile(news)
    assert os.path.isdir(os.path.join(tmp_path, "etc", "gpuagent", "gpuagent.toml.d"))
    promtool = shutil.which("promtool")
    need(promtool is not None, "promtool is not installed")
    assert promtool is not None
    proc = subprocess.run(
        [promtool, "test", "rules", os.path.join(share, "gpuagent-alerts.test.yml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_manual_pages_and_the_readme_are_installed(deb: str, tmp_path: str) -> None:
    # Every page of man/ (debian/gpuagent.manpages), in its section's directory, and the
    # README beside NEWS.Debian.
    subprocess.run(["dpkg-deb", "-x", deb, str(tmp_path)], check=True, timeout=60)
    man = os.path.join(tmp_path, "usr", "share", "man")
    for page in sorted(os.listdir(os.path.join(REPO, "man"))):
        section = page.rsplit(".", 1)[1]
        assert os.path.isfile(os.path.join(man, f"man{section}", f"{page}.gz")), page
    doc = os.path.join(tmp_path, "usr", "share", "doc", "gpuagent")
    assert os.path.isfile(os.path.join(doc, "README.md")) or os.path.isfile(
        os.path.join(doc, "README.md.gz")
    )
