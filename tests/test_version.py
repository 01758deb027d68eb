"""gpuagent.version: the release, a checkout's git-derived version, a build's own."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

import gpuagent
from gpuagent import version
from gpuagent.commands.cli import main
from tests.tools import need

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = """\
gpuagent ({v}) unstable; urgency=medium

  * Release {v}.

 -- A Maintainer <a@example.org>  Sun, 29 Nov 2026 22:47:27 +0000

"""


def test_the_release_is_the_changelogs_top_entry() -> None:
    with open(os.path.join(REPO, "debian", "changelog"), encoding="utf-8") as f:
        assert version.release_of(f.read()) == gpuagent.RELEASE


# Who commits, whatever the machine's git knows (a fresh one has no identity).
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


class Checkout:
    """A git repository with a debian/changelog, committed to by the test."""

    def __init__(self, top: str) -> None:
        self.top = top
        self.git("init", "-q", "-b", "main")
        self.changelog = ""

    def git(self, *args: str) -> str:
        proc = subprocess.run(
            ["git", "-C", self.top, *args],
            capture_output=True,
            text=True,
            env={**os.environ, **GIT_ENV},
            check=True,
        )
        return proc.stdout.strip()

    def open_entry(self, v: str) -> None:
        """A new top entry, in progress until tagged."""
        self.changelog = ENTRY.format(v=v) + self.changelog
        os.makedirs(os.path.join(self.top, "debian"), exist_ok=True)
        self.commit("debian/changelog", self.changelog, f"Open {v}")

    def tag(self, v: str) -> None:
        self.git("tag", "-a", f"v{v}", "-m", f"gpuagent {v}")

    def commit(self, name: str, text: str, message: str = "a change") -> None:
        with open(os.path.join(self.top, name), "w", encoding="utf-8") as f:
            f.write(text)
        self.git("add", name)
        self.git("commit", "-q", "-m", message)

    def head(self) -> str:
        return self.git("rev-parse", "--short=7", "HEAD")


@pytest.fixture
def checkout(tmp_path: str) -> Checkout:
    need(shutil.which("git") is not None, "git is not installed")
    return Checkout(str(tmp_path))


def test_commits_count_up_to_the_next_release_and_after_it(checkout: Checkout) -> None:
    checkout.open_entry("0.1.0")
    # No tag yet: counted from the root, below the release it leads to.
    assert version.from_git(checkout.top) == f"0.1.0~git1.{checkout.head()}"
    checkout.tag("0.1.0")
    assert version.from_git(checkout.top) == "0.1.0"
    checkout.commit("a", "1")
    # Released, and no next entry open yet.
    assert version.from_git(checkout.top) == f"0.1.0+git1.{checkout.head()}"
    checkout.open_entry("0.2.0")
    assert version.from_git(checkout.top) == f"0.2.0~git2.{checkout.head()}"
    # A changelog edit (a bullet added) is no release: only the tag is.
    checkout.commit("debian/changelog", checkout.changelog.replace("Release", "The release"))
    checkout.commit("a", "2")
    assert version.from_git(checkout.top) == f"0.2.0~git4.{checkout.head()}"
    with open(os.path.join(checkout.top, "a"), "w", encoding="utf-8") as f:
        f.write("uncommitted")
    assert version.from_git(checkout.top) == f"0.2.0~git4.{checkout.head()}.dirty"
    checkout.git("checkout", "-q", "a")
    checkout.tag("0.2.0")
    assert version.from_git(checkout.top) == "0.2.0"


def test_a_lightweight_tag_is_no_release(checkout: Checkout) -> None:
    checkout.open_entry("0.1.0")
    checkout.git("tag", "v0.1.0-wip")
    checkout.commit("a", "1")
    assert version.from_git(checkout.top) == f"0.1.0~git2.{checkout.head()}"


def compare(older: str, op: str, newer: str) -> bool:
    dpkg = shutil.which("dpkg")
    need(dpkg is not None, "dpkg is not installed")
    assert dpkg is not None
    return (
        subprocess.run([dpkg, "--compare-versions", older, op, newer], check=False).returncode == 0
    )


def test_apt_orders_the_builds_along_the_branch() -> None:
    builds = [
        "0.7.0",
        "0.8.0~git5.aaaaaaa",  # before 0.8.0 was tagged
        "0.8.0",
        "0.8.0+git0.0aaaaaa.dirty",
        "0.8.0+git3.fffffff",  # after the tag, before 0.9.0's entry was opened
        "0.9.0~git9.fffffff",
        "0.9.0~git10.0000000",
        "0.9.0~git10.0000000.dirty",
        "0.9.0~git11.1234567",
        "0.9.0~git93.abcdef0",
        "0.9.0",
        "0.9.0+git1.1234567",
        "0.9.1~git2.1234567",
        "0.10.0",
    ]
    for older, newer in itertools.pairwise(builds):
        assert compare(older, "lt", newer), f"{older} < {newer}"
    # What issue 42 found: the old scheme's build sorted after the release it led to.
    assert compare("0.8.0+git93.abcdef0", "lt", "0.9.0")
    assert compare("0.9.0~git93.abcdef0", "lt", "0.9.0")


def test_between_spells_each_case() -> None:
    assert version.between("0.9.0", True, 0, "abcdef0", False) == "0.9.0"
    assert version.between("0.9.0", True, 0, "abcdef0", True) == "0.9.0+git0.abcdef0.dirty"
    assert version.between("0.9.0", True, 4, "abcdef0", False) == "0.9.0+git4.abcdef0"
    assert version.between("0.9.0", False, 0, "abcdef0", False) == "0.9.0~git0.abcdef0"
    assert version.between("0.9.0", False, 93, "abcdef0", True) == "0.9.0~git93.abcdef0.dirty"


def test_pythons_spelling_orders_the_same() -> None:
    Version = pytest.importorskip("packaging.version").Version

    builds = ["0.8.0", "0.8.0+git3.fffffff", "0.9.0~git9.fffffff", "0.9.0~git10.0000000", "0.9.0"]
    spelled = [Version(version.pep440(b)) for b in builds]
    assert spelled == sorted(spelled)
    assert version.pep440("0.9.0~git93.abcdef0.dirty") == "0.9.0.dev93+abcdef0.dirty"
    assert version.pep440("0.9.0") == "0.9.0"


def test_this_checkouts_version_leads_to_its_top_entry() -> None:
    mine = version.from_git(REPO)
    need(mine is not None, "not a git checkout")
    assert mine is not None
    assert mine.split("~")[0].split("+")[0] == gpuagent.RELEASE


def test_without_git_it_is_the_release(tmp_path: str) -> None:
    os.makedirs(os.path.join(tmp_path, "debian"))
    with open(os.path.join(tmp_path, "debian", "changelog"), "w", encoding="utf-8") as f:
        f.write(ENTRY.format(v="9.9.9"))
    assert version.from_git(str(tmp_path)) is None  # an exported tree: no .git


def test_a_builds_version_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    build = type(sys)("gpuagent._build")
    build.VERSION = "0.1.0+git7.abcdef0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpuagent._build", build)
    assert version.version.__wrapped__() == "0.1.0+git7.abcdef0"


def test_version_option_prints_this_copys_version() -> None:
    res = CliRunner().invoke(main, ["--version"])
    assert (res.exit_code, res.output) == (0, f"gpuagent, version {version.version()}\n")
    assert gpuagent.__version__ == version.version()
