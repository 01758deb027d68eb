"""The evidence directory (root's, under the agent's state directory): bundles written and
dropped through a descriptor of it, never a path the agent could redirect.

``/var/lib/gpuagent`` belongs to the agent's user, so ``evidence/`` in it is opened without
following a symlink and used only while root owns it; every name below it is opened relative
to that descriptor.  A bundle is written as ``.partial-<name>`` and renamed when whole, so a
killed unit leaves no bundle that reads as complete (and its leftover goes at the next one).
Writers hold the directory's ``flock`` to rename, rotate and update the ledger.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator

from gpuagent.compat import rmtree_at
from gpuagent.edges import safefile
from gpuagent.evidence import plan

__all__ = ["DEFAULT", "LEDGER", "Store", "StoreError"]

DEFAULT = "/var/lib/gpuagent/evidence"
LEDGER = ".ledger.json"
_PARTIAL = ".partial-"
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# A partial bundle this old is a killed unit's, not one being written.
_STALE = 2 * plan.HOUR


class StoreError(Exception):
    """The evidence directory cannot be used; ``str()`` is one line naming it."""


def _open_directory(path: str, create: bool) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            os.mkdir(path, 0o755)
    try:
        return os.open(path, _DIRECTORY)
    except OSError as e:
        # O_DIRECTORY | O_NOFOLLOW on a symlink: ENOTDIR (ELOOP without O_DIRECTORY).
        link = e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path)
        why = "a symbolic link (not followed)" if link else e.strerror
        raise StoreError(f"{path}: {why}") from None


class Store:
    """The open evidence directory ``path``, created if absent; raises :class:`StoreError`
    when it is not a directory that root (``owner``) owns and only root may write."""

    def __init__(self, path: str = DEFAULT, *, owner: int = 0) -> None:
        self.path = path
        self.fd = _open_directory(path, create=True)
        st = os.fstat(self.fd)
        if st.st_uid != owner or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.close(self.fd)
            raise StoreError(
                f"{path}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}, "
                f"not by uid {owner} and writable by it alone; not used"
            )

    def close(self) -> None:
        """Close the directory."""
        os.close(self.fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory's lock (waits for another writer: the unit's timeout bounds it)."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def bundles(self) -> list[tuple[str, int]]:
        """Each bundle's (name, bytes of its files)."""
        found = []
        for name in os.listdir(self.fd):
            if plan.is_bundle(name):
                with contextlib.suppress(FileNotFoundError):
                    found.append((name, self._size(name)))
        return found

    def _size(self, name: str) -> int:
        fd = os.open(name, _DIRECTORY, dir_fd=self.fd)
        try:
            total = 0
            for entry in os.listdir(fd):
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
            return total
        finally:
            os.close(fd)

    def begin(self, name: str) -> int:
        """A new partial bundle for ``name`` (an earlier one of that name removed); returns
        its directory's descriptor.  Raises ``FileExistsError`` if bundle ``name`` exists."""
        with contextlib.suppress(FileNotFoundError):
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            raise FileExistsError(errno.EEXIST, "a bundle of this name exists", name)
        partial = _PARTIAL + name
        with contextlib.suppress(FileNotFoundError):
            rmtree_at(partial, self.fd)
        os.mkdir(partial, 0o700, dir_fd=self.fd)
        return os.open(partial, _DIRECTORY, dir_fd=self.fd)

    def finish(self, name: str, max_count: int, max_bytes: int) -> list[str]:
        """Make partial bundle ``name`` whole, then drop the oldest bundles over the caps
        and stale partial ones; returns the names dropped."""
        with self.locked():
            os.rename(_PARTIAL + name, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            dropped = plan.to_drop(self.bundles(), name, max_count, max_bytes)
            for old in dropped:
                rmtree_at(old, self.fd)
            self._sweep(time.time())
        return dropped

    def _sweep(self, now: float) -> None:
        for entry in os.listdir(self.fd):
            if entry.startswith(_PARTIAL):
                st = os.stat(entry, dir_fd=self.fd, follow_symlinks=False)
                if now - st.st_mtime > _STALE:
                    rmtree_at(entry, self.fd)

    def remove_all(self) -> list[str]:
        """Remove every bundle, partial one and the ledger; returns the bundles' names."""
        with self.locked():
            gone = []
            for entry in os.listdir(self.fd):
                if plan.is_bundle(entry) or entry.startswith(_PARTIAL):
                    rmtree_at(entry, self.fd)
                    gone += [entry] if plan.is_bundle(entry) else []
                elif entry == LEDGER:
                    os.unlink(entry, dir_fd=self.fd)
            return sorted(gone)

    def ledger(self) -> tuple[list[plan.Entry], str | None]:
        """The ledger's entries and why it could not be read (then it starts anew)."""
        path = os.path.join(self.path, LEDGER)
        try:
            fd = os.open(LEDGER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return [], None
        except OSError as e:
            return [], f"{path}: {e.strerror}"
        try:
            text = os.read(fd, 1 << 20)
        finally:
            os.close(fd)
        try:
            return plan.ledger_entries(json.loads(text)), None
        except (TypeError, ValueError) as e:
            return [], f"{path}: {e}"

    def keep_ledger(self, entries: list[plan.Entry]) -> None:
        """Replace the ledger with ``entries``."""
        data = json.dumps([e._asdict() for e in entries]).encode()
        tmp = LEDGER + ".new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=self.fd)
        write_new(self.fd, tmp, data)
        os.rename(tmp, LEDGER, src_dir_fd=self.fd, dst_dir_fd=self.fd)


def write_new(dir_fd: int, name: str, data: bytes) -> None:
    """Create file ``name`` (0600) in the directory ``dir_fd`` with ``data``, synced."""
    fd = os.open(name, _NEW_FILE, 0o600, dir_fd=dir_fd)
    try:
        safefile.write_all(fd, data)
    finally:
        os.close(fd)
