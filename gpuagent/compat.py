"""The Python 3.11 standard-library pieces gpuagent uses, for Ubuntu 22.04's Python 3.10.

``StrEnum`` and :func:`rmtree_at` are one implementation on every Python (3.11's
``enum.StrEnum`` and ``shutil.rmtree(dir_fd=)`` behave the same here); ``tomllib`` is the
standard library's where it exists, else python3-tomli (Ubuntu 22.04 packages 1.2.2, whose
``loads`` takes ``str`` and whose ``load`` takes a binary file, as 3.11's do).
"""

from __future__ import annotations

import os
import sys
from enum import Enum

# mypy follows a version check, not an ImportError; debian/control's Depends says the same.
if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

__all__ = ["StrEnum", "rmtree_at", "tomllib"]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class StrEnum(str, Enum):
    """An enum whose members are their string values: ``str(m)``, ``f"{m}"`` and ``m == "x"``
    all give or match the value, as 3.11's ``enum.StrEnum`` does."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


def rmtree_at(name: str, dir_fd: int) -> None:
    """Remove directory ``name`` of directory ``dir_fd`` and everything under it, following no
    symlink (one inside is removed, not followed).  Raises ``OSError``: FileNotFoundError where
    ``name`` is absent, NotADirectoryError where it is a file, ELOOP where it is a symlink."""
    fd = os.open(name, _DIRECTORY, dir_fd=dir_fd)
    try:
        # scandir duplicates the descriptor; ours is closed below.
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for entry, is_dir in entries:
            if is_dir:
                rmtree_at(entry, fd)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)
