"""Releases: a released changelog or NEWS entry never changes, an upgrade's NEWS is what is
new since the installed release, and scripts/release cuts one (gpuagent/entries.py)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import gpuagent
from gpuagent import entries
from tests.test_version import ENTRY, GIT_ENV, Checkout
from tests.tools import need

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = "packaging/released-entries"


def read(top: str, name: str) -> str:
    with open(os.path.join(top, name), encoding="utf-8") as f:
        return f.read()


def records() -> list[entries.Frozen]:
    return entries.parse_frozen(read(REPO, RECORD), RECORD)


def test_no_released_entry_changed() -> None:
    changed = entries.changed(records(), read(REPO, "debian/changelog"), read(REPO, "debian/NEWS"))
    assert changed == [], (
        "a released entry is what its release said for good: put what is new in the top "
        f"entry (or open the next one): {changed}"
    )


def test_every_entry_below_the_top_one_is_recorded() -> None:
    released = {(r.version, r.file) for r in records()}
    for file in ("changelog", "NEWS"):
        below = entries.entries(read(REPO, f"debian/{file}"))[1:]
        assert below, file
        for e in below:
            assert (e.version, file) in released, f"debian/{file} {e.version} is not in {RECORD}"


def test_the_top_entry_is_the_release_in_progress() -> None:
    log = entries.entries(read(REPO, "debian/changelog"))
    assert log[0].version == gpuagent.RELEASE
    assert gpuagent.RELEASE not in {r.version for r in records()}


def test_a_changed_entry_is_named() -> None:
    log = ENTRY.format(v="0.2.0") + "\n" + ENTRY.format(v="0.1.0")
    frozen = entries.parse_frozen("\n".join(entries.frozen_lines("0.1.0", log, "")), "t")
    assert entries.changed(frozen, log, "") == []
    edited = log.replace("Release 0.1.0", "Release 0.1.0, and more")
    assert entries.changed(frozen, edited, "") == [
        "debian/changelog: the released entry 0.1.0 changed"
    ]
    assert entries.changed(frozen, ENTRY.format(v="0.2.0"), "") == [
        "debian/changelog: the released entry 0.1.0 is gone"
    ]


def test_a_bad_record_line_is_one_line_naming_the_file() -> None:
    with pytest.raises(ValueError, match=r"^rec:2: not 'VERSION changelog\|NEWS SHA256'"):
        entries.parse_frozen("# a comment\n0.1.0 changelog abc\n", "rec")


def apt_listchanges_news(news: str, installed: str) -> list[str]:
    """The NEWS entries apt-listchanges shows on an upgrade from ``installed``: those of a
    version above it (dpkg's order)."""
    dpkg = shutil.which("dpkg")
    need(dpkg is not None, "dpkg is not installed")
    assert dpkg is not None
    return [
        e.version
        for e in entries.entries(news)
        if subprocess.run(
            [dpkg, "--compare-versions", e.version, "gt", installed], check=False
        ).returncode
        == 0
    ]


def test_an_upgrade_shows_only_what_is_new_since_the_installed_release() -> None:
    news = read(REPO, "debian/NEWS")
    versions = [e.version for e in entries.entries(news)]
    assert len(versions) == len(set(versions)), "one NEWS entry per release"
    assert apt_listchanges_news(news, "0.8.0") == [gpuagent.RELEASE]
    assert apt_listchanges_news(news, "0.7.0") == [gpuagent.RELEASE, "0.8.0"]
    # A build on the way to 0.9.0 shows 0.9.0's entry (build-deb.sh names it after the build).
    assert apt_listchanges_news(news, f"{gpuagent.RELEASE}~git93.abcdef0") == [gpuagent.RELEASE]
    assert apt_listchanges_news(news, gpuagent.RELEASE) == []


@pytest.fixture
def project(tmp_path: str) -> Checkout:
    """A checkout with a released 0.1.0 and 0.2.0 in progress, as scripts/release wants it."""
    need(shutil.which("git") is not None, "git is not installed")
    c = Checkout(str(tmp_path))
    os.makedirs(os.path.join(c.top, "gpuagent"))
    os.makedirs(os.path.join(c.top, "packaging"))
    c.open_entry("0.1.0")
    c.commit("debian/NEWS", "")
    c.commit(RECORD, "\n".join(entries.frozen_lines("0.1.0", c.changelog, "")) + "\n")
    c.tag("0.1.0")
    c.changelog = ENTRY.format(v="0.2.0").replace("Sun, 29 Nov", "Mon, 30 Nov") + c.changelog
    c.commit("debian/changelog", c.changelog)
    c.commit("gpuagent/__init__.py", 'RELEASE = "0.2.0"\n')
    return c


def release(c: Checkout, *args: str) -> subprocess.CompletedProcess[str]:
    script = os.path.join(REPO, "scripts", "release")
    return subprocess.run(
        [script, "--top", c.top, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
        check=False,
        timeout=60,
    )


def test_release_tags_the_checked_entry(project: Checkout) -> None:
    dry = release(project, "--dry-run")
    assert (dry.returncode, dry.stderr) == (0, ""), dry.stderr
    assert project.git("tag", "-l") == "v0.1.0"
    done = release(project)
    assert done.returncode == 0, done.stderr
    assert project.git("describe", "--exact-match", "HEAD") == "v0.2.0"
    recorded = entries.parse_frozen(read(project.top, RECORD), RECORD)
    assert [r.version for r in recorded] == ["0.1.0", "0.2.0"]
    again = release(project, "--dry-run")
    assert again.returncode == 1
    assert "tag v0.2.0 exists: 0.2.0 is released; open the next entry" in again.stderr


def test_release_refuses_an_edited_release_and_a_dirty_tree(project: Checkout) -> None:
    project.commit("debian/changelog", project.changelog.replace("Release 0.1.0", "Edited"))
    project.commit("gpuagent/__init__.py", 'RELEASE = "0.1.9"\n')
    with open(os.path.join(project.top, "stray"), "w", encoding="utf-8") as f:
        f.write("x")
    res = release(project)
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        "release: gpuagent/__init__.py: RELEASE is not '0.2.0'",
        "release: debian/changelog: the released entry 0.1.0 changed",
        "release: the tree has uncommitted changes: commit them first",
    ]
    assert project.git("tag", "-l") == "v0.1.0"
