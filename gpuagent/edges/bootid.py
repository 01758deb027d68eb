"""This boot's id as the kernel gives it to this process (``/proc/sys/kernel/random/boot_id``).

The GPUs remembered on disk (:mod:`gpuagent.sources.bus.known`) note the boot they were last on the
bus in, so that after a reboot a GPU that did not come back is said to be so.  Only this process's
own view needs to agree with itself, restart after restart.  It is the kernel's boot, not the
journal's (:func:`gpuagent.sources.kernel.journalboot.journal_boot`): in a container with a
boot id of its own, a restart of the container is no reboot of the GPUs' host, and the
sandboxed service sees the kernel's id.
"""

from __future__ import annotations

__all__ = ["PATH", "current"]

PATH = "/proc/sys/kernel/random/boot_id"


def current(path: str = PATH) -> str:
    """The boot id in the journal's form (32 hex digits, no dashes), ``""`` if unreadable."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip().replace("-", "").lower()
    except (OSError, ValueError):
        return ""
