"""NVIDIA's host services, judged: the fabric manager, the persistence daemon and IMEX (pure).

Facts in (the units' states from :mod:`gpuagent.edges.systemd.units`, the NVSwitches on the PCI bus,
the probe's rows), :class:`~gpuagent.views.Finding` out:

- ``fabricmanager_down`` (host, critical, ``restart_service``): NVSwitches on this host's PCI
  bus and ``nvidia-fabricmanager.service`` not active, or not installed.  A GB200-class
  compute tray has an NVLink fabric but no NVSwitch on its own bus and no local fabric
  manager: it never has this problem.
- ``fabricmanager_mismatch`` (host, critical, ``check_host``): instead of
  ``fabricmanager_down`` where the unit's own journal records of this boot say the driver
  refused it for its version ("fabric manager NVIDIA GPU driver interface version 590.48.01
  don't match with driver version 580.126.09", NVIDIA/gpu-driver-container#735): a restart
  starts the same binary and fails again; the matching nvidia-fabricmanager is to be
  installed.  Its restarts are no ``fabricmanager_flapping`` then: the cause is said once.
- ``fabricmanager_flapping`` (host, warning, ``restart_service``): its ``NRestarts`` rose by 3
  or more within 10 minutes; it ends once it has not risen for 10 minutes.
- ``fabricmanager_restarted`` (host, critical, ``drain_and_reset``): the fabric manager runs
  again after it stopped earlier this boot (systemd's ``ActiveExitTimestampMonotonic``).  Its
  restart does not end what its stop did: NVIDIA's Fabric Manager User Guide has the GPUs
  and NVSwitches reset between a fabric manager's stop and its next start (its FM/GPU reset
  sequence; its "Fabric Manager Restart Mode" resumes a fabric only in the Shared NVSwitch
  and vGPU modes, with ``FABRIC_MODE_RESTART=1``: :func:`fm_resumes`), and NVIDIA's
  engineers answer a start, stop and start without it so (NVIDIA/nccl#1488: "you need to
  reset the GPU in-between if the FM is stopped and restarted"; NVIDIA/nccl#976: "usually
  due to nv-fabricmanager having been manually restarted while processes were still holding
  resources on the GPU", NCCL's NVLS failing with "invalid argument" until then;
  NVIDIA/gpu-driver-container#909 resets the GPUs after the fabric manager's start on
  NVLink 5).  No record says the GPUs were reset, so it holds until the next boot or root's
  ``gpuagent clear host fabricmanager_restarted`` after the reset; a later restart is a new
  one.
- ``persistenced_down`` (host, warning, ``restart_service``): ``nvidia-persistenced.service``
  installed (not masked) and not active.
- ``persistence_off`` (per GPU, warning): the GPU's ``persistence_mode`` is Disabled and
  nvidia-persistenced is not running: ``restart_service`` where it is installed, else (not
  installed, or masked: off on purpose) ``check_host`` with ``nvidia-smi -pm 1``, which turns
  persistence on until the next reboot (a restart of a unit that is not there cannot work).

- ``imex_down`` (host, critical, ``restart_service``): ``nvidia-imex.service`` enabled
  (systemd's ``UnitFileState``) and not active.  IMEX shares GPU memory between the trays of
  a multi-node NVLink domain (GB200/GB300 NVL72); a host uses it where its operator enabled
  the daemon (NVIDIA's IMEX guide: ``systemctl enable nvidia-imex``).  The package installs it
  disabled, and a Kubernetes host runs it in its ComputeDomain's pods instead: installed but
  disabled is no problem (NVIDIA/aicr#2641, NVSentinel#1471, DCGM#308: an idle GB300 or a
  single HGX box called unhealthy for an IMEX daemon nobody needed).  Where the unit is
  enabled and running, the domain's readiness (``nvidia-imex-ctl -N``) is the ``imex``
  source's (:mod:`gpuagent.sources.imex`).

A unit whose state is not known (no system bus) is never a problem.  While
``fabricmanager_down`` (or ``fabricmanager_mismatch``) holds, :func:`fold_fabric` marks each
GPU's ``fabric`` problem with that ``cause``: one cause, said once.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuagent.health import CRITICAL, WARNING
from gpuagent.views import Finding, Row

__all__ = [
    "DCGM",
    "FABRICMANAGER",
    "FLAP_RESTARTS",
    "FLAP_WINDOW",
    "FM_CONFIG",
    "IMEX",
    "KINDS",
    "PERSISTENCED",
    "RERUN_MATTERS",
    "RESTARTED",
    "UNITS",
    "RestartWatch",
    "UnitFacts",
    "fabricmanager_findings",
    "fabricmanager_rerun_findings",
    "fm_mismatch",
    "fm_resumes",
    "fold_fabric",
    "imex_findings",
    "imex_runs",
    "persistence_findings",
    "persistenced_findings",
]

FABRICMANAGER = "nvidia-fabricmanager.service"
PERSISTENCED = "nvidia-persistenced.service"
# Shown, not judged: DCGM is an optional monitoring daemon.
DCGM = "nvidia-dcgm.service"
IMEX = "nvidia-imex.service"
UNITS = (FABRICMANAGER, PERSISTENCED, DCGM, IMEX)
KINDS = (
    "fabricmanager_down",
    "fabricmanager_mismatch",
    "fabricmanager_flapping",
    "fabricmanager_restarted",
    "persistenced_down",
    "persistence_off",
    "imex_down",
)
RESTARTED = "fabricmanager_restarted"
# The units whose restart within a boot says something (systemd's timestamps are read for them).
RERUN_MATTERS = (FABRICMANAGER,)
# The fabric manager's config as its package installs it, the path its unit's -c names.
FM_CONFIG = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"
# The lines of it read (the shipped file has about 120).
_CONFIG_LINES = 2000
# The host kinds a GPU's fabric problem is folded under.
_FABRIC_CAUSES = ("fabricmanager_down", "fabricmanager_mismatch", RESTARTED)
# nv-fabricmanager's refusal, in both of its spellings: "... interface version 590.48.01 don't
# match with driver version 580.126.09. Please update with matching NVIDIA driver package."
# (NVIDIA/gpu-driver-container#735) and, in newer packages, "doesn't match" (with a curly
# apostrophe where a console or a poster made one).
_MISMATCH = re.compile(
    r"fabric manager NVIDIA GPU driver interface version (?P<fm>\d+(?:\.\d+)+) "
    r"(?:don|doesn)[\u2019']t match with driver version (?P<driver>\d+(?:\.\d+)+)"
)
FLAP_RESTARTS = 3
FLAP_WINDOW = 600.0
# The fabric manager's reload is a running daemon, as is a refresh of its unit.
_RUNNING = frozenset({"active", "reloading", "refreshing"})
# UnitFileState of a unit its operator enabled (for good, or until the next boot).
_ENABLED = frozenset({"enabled", "enabled-runtime"})


@dataclass(frozen=True)
class UnitFacts:
    """What systemd says of one unit (``gpuagent.edges.systemd.units.Unit`` has these fields)."""

    name: str
    load_state: str
    active_state: str
    sub_state: str = ""
    result: str = ""
    n_restarts: int | None = None
    # systemd's UnitFileState (enabled, disabled, static …; "" not read): whether the host
    # means to run it, not how it runs, so no part of the unit's state to compare.
    file_state: str = field(default="", compare=False)
    # When it became active again after leaving the active state earlier this boot (wall s;
    # None: its first start this boot, or not read): ActiveEnterTimestamp, read only for the
    # units of RERUN_MATTERS.
    rerun: float | None = field(default=None, compare=False)

    @property
    def installed(self) -> bool:
        return self.load_state != "not-found"

    @property
    def enabled(self) -> bool:
        return self.file_state in _ENABLED

    @property
    def running(self) -> bool:
        return self.active_state in _RUNNING

    def describe(self) -> str:
        """``failed (exit-code)``, ``inactive (dead)``, ``not installed``."""
        if not self.installed:
            return "not installed"
        how = f"{self.active_state} ({self.sub_state})" if self.sub_state else self.active_state
        if self.result and self.result != "success":
            how += f", result {self.result}"
        return how


def fm_mismatch(messages: Sequence[str]) -> tuple[str, str] | None:
    """The fabric manager's and the driver's versions of the newest refusal in ``messages``
    (the unit's journal records, oldest first), or None."""
    for message in reversed(messages):
        if m := _MISMATCH.search(message):
            return m["fm"], m["driver"]
    return None


def fabricmanager_findings(
    nvswitches: Sequence[str], fm: UnitFacts | None, mismatch: tuple[str, str] | None = None
) -> list[Finding]:
    """``fabricmanager_down`` when ``nvswitches`` (slots) are on the bus and ``fm`` is not
    running (``fm`` None: its state is not known); ``fabricmanager_mismatch`` instead where
    its journal said the driver refused its version (``mismatch``: :func:`fm_mismatch`)."""
    if not nvswitches or fm is None or fm.running:
        return []
    if mismatch is not None:
        have, driver = mismatch
        text = (
            f"{FABRICMANAGER} is {fm.describe()}: the driver {driver} refuses nv-fabricmanager "
            f"{have} (its journal says the versions do not match); install nvidia-fabricmanager "
            f"{driver}, the driver's version, then start it: a restart alone fails again"
        )
        ends = f"when {FABRICMANAGER} runs again"
        return [Finding("fabricmanager_mismatch", CRITICAL, "check_host", text, ends=ends)]
    n = len(nvswitches)
    text = (
        f"{FABRICMANAGER} is {fm.describe()} and {n} NVSwitch{'es' if n > 1 else ''} on the "
        "PCI bus need it: no GPU can join the NVLink fabric"
    )
    ends = f"when {FABRICMANAGER} runs again"
    return [Finding("fabricmanager_down", CRITICAL, "restart_service", text, ends=ends)]


def fm_resumes(config: str | None) -> bool:
    """Whether the fabric manager's config (the text of :data:`FM_CONFIG`; None: not read)
    has it resume its fabric when it restarts: ``FABRIC_MODE`` 1 or 2 (Shared NVSwitch or vGPU
    multitenancy) with ``FABRIC_MODE_RESTART=1``, the only modes NVIDIA's guide lets it restart
    in; bare metal (``FABRIC_MODE=0``, the default) never does."""
    if config is None:
        return False
    keys: dict[str, str] = {}
    for line in config.splitlines()[:_CONFIG_LINES]:
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            keys[key.strip()] = value.split("#", 1)[0].strip()
    return keys.get("FABRIC_MODE") in ("1", "2") and keys.get("FABRIC_MODE_RESTART") == "1"


def fabricmanager_rerun_findings(
    nvswitches: Sequence[str], fm: UnitFacts | None, *, resumes: bool, cleared: float | None
) -> list[Finding]:
    """``fabricmanager_restarted`` when ``nvswitches`` (slots) are on the bus and ``fm`` runs
    again after it stopped earlier this boot (:attr:`UnitFacts.rerun`), unless its config has
    it resume (``resumes``: :func:`fm_resumes`) or root cleared it since that start
    (``cleared``: wall s of the last ``gpuagent clear host fabricmanager_restarted``)."""
    if not nvswitches or fm is None or not fm.running or fm.rerun is None or resumes:
        return []
    if cleared is not None and cleared >= fm.rerun:
        return []
    text = (
        f"{FABRICMANAGER} runs again after it stopped this boot: NVIDIA's Fabric Manager guide "
        "has the GPUs and NVSwitches reset between its stop and its start, and until they are, "
        "NVLink jobs fail (NCCL's NVLS: \"invalid argument\"); drain the GPUs' jobs, stop "
        "it, reset them (nvidia-smi -r) and start it, or reboot"
    )
    return [Finding(RESTARTED, CRITICAL, "drain_and_reset", text)]


def persistenced_findings(unit: UnitFacts | None) -> list[Finding]:
    """``persistenced_down`` when nvidia-persistenced is installed, not masked (off on
    purpose) and not running."""
    if unit is None or not unit.installed or unit.load_state == "masked" or unit.running:
        return []
    text = (
        f"{PERSISTENCED} is {unit.describe()}: without it every nvidia-smi run "
        "initialises the GPUs again"
    )
    ends = f"when {PERSISTENCED} runs again"
    return [Finding("persistenced_down", WARNING, "restart_service", text, ends=ends)]


def imex_runs(file_state: str, active_state: str) -> bool:
    """Whether nvidia-imex.service, with these states, is enabled and running: the host uses
    IMEX and its daemon is up, so its domain can be read (:mod:`gpuagent.sources.imex`)."""
    return file_state in _ENABLED and active_state in _RUNNING


def imex_findings(unit: UnitFacts | None) -> list[Finding]:
    """``imex_down`` where ``unit`` (nvidia-imex.service) is enabled and not running: the host
    uses IMEX (see the module's note); installed and disabled, or not installed, says nothing."""
    if unit is None or not unit.installed or not unit.enabled or unit.running:
        return []
    text = (
        f"{IMEX} is {unit.describe()} and enabled: the IMEX domain of this host's NVLink "
        "trays is down, and jobs that share GPU memory across trays fail"
    )
    ends = f"when {IMEX} runs again, or is disabled"
    return [Finding("imex_down", CRITICAL, "restart_service", text, ends=ends)]


def persistence_findings(
    rows: Mapping[str, Row], persistenced: UnitFacts | None
) -> dict[str, list[Finding]]:
    """``persistence_off`` for each GPU (by slot) whose ``persistence_mode`` is Disabled
    while nvidia-persistenced is not running; its advice fits what the host has."""
    if persistenced is None or persistenced.running:
        return {}
    text = f"persistence mode is off and {PERSISTENCED} is "
    if persistenced.installed and persistenced.load_state != "masked":
        action = "restart_service"
        text += (
            f"{persistenced.active_state}: each nvidia-smi run initialises the GPU again (1-3 s); "
            "start it (systemctl restart nvidia-persistenced)"
        )
    else:
        action = "check_host"
        why = "masked" if persistenced.installed else "not installed"
        text += (
            f"{why}: each nvidia-smi run initialises the GPU again (1-3 s); turn persistence "
            "on with nvidia-smi -pm 1 (as root; until the next reboot, which nvidia-persistenced "
            "would outlast)"
        )
    ends = f"when persistence mode is on, or {PERSISTENCED} runs"
    return {
        slot: [Finding("persistence_off", WARNING, action, text, ends=ends)]
        for slot, row in rows.items()
        if row.get("persistence_mode") == "Disabled"
    }


def fold_fabric(
    host: Sequence[Finding], gpus: Mapping[str, Sequence[Finding]]
) -> dict[str, list[Finding]]:
    """``gpus``' findings with each ``fabric`` one marked ``cause: fabricmanager_down`` (or
    ``fabricmanager_mismatch``) while ``host`` holds that problem (the agent logs and pages the
    host's problem alone)."""
    kind = next((f.kind for f in host if f.kind in _FABRIC_CAUSES), None)
    if kind is None:
        return {slot: list(fs) for slot, fs in gpus.items()}
    cause = ("cause", kind)
    return {
        slot: [
            replace(f, extra=(*f.extra, cause))
            if f.kind == "fabric" and cause not in f.extra
            else f
            for f in fs
        ]
        for slot, fs in gpus.items()
    }


class RestartWatch:
    """``fabricmanager_flapping`` from the unit's ``NRestarts`` read now and then.

    The first count is the baseline.  A count that drops (a manual restart resets it) is a
    new baseline.  The problem starts when the rises within ``window`` seconds add up to
    ``restarts`` or more, and ends once there has been no rise for ``window`` seconds.
    """

    def __init__(self, restarts: int = FLAP_RESTARTS, window: float = FLAP_WINDOW) -> None:
        self.restarts = restarts
        self.window = window
        self._last: int | None = None
        self._rises: deque[tuple[float, int]] = deque()
        self._flapping = False

    def update(self, now: float, n_restarts: int | None) -> list[Finding]:
        """Take the count read at ``now`` (monotonic s; None: not known) and say whether
        it flaps."""
        if n_restarts is not None:
            if self._last is not None and n_restarts > self._last:
                self._rises.append((now, n_restarts - self._last))
            self._last = n_restarts
        while self._rises and self._rises[0][0] <= now - self.window:
            self._rises.popleft()
        risen = sum(n for _, n in self._rises)
        if risen >= self.restarts:
            self._flapping = True
        elif not self._rises:
            self._flapping = False
        if not self._flapping:
            return []
        minutes = f"{self.window / 60:g} min"
        text = (
            f"{FABRICMANAGER} restarted {risen} times within {minutes} (NRestarts "
            f"{self._last}): it keeps crashing; see journalctl -u {FABRICMANAGER}"
        )
        ends = f"when it has not restarted for {minutes}"
        return [Finding("fabricmanager_flapping", WARNING, "restart_service", text, ends=ends)]
