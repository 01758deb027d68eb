"""The version this copy of gpuagent is: its build's, or one derived from git.

A release is the top entry of ``debian/changelog``.  Every build between releases has its own
version, increasing along the branch: ``RELEASE+gitN.HASH``, N the commits since the release
commit (the last one that changed an entry's heading line in ``debian/changelog``), HASH the
commit's, and ``.dirty`` after it for uncommitted changes.  apt and PEP 440 both order
``0.1.0 < 0.1.0+git9.… < 0.1.0+git10.… < 0.1.1``.

``packaging/build-deb.sh`` computes it here (``python3 -m gpuagent.version``), writes it into
the package's copy as ``gpuagent/_build.py`` and into a changelog entry of its own, so that the
.deb's version (what apt compares), ``gpuagent --version``, the start line and
``gpuagent_info{version}`` all agree.  A source checkout that was not built asks git at first
use; without git (an exported tree) it is :data:`gpuagent.RELEASE`.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import subprocess

from gpuagent import RELEASE

__all__ = ["from_git", "release_of", "version"]

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHANGELOG = "debian/changelog"
# An entry's first line: "gpuagent (0.1.0) unstable; urgency=medium".
_HEADING = re.compile(r"^gpuagent \(([^)\s]+)\) ")
# git -G takes a POSIX regex: the same heading.
_HEADING_GIT = r"^gpuagent \("


@functools.cache
def version() -> str:
    """This copy's version (computed once per process)."""
    try:
        build = importlib.import_module(f"{__package__}._build")
    except ImportError:
        pass
    else:
        return str(build.VERSION)
    return from_git(TOP) or RELEASE


def release_of(changelog_text: str) -> str | None:
    """The version of the changelog's top entry."""
    for line in changelog_text.splitlines():
        m = _HEADING.match(line)
        if m:
            return m.group(1)
    return None


def _git(top: str, *args: str) -> str:
    git = shutil.which("git")
    if git is None:
        raise OSError("git is not installed")
    # safe.directory: root (or the service's user) reading someone else's checkout; no
    # optional locks: asking for the version must never block a commit going on beside it.
    proc = subprocess.run(
        [git, "-c", f"safe.directory={top}", "-C", top, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
        env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"},
    )
    return proc.stdout.strip()


def from_git(top: str) -> str | None:
    """The version of the checkout at ``top``, or None where it is not one git can read
    (no ``.git``, no git, a shallow clone without the release commit)."""
    if not os.path.exists(os.path.join(top, ".git")):
        return None
    try:
        with open(os.path.join(top, CHANGELOG), encoding="utf-8") as f:
            release = release_of(f.read())
        if release is None:
            return None
        since = _git(top, "log", "-1", "--format=%H", f"-G{_HEADING_GIT}", "--", CHANGELOG)
        if not since:
            return None
        count = int(_git(top, "rev-list", "--count", f"{since}..HEAD"))
        head = _git(top, "rev-parse", "--short=7", "HEAD")
        dirty = bool(_git(top, "status", "--porcelain"))
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if count == 0 and not dirty:
        return release
    return f"{release}+git{count}.{head}{'.dirty' if dirty else ''}"


if __name__ == "__main__":
    print(version())
