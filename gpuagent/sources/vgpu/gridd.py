"""Where a vGPU guest's licence comes from, as ``nvidia-gridd``'s config says (pure but for
:func:`read`, one small file).

``/etc/nvidia/gridd.conf`` names a legacy licence server (``ServerAddress=10.0.0.5``,
``ServerPort=443``: NVIDIA/nvidia-docker#1787's); a guest of the NVIDIA License System sets
none there and takes its server from the client configuration token in
``/etc/nvidia/ClientConfigToken`` (NVIDIA's licensing guide).  ``nvidia-smi -q`` names none.
"""

from __future__ import annotations

from gpuagent.edges.safefile import read_regular

__all__ = ["CLIENT_CONFIG_DIR", "CONF", "read", "server"]

CONF = "/etc/nvidia/gridd.conf"
CLIENT_CONFIG_DIR = "/etc/nvidia/ClientConfigToken"
_LIMIT = 64 * 1024
# A hostname is at most 253 characters: a longer value is cut, not carried whole into a line.
_CHARS = 253


def server(conf: str | None, path: str = CONF) -> str:
    """The licence server the text ``conf`` of the file at ``path`` names, in words for a
    message (None: the file could not be read)."""
    values: dict[str, str] = {}
    for line in (conf or "").splitlines():
        key, equals, value = line.partition("=")
        if equals and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    address = values.get("ServerAddress", "")[:_CHARS]
    if not address:
        return f"the licence server of the client configuration token in {CLIENT_CONFIG_DIR}"
    port = values.get("ServerPort", "")[:_CHARS]
    return f"the licence server {address}{':' + port if port else ''} (ServerAddress in {path})"


def read(path: str = CONF) -> str | None:
    """The text of ``nvidia-gridd``'s config; None where it cannot be read (absent: a token
    guest)."""
    try:
        return read_regular(path, _LIMIT).decode("utf-8", "replace")
    except OSError:
        return None
