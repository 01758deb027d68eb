"""sd_notify through the ``sdnotify`` package; a no-op without ``$NOTIFY_SOCKET``."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["Notifier", "watchdog_period"]


class Notifier:
    """Sends READY, STATUS, WATCHDOG, RELOADING and STOPPING; repeats no STATUS line."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._notifier = None
        if env.get("NOTIFY_SOCKET"):
            import sdnotify  # noqa: PLC0415 - only under systemd

            self._notifier = sdnotify.SystemdNotifier()
        self._status: str | None = None

    @property
    def active(self) -> bool:
        """Whether there is a notify socket to talk to."""
        return self._notifier is not None

    def _send(self, message: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(message)

    def ready(self, status: str | None = None) -> None:
        """``READY=1``, with the current STATUS if given."""
        if status is not None:
            self._status = status
            self._send(f"READY=1\nSTATUS={status}")
        else:
            self._send("READY=1")

    def status(self, text: str) -> None:
        """``STATUS=text`` when it differs from the last one sent."""
        if text != self._status:
            self._status = text
            self._send(f"STATUS={text}")

    def watchdog(self) -> None:
        """``WATCHDOG=1``."""
        self._send("WATCHDOG=1")

    def reloading(self) -> None:
        """``RELOADING=1``."""
        self._send("RELOADING=1")

    def stopping(self) -> None:
        """``STOPPING=1``."""
        self._send("STOPPING=1")


def watchdog_period(environ: Mapping[str, str] | None = None) -> float | None:
    """systemd's watchdog period in seconds (``$WATCHDOG_USEC``), if it is meant for us.

    ``$WATCHDOG_PID``, when set, must be this process.
    """
    env = os.environ if environ is None else environ
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 1e6 if usec > 0 else None
