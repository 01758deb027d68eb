"""What systemd knows of gpuagent.service, for ``gpuagent status`` when there is no state file.

systemd removes ``/run/gpuagent`` when the service stops (the unit does not keep it: a
stopped agent's state would read as a live one's).  So a stopped service leaves no state file
to read, and systemd is asked instead: stopped since when, failed with which status, or not
run since boot.  Only imported on that path: ``gpuagent status`` must start fast.
"""

from __future__ import annotations

import os
import subprocess

__all__ = ["PROPERTIES", "UNIT", "describe", "query"]

UNIT = "gpuagent.service"
PROPERTIES = ("LoadState", "ActiveState", "Result", "ExecMainStatus", "InactiveEnterTimestamp")
# systemctl answers in milliseconds; a wedged D-Bus must not hang `gpuagent status`.
_TIMEOUT = 5.0
# sysexits' EX_CONFIG, as the agent exits on a config file it cannot use.
_EX_CONFIG = "78"


def describe(props: dict[str, str]) -> str | None:
    """One line on a service that is not running, from ``systemctl show`` properties; None
    when systemd's answer does not explain a missing state file (it is running or starting,
    or systemd did not answer)."""
    load, active = props.get("LoadState"), props.get("ActiveState")
    if load == "not-found":
        return f"{UNIT} is not installed"
    if load != "loaded" or active not in ("inactive", "failed"):
        return None
    since = props.get("InactiveEnterTimestamp", "")
    if not since:
        return "gpuagent has not run since boot"
    if active == "inactive":
        return f"gpuagent has been stopped since {since}"
    status = props.get("ExecMainStatus", "")
    how = f"{props.get('Result') or 'failed'}, exit status {status}"
    if status == _EX_CONFIG:
        how += ": the config file cannot be used (gpuagent check-config says why)"
    return f"gpuagent failed ({how}) since {since}"


def query() -> dict[str, str]:
    """``systemctl show`` of :data:`PROPERTIES`; empty where systemd cannot be asked."""
    argv = ["systemctl", "show", "--no-pager", UNIT]
    for name in PROPERTIES:
        argv += ["-p", name]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            check=False,
            env={**os.environ, "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"},
        )
    except (OSError, subprocess.TimeoutExpired, UnicodeDecodeError):
        return {}
    if proc.returncode != 0:
        return {}
    pairs = (line.partition("=") for line in proc.stdout.splitlines())
    return {key: value for key, sep, value in pairs if sep}
