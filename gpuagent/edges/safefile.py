"""Files the agent (or root, by hand) reads and replaces in directories others may write.

:func:`read_regular` never follows a symlink at the path, never blocks on a FIFO and reads
at most a bound; :func:`write_atomic` replaces a file through a temporary one that no planted
symlink can redirect, synced to disk before and after the rename, so that a crash leaves the
old file or the new one, never an empty one.  :func:`load_json` adds JSON without ``NaN`` and
without nesting deep enough to exhaust the stack.  Only ``os``, ``json`` and ``stat``:
``gpuagent status`` imports this and must start fast.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from typing import Any

__all__ = ["load_json", "opened", "read_regular", "resolve_trusted", "write_all", "write_atomic"]

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def opened(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode)``, checked to be a
    regular file (fstat); returns the descriptor.

    Raises ``OSError``: ELOOP "a symbolic link (not followed)" for a symlink at ``path``,
    EINVAL "not a regular file" for a FIFO, a directory or a device, else the open's error.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link (not followed)", path) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises ``OSError``: as :func:`opened`, and EFBIG "larger than LIMIT bytes" for a bigger
    file (only ``limit + 1`` bytes are read to tell).
    """
    fd = opened(path, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, limit + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
    return b"".join(chunks)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def load_json(path: str, limit: int) -> Any:
    """The JSON value in the regular file ``path`` (at most ``limit`` bytes).

    Raises ``OSError`` as :func:`read_regular`, ``ValueError`` for text that is not JSON,
    holds ``NaN`` or ``Infinity``, or nests too deeply, and ``UnicodeDecodeError`` (a
    ValueError) for bytes that are not UTF-8.
    """
    text = read_regular(path, limit).decode("utf-8")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the open file ``fd`` and fsync it; raises ``OSError``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: a new temporary file beside it (``O_EXCL``, never
    through a symlink), written and fsynced, renamed over ``path``, then the directory
    fsynced.  The file gets ``mode`` whatever the umask.

    Raises ``OSError`` (ENOSPC, EROFS, EACCES …); ``path`` then stays as it was.
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        try:
            fd = os.open(tmp, _CREATE, mode)
        except FileExistsError:
            # A crashed run's leftover, or something planted: unlinking a symlink removes
            # the link, not its target.
            os.unlink(tmp)
            fd = os.open(tmp, _CREATE, mode)
        try:
            os.fchmod(fd, mode)
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    # The rename is durable only once the directory is; a file system that cannot sync a
    # directory (EINVAL) has nothing more to do.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


# More symlinks than this on one path is a loop, as the kernel's own limit says.
_MAX_LINKS = 40


def resolve_trusted(path: str) -> str:
    """``path`` absolute, with every symlink on it resolved, each one that root or this user
    made: another user's symlink (node_exporter's user, in its own directory) must not choose
    where root writes.  The part from the first component that does not exist on is kept as
    it is.

    Raises ``OSError``: EPERM "a symlink of uid N (not followed)", ELOOP for a loop, or the
    error of an lstat that fails otherwise.
    """
    mine = {0, os.geteuid()}
    todo = list(reversed(os.path.join(os.getcwd(), path).split("/")))
    done = "/"
    links = 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            done = os.path.dirname(done)
            continue
        here = os.path.join(done, name)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return os.path.join(here, *reversed(todo))
        if not stat.S_ISLNK(st.st_mode):
            done = here
            continue
        if st.st_uid not in mine:
            raise OSError(errno.EPERM, f"a symlink of uid {st.st_uid} (not followed)", here)
        links += 1
        if links > _MAX_LINKS:
            raise OSError(errno.ELOOP, "too many symbolic links", path)
        text = os.readlink(here)
        if text.startswith("/"):
            done = "/"
        todo.extend(reversed(text.split("/")))
    return done
