"""Logging: journald with structured fields when stderr is the journal, else plain stderr.

Each event the agent logs has a stable ``MESSAGE_ID`` (see ``packaging/gpuagent.catalog``),
so ``journalctl -x`` can explain it and ``journalctl MESSAGE_ID=…`` can find it.
"""

from __future__ import annotations

import logging
import os
import sys
from enum import Enum
from typing import Any

__all__ = ["LOGGER", "Event", "EventLog", "journal_stream", "setup"]

LOGGER = "gpuagent"
IDENTIFIER = "gpuagent"


class Event(Enum):
    """A kind of log line and its journal ``MESSAGE_ID``."""

    FAILING_NOT_FOUND = "a3ee785bcee546d78c7cc299a3b83d93"
    FAILING_PERMISSION_DENIED = "6855a69c55e34c3d8e8e8004cf52c235"
    FAILING_TIMEOUT = "d34b23d67ff54534b8dfd5c8d7ca8e34"
    FAILING_DRIVER_NOT_LOADED = "373b3c7e2c4342f9b0da615c0f609358"
    FAILING_LIBRARY_MISSING = "803f3e3ab85a4c45bea7e530b92b063d"
    FAILING_NO_DEVICES = "a8c164d6cfeb46779461e3dee3906b7f"
    FAILING_GPU_LOST = "df41a2eb63dd464d9572200ed1feabfc"
    FAILING_BLOCKED_BY_OS = "376ca86f5c964bf581c55a80beb9410b"
    FAILING_UNPARSEABLE = "7f0efd97358448ac8bfa42843a77ec33"
    FAILING_OTHER = "2379b83f052842d5bbf723b6d54f2bf3"
    RECOVERED = "6c72e97727c44f6d861353e974ab6e52"
    GPU_MISSING = "a666bce8ff124acda078a5f39d89fc58"
    GPU_BACK = "63916ebb29f84adb81f656bab90ffe7b"
    NVIDIA_SMI_MISSING = "5db6b6b58a7b4b4a8fe49e8609753bea"
    NVIDIA_SMI_FOUND = "72f8120d716f422a8aa35ef0d7027ede"
    DRIVER_UNLOADED = "cab2aad2b2de41c3b5da77fe43c7efd6"
    DRIVER_LOADED = "ddabff740d5242d09f9c91c64f5ddad4"
    CONFIG_ERROR = "72201dde6c744b57acc050d0bf2059c0"
    SYSFS_PROBLEM = "f0f07fa5ac194fde9e4cb29e3f2754cd"
    STATE_WRITE_FAILED = "c47636050535466a83b2eb85b7974c5a"
    STATE_WRITE_RECOVERED = "ecad6c349e8343729f16219ad20249fd"
    METRICS_WRITE_FAILED = "cae34fdd8ac641d8aa2642a8890dde37"
    STARTED = "99e66d8f62db4f4dbf82bb7ddaf4e918"
    STOPPING = "90d4e51a0c914484838227d3158e5f34"
    RELOADED = "01e491466b2244cbb8a483b55764f3ee"
    PROBE_STUCK = "100c33ca79d44d4c90e4d9b00f5800f5"
    XID_PROBLEM = "25cd295bb3284ec8b669f5d8e1c9247a"
    XID_COUNTED = "c1048391e4ae467db71c9cd0878b21ba"
    SXID = "bcfbcc547cd14aad8f7cb52b248b615f"
    GPU_INIT_FAILED = "97726cf1616c475aa7d65d33e68c9425"
    JOURNAL_UNREADABLE = "986380a7c7a54d6c862133e237977fc5"
    JOURNAL_READABLE = "99154438127a4a459b671bc12b344080"
    NVLINK_READ_FAILED = "3b77ed1f18bc4592899d09e3af392ded"
    NVLINK_READ_RECOVERED = "1c742ce7bb294c5ea4f33ac5069e5373"
    NVLINK_UNREADABLE = "a901d3fa97e446cc89ad2c618f540284"
    PROCESSES_READ_FAILED = "42cfeca5820d4133a1da48d9f4f7bf8a"
    PROCESSES_READ_RECOVERED = "d18f259b22de45e297683a9dda03b84c"
    PROCESSES_UNREADABLE = "68a847d702644e5ea19977c3d7a51def"
    PROCESS_UNITS_UNKNOWN = "54e0c9a10c5546d188ec042b3af544dd"
    PROCESS_UNITS_KNOWN = "607f53143eb643adab532190163df26c"
    SYSTEM_BUS_MISSING = "0f80cbeb1775402ab78f5c4dab108c48"
    SYSTEM_BUS_FAILED = "06c6e1ae6a5a4672b2b4e8437e485ddf"
    SYSTEM_BUS_RECOVERED = "7b8e58d75d684f2dab3bf09bd72f3408"
    VGPU_READ_FAILED = "118a0384f8e34778a73e3b82665a393b"
    VGPU_READ_RECOVERED = "3caf957657ea4522b260ba798b7ada8c"
    IMEX_READ_FAILED = "87b1f8014b674b668ba75cbfa980b37d"
    IMEX_READ_RECOVERED = "d48fefa3b2e34056ad87233e8e246c30"
    BOARD_READ_FAILED = "7cacebd40c61403d912a768dd431aca1"
    BOARD_READ_RECOVERED = "771d5490213d49bd84c387901144a36b"
    # A slot's board replaced (its UUID changed), with the old and the new serial.
    BOARD_REPLACED = "0c3fbb108e5e4888982c5337ccf08ae7"
    FAULT_VICTIMS = "84d3c5ae8fe94b0c8dd8f3c64b042629"
    # A remembered board on the bus in another slot (moved, the bus renumbered): not gone.
    BOARD_MOVED = "edd3b490f0314ef3925c4f59497b7ec8"
    # Another UUID in a slot that never left the bus this boot: inconsistent input, no swap.
    BOARD_UUID_INCONSISTENT = "20d49336a42a4aed9f520b0348791015"
    WEAR_READ_FAILED = "64bfa69231ca4e228da10c72899114e6"
    WEAR_READ_RECOVERED = "18c3e3962c074328b54bdd2ab155c0b3"
    # The boards' wear counters at their first answer a boot, in WEAR_BOARDS: once a boot.
    WEAR_RECORDED = "adfdf3f1761c45ffbee2b3865eb27067"

    PROBLEM_LOST = "a6c5d15b39824dc594ffb44e6910ec28"
    PROBLEM_REQUIRES_RESET = "0d706c08af5c47678a4a25bbd30768de"
    PROBLEM_RECOVERY_ACTION = "d5f8cd06019743f798df52da0578cc1d"
    PROBLEM_ROW_REMAP_PENDING = "fe88c1c6cec34441adfa1822f4dd4b65"
    PROBLEM_ROW_REMAP_FAILED = "a58afe7da6aa493cb0a1095f9722d642"
    PROBLEM_RETIRED_PAGES_PENDING = "12a64e121c9944539479cf460b705c09"
    PROBLEM_RETIRED_PAGES_LIMIT = "376a09dff020430091bf091081d9b64b"
    PROBLEM_RETIRED_PAGES_RISING = "7e5039743e4747a6b9de1ddeda1cddde"
    PROBLEM_INFOROM = "c970577edab048deaa6fb9e26f7b2585"
    PROBLEM_THROTTLED = "453b7c0ae154459fa1dace13ec3f2680"
    PROBLEM_PCIE_LINK_DEGRADED = "27aafa4f168c42ed877298113b0dfcb9"
    PROBLEM_FABRIC = "cfbf994b90104d5ba2730c4a73ca636f"
    PROBLEM_ECC_UNCORRECTED = "68c9e898e3aa4929808e45e7d132a9b8"
    PROBLEM_GONE_FROM_BUS = "6b9d9a0866c9450fbc098bfec774b603"
    PROBLEM_NO_DRIVER = "8bf18f45e24a4aeab25c9e14e0630866"
    PROBLEM_GPU_COUNT = "a66efef0ad734def957df3106530cefc"
    PROBLEM_WRONG_DRIVER = "009674d1a52149a29b405a5098abccb0"
    PROBLEM_MIG_PENDING = "53d2c040ce3a4fe59cac507301988c6b"
    PROBLEM_NO_DRIVER_MODULE = "8fa31fcdf4fb4eb3a85f514b3096efff"
    PROBLEM_DRIVER_MISMATCH = "c989acf6585f4f64b25a3d9eacc8e748"
    PROBLEM_DRIVER_HUNG = "fa9696a19d9e41edbbea190c1695ddfb"
    PROBLEM_SMI_TIMEOUT = "f8ee0d2fc97a4f5aa632e8e3ff85cf1c"
    PROBLEM_NVLINK_DOWN = "33e511c2eadc4b4a9094cbff196c0216"
    PROBLEM_NVLINK_ERRORS = "135ed8aa4a284722b6f0b2d480f79f01"
    PROBLEM_FABRICMANAGER_DOWN = "302446af1f5b476ba6d462863ea9c2bc"
    PROBLEM_FABRICMANAGER_MISMATCH = "d92a7b837e9d4dcaa14abfb089534431"
    PROBLEM_FABRICMANAGER_FLAPPING = "7df8d492d2d34ef6aca96964d79ce58a"
    PROBLEM_FABRICMANAGER_RESTARTED = "8c98d4edafbb42a3a5072f832cf60e22"
    PROBLEM_PERSISTENCED_DOWN = "c6917e13111f4d199d0c5cef868afe41"
    PROBLEM_PERSISTENCE_OFF = "5318e12b841749d2bd3236606526fe7b"
    PROBLEM_IMEX_DOWN = "22a6066f8ac34fb5b55013c97e476cf0"
    PROBLEM_IMEX_DOMAIN_NOT_READY = "772924a5beec4d2dade6b5d4ccd13986"
    PROBLEM_VGPU_UNLICENSED = "c67667758bb0400497a960cb1479470e"
    PROBLEM_VGPU_LICENSE_GRACE = "5e4a1da8a50e4e108912de80b9b6d3eb"
    PROBLEM_PCIE_ERROR = "95882e9cf39d4ea684100fe84ea10a00"
    PROBLEM_WEAR_RISING = "a6eb17fb76654d729590672cf9016299"
    PROBLEM_CLEARED = "ab7e7a89442b441ba8b34cd8d0a968d0"
    # A problem that held before a restart, restated by the agent after it: no new start.
    STILL_HOLDS = "7570bcdcefa74a158fd45d65000eb219"
    # Sent by `gpuagent clear` (root), read back by the agent with the kernel's records.
    OPERATOR_CLEAR = "9c49e6436dd14aaea07c537ddc3d294c"
    # Sent by gpuagent-evidence@.service (root): a GPU's evidence bundle and where it is.
    EVIDENCE_BUNDLE = "d836137b1ca44d348e5d1ef8783a5af1"

    @classmethod
    def failing(cls, failure_class: str) -> Event:
        """The probe-failing event of a failure class (``version_mismatch`` …)."""
        return cls[f"FAILING_{failure_class.upper()}"]

    @classmethod
    def problem(cls, kind: str) -> Event:
        """The event of a GPU problem's start (``lost``, ``throttled`` …)."""
        return cls[f"PROBLEM_{kind.upper()}"]


class EventLog:
    """Writes events as log records carrying ``MESSAGE_ID`` and upper-case journal fields."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger(LOGGER)

    def __call__(self, level: int, event: Event | None, message: str, **fields: Any) -> None:
        extra = {k.upper(): str(v) for k, v in fields.items() if v is not None}
        if event is not None:
            extra["MESSAGE_ID"] = event.value
            extra["GPUAGENT_EVENT"] = event.name.lower()
        self.logger.log(level, message, extra=extra)


def journal_stream() -> bool:
    """Whether stderr is connected to the journal (``$JOURNAL_STREAM`` names its device:inode)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class _StderrFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


def setup(level: str, *, journal: bool | None = None) -> logging.Logger:
    """Configure the ``gpuagent`` logger for ``level`` (``debug`` … ``error``); returns it.

    With ``journal`` unset, journald is used when stderr is the journal stream.
    """
    logger = logging.getLogger(LOGGER)
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(level.upper())
    handler: logging.Handler
    if journal if journal is not None else journal_stream():
        from systemd.journal import JournalHandler  # noqa: PLC0415 - journald only when used

        handler = JournalHandler(SYSLOG_IDENTIFIER=IDENTIFIER)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_StderrFormatter())
    logger.addHandler(handler)
    return logger
