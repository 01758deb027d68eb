"""The entries of a Debian changelog or NEWS file, and the record of the released ones.

A released entry never changes: what a later build brings goes into the next entry, so that
the package apt calls 0.8.0 and its text agree for good, and apt-listchanges shows an upgrade
only what is new since the installed release.  ``packaging/released-entries`` keeps one line
per released entry, ``VERSION FILE SHA256`` (FILE is ``changelog`` or ``NEWS``, SHA256 that
of the entry's text from its heading to its trailer line); ``scripts/release`` appends a
release's lines, and ``tests/test_releases.py`` fails when an entry no longer matches.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = ["Entry", "Frozen", "changed", "entries", "frozen_lines", "parse_frozen"]

# "gpuagent (0.8.0) unstable; urgency=medium" ... " -- Name <mail>  Date".
_ENTRY = re.compile(r"^gpuagent \(([^)\s]+)\) .*?^ -- [^\n]*$", re.M | re.S)


@dataclass(frozen=True)
class Entry:
    """One entry: its version and its text, heading to trailer line, without the newline."""

    version: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class Frozen:
    """A released entry's record: version, file ("changelog" or "NEWS"), sha256 (hex)."""

    version: str
    file: str
    sha256: str


def entries(text: str) -> list[Entry]:
    """The entries of a changelog or NEWS text, newest first."""
    return [Entry(m.group(1), m.group(0)) for m in _ENTRY.finditer(text)]


def parse_frozen(text: str, name: str) -> list[Frozen]:
    """The records of a released-entries file; ValueError naming ``name`` and the line for a
    line that is not ``VERSION FILE SHA256``."""
    records: list[Frozen] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        if (
            len(fields) != 3
            or fields[1] not in ("changelog", "NEWS")
            or not re.fullmatch(r"[0-9a-f]{64}", fields[2])
        ):
            raise ValueError(f"{name}:{n}: not 'VERSION changelog|NEWS SHA256': {line!r}")
        records.append(Frozen(*fields))
    return records


def frozen_lines(version: str, changelog: str, news: str) -> list[str]:
    """The records of release ``version``: its changelog entry's and, where NEWS has one,
    its NEWS entry's.  ValueError where the changelog has no entry ``version``."""
    lines: list[str] = []
    for file, text in (("changelog", changelog), ("NEWS", news)):
        mine = [e for e in entries(text) if e.version == version]
        if mine:
            lines.append(f"{version} {file} {mine[0].sha256}")
        elif file == "changelog":
            raise ValueError(f"debian/changelog has no entry {version}")
    return lines


def changed(records: list[Frozen], changelog: str, news: str) -> list[str]:
    """One line for each released entry whose text is not the recorded one (or is gone)."""
    texts = {"changelog": entries(changelog), "NEWS": entries(news)}
    problems: list[str] = []
    for r in records:
        now = [e for e in texts[r.file] if e.version == r.version]
        if not now:
            problems.append(f"debian/{r.file}: the released entry {r.version} is gone")
        elif now[0].sha256 != r.sha256:
            problems.append(f"debian/{r.file}: the released entry {r.version} changed")
    return problems
