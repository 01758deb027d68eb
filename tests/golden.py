"""Golden outputs: a real :class:`~gpuagent.daemon.Daemon` on the fake host, driven through its
public seams alone (``start``, ``step``, ``reload``, ``finish`` and the files it writes), every
surface recorded after each step: the state file, the Prometheus textfile, the journal lines
with their fields, and what was sent to the notify socket.

``tests/data/golden`` holds one file a scenario, recorded from the code before the Report
redesign; ``GPUAGENT_GOLDEN_RECORD=1`` rewrites them.  The monotonic clock is a fake one that
each step moves on by the interval; what the agent takes from the wall clock (and the pid, and
the test's own paths) is replaced by a token, never dropped, so that a key that disappears
shows.  The state file's key order is the file's own: it is part of its bytes.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import os
import re
import socket
from collections.abc import Callable
from typing import Any

import pytest

import gpuagent
from gpuagent import config
from gpuagent.compat import tomllib
from gpuagent.daemon import Daemon
from gpuagent.logs import EventLog
from gpuagent.notify import Notifier
from tests import fakehost
from tests.conftest import Clock, ListHandler
from tests.fakehost import FakeHost

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")
DATA = os.path.join(REPO, "tests", "data", "golden")
RECORD_ENV = "GPUAGENT_GOLDEN_RECORD"

TIME = "<time>"
# State keys whose values come from the wall clock or are durations, wherever they stand
# ("at" is the exit's).  An Xid's first and last are its journal records' times: kept.
STATE_TIMES = frozenset(
    {"started_at", "updated_at", "sampled_at", "since", "last_success_at", "duration", "at"}
)
_PROM_TIMES = re.compile(
    r"^((?:gpuagent_last_update_timestamp_seconds|gpuagent_probe_duration_seconds"
    r"|gpuagent_probe_last_success_timestamp_seconds)(?:\{[^}]*\})?) \S+$"
)
# systemd's watchdog period: the daemon pings every 0.4 of it (12 s), so a 10 s tick shows
# pings on some steps and not on others.
WATCHDOG_USEC = "30000000"
_CLOCK = re.compile(r"\bsince \d\d:\d\d:\d\d\b")

Make = Callable[..., str]


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Golden:
    """A fake host (``gpus`` H200s under ``directory``) and the daemon on it, recorded step by
    step into :attr:`steps`.  Change the host between steps through :attr:`host` (its
    nvidia-smi scenario, its sysfs tree), the config file (:meth:`configure`) and journal
    files (:attr:`make`)."""

    def __init__(self, directory: str, make: Make, gpus: int) -> None:
        self.dir = directory
        # Per-tick spawns on a fake clock: a real loop child runs in real time.
        self.host: FakeHost = fakehost.create(directory, gpus, sampler="spawn")
        self.make = make
        self.clock = Clock()
        self.interval = 0.0
        self.steps: list[dict[str, Any]] = []
        self.daemon: Daemon | None = None
        self.state_file = self.textfile = ""
        self._ticked = False
        self._records = ListHandler()
        self._seen = 0
        self._logger = logging.getLogger(f"golden.{id(self)}")
        self._logger.handlers[:] = [self._records]
        self._logger.propagate = False
        self._logger.setLevel(logging.DEBUG)
        # systemd's notify socket, at an abstract address.
        self._sd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._address = f"@gpuagent-golden-{os.getpid()}-{id(self)}"
        self._sd.bind("\0" + self._address[1:])
        self._sd.setblocking(False)
        tokens = {
            directory: "<dir>",
            fakehost.quiet_journal(): "<quiet-journal>",
            SHARED: "<shared>",
            REPO: "<repo>",
            # Each build's own (gpuagent.version): it moves with every commit.
            gpuagent.__version__: "<version>",
        }
        self._tokens = sorted(((k, v) for k, v in tokens.items() if k), key=lambda t: -len(t[0]))
        self._pid = re.compile(rf"\bpid {os.getpid()}\b")

    def close(self) -> None:
        self._sd.close()

    # Changing the host ---------------------------------------------------------------------

    def configure(self, **changes: object) -> None:
        """Rewrite the config file with ``changes``."""
        with open(self.host.conf, "rb") as f:
            settings: dict[str, object] = tomllib.load(f)
        fakehost.write_config(self.host.conf, {**settings, **changes})

    def advance(self, seconds: float) -> None:
        """Move the monotonic clock on by ``seconds``."""
        self.clock.now += seconds

    # The daemon's seams --------------------------------------------------------------------

    def new_daemon(self) -> Daemon:
        """A daemon as ``gpuagent run`` makes it from the config file."""
        path = self.host.conf
        cfg = config.load(path, required=True)
        # systemd's environment only while the daemon reads it: journal-remote, run to make
        # the test's journals, would talk to the socket too.
        with pytest.MonkeyPatch.context() as env:
            env.setenv("NOTIFY_SOCKET", self._address)
            env.setenv("WATCHDOG_USEC", WATCHDOG_USEC)
            env.delenv("WATCHDOG_PID", raising=False)
            return Daemon(
                cfg,
                (path, True),
                notifier=Notifier(),
                monotonic=self.clock,
                log=EventLog(self._logger),
            )

    def start(self, name: str = "start") -> None:
        self.daemon = self.new_daemon()
        cfg = config.load(self.host.conf, required=True)
        self.interval, self.state_file, self.textfile = cfg.interval, cfg.state_file, cfg.textfile
        self.record(name, returned=self.daemon.start(install_signals=False))

    def step(self, name: str, *, at_once: bool = False) -> None:
        """One tick, an interval after the last one (``at_once``: now, as after a reload)."""
        assert self.daemon is not None
        if self._ticked and not at_once:
            self.advance(self.interval)
        self._ticked = True
        self.daemon.step()
        self.record(name)

    def reload(self, name: str, **changes: object) -> None:
        """Rewrite the config file with ``changes``, then reload (SIGHUP)."""
        assert self.daemon is not None
        self.configure(**changes)
        look = self.daemon.reload()
        with contextlib.suppress(config.ConfigError):  # else the old config is kept
            self.interval = config.load(self.host.conf, required=True).interval
        self.record(name, returned=look)

    def finish(self, reason: str) -> None:
        assert self.daemon is not None
        self.record(f"finish ({reason})", returned=self.daemon.finish(reason))

    # Recording -----------------------------------------------------------------------------

    def record(self, name: str, **returned: object) -> None:
        self.steps.append(
            {
                "step": name,
                **returned,
                "state": self._state(),
                "metrics": self._metrics(),
                "journal": self._journal(),
                "notify": self._notify(),
            }
        )

    def clean(self, text: str) -> str:
        for path, token in self._tokens:
            text = text.replace(path, token)
        # A restated problem's start, in local time: the machine's time zone is not the test's.
        return _CLOCK.sub("since <clock>", self._pid.sub("pid <pid>", text))

    def _normal(self, value: Any, key: str = "") -> Any:
        if key in STATE_TIMES and _number(value):
            return TIME
        if key == "pid" and _number(value):
            return "<pid>"
        if isinstance(value, dict):
            return {k: self._normal(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self._normal(v) for v in value]
        return self.clean(value) if isinstance(value, str) else value

    def _state(self) -> Any:
        try:
            with open(self.state_file, "rb") as f:
                raw = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        data = json.loads(raw)
        # Compact JSON of what is recorded, in this key order: the recording pins the bytes.
        assert raw == json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
        return self._normal(data)

    def _metrics(self) -> list[str] | None:
        try:
            with open(self.textfile, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return None
        lines = [_PROM_TIMES.sub(rf"\1 {TIME}", line) for line in text.split("\n")]
        return [self.clean(line) for line in lines]

    def _journal(self) -> list[dict[str, Any]]:
        new = self._records.records[self._seen :]
        self._seen = len(self._records.records)
        # The journal fields EventLog passes: MESSAGE_ID and the other upper-case ones.
        return [
            {
                "level": r.levelname,
                "message": self.clean(r.getMessage()),
                "fields": {
                    k: self.clean(str(v)) for k, v in sorted(vars(r).items()) if k.isupper()
                },
            }
            for r in new
        ]

    def _notify(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.clean(self._sd.recv(65536).decode("utf-8", "backslashreplace")))
            except BlockingIOError:
                return out


def check(name: str, about: str, steps: list[dict[str, Any]]) -> None:
    """Compare the ``steps`` of scenario ``name`` with its recording (or record them)."""
    doc = {"scenario": name, "about": " ".join(about.split()), "steps": steps}
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    path = os.path.join(DATA, f"{name}.json")
    if os.environ.get(RECORD_ENV) == "1":
        os.makedirs(DATA, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    if not os.path.exists(path):
        pytest.fail(f"{path} is not recorded: {RECORD_ENV}=1 records it", pytrace=False)
    with open(path, encoding="utf-8") as f:
        recorded = f.read()
    if text != recorded:
        was: list[dict[str, Any]] = json.loads(recorded).get("steps", [])
        now: list[dict[str, Any]] = json.loads(text)["steps"]
        changed = [
            f"{i}: {(now[i] if i < len(now) else was[i])['step']}"
            for i in range(max(len(was), len(now)))
            if i >= len(was) or i >= len(now) or was[i] != now[i]
        ]
        diff = difflib.unified_diff(
            recorded.splitlines(keepends=True),
            text.splitlines(keepends=True),
            f"recorded {name}.json",
            f"now {name}.json",
        )
        pytest.fail(
            f"the outputs of scenario {name} changed in steps {'; '.join(changed) or '(none)'}:"
            f"\n{''.join(diff)}",
            pytrace=False,
        )
