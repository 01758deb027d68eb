"""The version this copy of gpuagent is: its build's, or one derived from git.

A release is a changelog entry with its annotated tag ``vX.Y.Z`` (``scripts/release`` makes
both agree).  The top entry of ``debian/changelog`` is either that release or, untagged, the
next release in progress.  Every build between releases has its own version, increasing along
the branch and below the release it leads to:

- ``NEXT~gitN.HASH`` while the top entry (NEXT) is in progress, N the commits since the last
  release tag (since the root where a clone has no tags);
- ``RELEASE+gitN.HASH`` after a tagged top entry, before the next entry is opened;

HASH is the commit's, and ``.dirty`` follows it for uncommitted changes.  dpkg orders
``0.8.0 < 0.8.0+git3.… < 0.9.0~git9.… < 0.9.0~git10.… < 0.9.0``.

``packaging/build-deb.sh`` computes it here (``python3 -m gpuagent.version``), writes it into
the package's copy as ``gpuagent/_build.py`` and into its changelog, so that the .deb's
version (what apt compares), ``gpuagent --version``, the start line and
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

__all__ = ["between", "from_git", "pep440", "release_of", "version"]

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHANGELOG = "debian/changelog"
# An entry's first line: "gpuagent (0.1.0) unstable; urgency=medium".
_HEADING = re.compile(r"^gpuagent \(([^)\s]+)\) ")
# A release's annotated tag: v0.8.0.
TAG_PREFIX = "v"


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


def _commits_since_last_tag(top: str) -> int:
    """Commits from the last release tag to HEAD (from the root where there is none)."""
    try:
        tag = _git(top, "describe", "--abbrev=0", f"--match={TAG_PREFIX}[0-9]*", "HEAD")
    except subprocess.CalledProcessError:  # no release tag in this clone
        return int(_git(top, "rev-list", "--count", "HEAD"))
    return int(_git(top, "rev-list", "--count", f"{tag}..HEAD"))


def _is_tagged(top: str, release: str) -> bool:
    try:
        _git(top, "rev-parse", "-q", "--verify", f"refs/tags/{TAG_PREFIX}{release}^{{commit}}")
    except subprocess.CalledProcessError:
        return False
    return True


def between(release: str, released: bool, count: int, head: str, dirty: bool) -> str:
    """The version of a build ``count`` commits after the last release tag, at commit
    ``head``: ``release`` itself on its tag, else ``release+gitN.HASH`` after it (``released``)
    or ``release~gitN.HASH`` on the way to it."""
    if released and count == 0 and not dirty:
        return release
    sep = "+" if released else "~"
    return f"{release}{sep}git{count}.{head}{'.dirty' if dirty else ''}"


def pep440(debian_version: str) -> str:
    """The same version as Python's packaging spells it (the wheel's metadata): ``~gitN.HASH``
    becomes ``.devN+HASH``, which also orders below the release; ``+gitN.HASH`` is already
    one (a local version)."""
    release, sep, rest = debian_version.partition("~git")
    if not sep:
        return debian_version
    count, _, local = rest.partition(".")
    return f"{release}.dev{count}+{local}" if local else f"{release}.dev{count}"


def from_git(top: str) -> str | None:
    """The version of the checkout at ``top``, or None where it is not one git can read
    (no ``.git``, no git, no changelog entry)."""
    if not os.path.exists(os.path.join(top, ".git")):
        return None
    try:
        with open(os.path.join(top, CHANGELOG), encoding="utf-8") as f:
            release = release_of(f.read())
        if release is None:
            return None
        released = _is_tagged(top, release)
        if released:
            count = int(_git(top, "rev-list", "--count", f"{TAG_PREFIX}{release}..HEAD"))
        else:
            count = _commits_since_last_tag(top)
        head = _git(top, "rev-parse", "--short=7", "HEAD")
        dirty = bool(_git(top, "status", "--porcelain"))
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return between(release, released, count, head, dirty)


if __name__ == "__main__":
    print(version())
