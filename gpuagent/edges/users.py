"""User names by uid, from the system's user database (NSS, through :mod:`pwd`)."""

from __future__ import annotations

import pwd

__all__ = ["user_name"]


def user_name(uid: int) -> str | None:
    """The name of user ``uid``, or None where the user database has none (a user removed
    since, a directory service that does not answer)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None
