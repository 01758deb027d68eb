"""Whether a kernel record is the NVIDIA driver's own words (pure).

``_TRANSPORT=kernel`` proves that the kernel printed a record, not that the driver chose its
words: other subsystems print text any user chooses (a tmpfs mount option in an unprivileged
user namespace, the file name in the "NULL argv" warning, the client's version string in the
driver's own "API mismatch"), and journald turns the ``\\x0a`` of ``/dev/kmsg`` back into
newlines, so any line after a record's first can read like one of the driver's.  A record's
first characters are the kernel's (or, in a ``segfault`` record, a command name of at most 15
bytes: too short to spell a driver line).  So a record is the driver's where its first line
starts with the driver's prefix, and so does every line after it: the driver's multi-line
printks (the probe-time "fallen off the bus", the API mismatch, the probe's reasons) put
``NVRM:`` at the head of each line.  What such a record reports is read from its first line
(or, for a multi-line printk, from the whole record anchored at its start), never from a line
further down, where a client's string may stand.
"""

from __future__ import annotations

import re

__all__ = ["PREFIX", "lines"]

# The driver's prefixes: the GPU driver's, an NVSwitch's.  Blanks before one are tolerated (a
# record copied from dmesg's indented continuation lines); nothing else is.
PREFIX = re.compile(r"[ \t]*(?:NVRM|nvidia-nvswitch\d{1,4}): ")


def lines(message: str) -> list[str]:
    """The lines of one kernel record's ``MESSAGE`` (split at newlines, a trailing one
    dropped) when the driver printed all of them: the first and every later line start with
    :data:`PREFIX`.  ``[]`` for any other record."""
    if not PREFIX.match(message):
        return []
    split = message.rstrip("\n").split("\n")
    return split if all(PREFIX.match(line) for line in split) else []
