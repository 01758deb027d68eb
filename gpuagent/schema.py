"""The state file's shape: TypedDicts and the words of its values (no code).
:mod:`gpuagent.report` alone writes them; ``gpuagent status``, the metrics and the scheduler's
commands read them from here.  Times are Unix time in seconds unless a key says otherwise.
"""

# No `from __future__ import annotations`: a string annotation in a TypedDict is compiled into
# a ForwardRef at import, which was half of this module's import, paid by `gpuagent status`.
# Optional keys are a total=False class over a `_...Keys` class of the keys always there:
# Python 3.10 (Ubuntu 22.04) has no typing.NotRequired.
from typing import TypedDict

from gpuagent.compat import StrEnum

__all__ = [
    "ClearEntry",
    "Exit",
    "GpuEntry",
    "NvlinkEntry",
    "PciEntry",
    "ProbeEntry",
    "ProbeState",
    "ProblemEntry",
    "ProcessEntry",
    "RemedyEntry",
    "SXidEntry",
    "ServiceEntry",
    "State",
    "Value",
    "VgpuEntry",
    "XidEntry",
]

# One nvidia-smi field's value (None: N/A).
Value = int | float | str | None


class ProbeState(StrEnum):
    """The probe's state: ``idle`` (no GPU to probe), ``gated`` (a gate holds), ``ok`` (the
    last probe answered), ``failing`` (it did not), ``stuck`` (a child will not exit)."""

    IDLE = "idle"
    GATED = "gated"
    OK = "ok"
    FAILING = "failing"
    STUCK = "stuck"


class _ProblemEntryKeys(TypedDict):
    """ProblemEntry's keys that are always there."""

    kind: str
    severity: str
    action: str
    message: str
    since: float


class ProblemEntry(_ProblemEntryKeys, total=False):
    """A problem on a GPU or the host: ``severity`` warning or critical, ``action`` one of
    :data:`gpuagent.health.ACTIONS`, ``since`` when it started; ``ends`` how it ends, in the
    journal's words (``ends by itself when nvidia-smi reports the GPU again``, ``after the
    repair: gpuagent clear 0000:18:00.0 xid``), ``latches`` whether only ``gpuagent clear``
    (or the next boot) ends it, a repair alone not (both absent in an older agent's state);
    ``xid`` for kind ``xid``, ``pcie_device`` for kind ``pcie_error`` (the PCI function on
    the GPU's path that erred), ``unit`` the systemd unit of the process that caused it,
    where known; ``unread_since`` and ``unread`` while its source cannot look again (the
    module unloaded, nvidia-smi missing or failing, the GPU absent from its answer, systemd's
    units unread): when it was last read and why not now; ``evidence`` for a GPU's critical
    problem, the path of the newest bundle root's ``gpuagent-evidence@`` gathered of the GPU
    since it began.  It holds as last seen until a read shows its cause gone (evidence
    before verdict)."""

    ends: str
    latches: bool
    xid: int
    pcie_device: str
    cause: str
    unit: str
    unread_since: float
    unread: str
    evidence: str


class XidEntry(TypedDict):
    """One Xid code counted on a GPU this boot: ``first`` and ``last`` record's time,
    ``severity`` none, warning or critical."""

    xid: int
    count: int
    first: float
    last: float
    name: str
    severity: str
    action: str


class SXidEntry(TypedDict):
    """One SXid code counted on an NVSwitch (its slot, or ``nvswitchN``) this boot."""

    pci_slot: str
    sxid: int
    count: int
    first: float
    last: float
    fatal: bool


class _NvlinkEntryKeys(TypedDict):
    """NvlinkEntry's keys that are always there."""

    links: int
    active: int
    inactive: list[int]
    counters: dict[str, dict[str, int | None]]


class NvlinkEntry(_NvlinkEntryKeys, total=False):
    """A GPU's NVLink as last read: ``links`` its links, ``active`` those up, ``inactive``
    the others' numbers, ``counters`` each link's error counters (``replay``, ``recovery``,
    ``crc``; None: N/A) by link number; ``stale`` (true, else absent) where that read is not
    current: nvidia-smi does not report the GPU now, or did not at the last read."""

    stale: bool


class VgpuEntry(TypedDict):
    """A vGPU guest's GPU licence as ``nvidia-smi -q`` last said: ``mode`` (``Virtualization
    Mode``: ``VGPU``, ``Pass-Through``), licensed ``product`` (``Product Name``) and
    ``license_status`` (``Licensed (Expiry: ...)``, ``Unlicensed (Restricted)`` …); None where
    it has no such line."""

    mode: str | None
    product: str | None
    license_status: str | None


class ProcessEntry(TypedDict):
    """A compute process on the GPU (``--query-compute-apps``): ``pid`` (nvidia-smi's PID
    namespace), ``name`` (``process_name``), ``used_memory_mib`` (``used_memory``, MiB; None:
    nvidia-smi cannot tell), ``unit`` the systemd unit it is in (None: systemd knows none, or
    could not be asked), ``unit_kind`` what that unit is (service, user, session, container,
    machine, slurm, scope, other; ``unknown``: systemd knows no unit for the PID; None: not
    asked) and ``unit_ref`` its service, UID, session, ``runtime:id``, machine or Slurm job (its
    id, or its SLUID: ``s`` and 13 base32 characters)."""

    pid: int
    name: str | None
    used_memory_mib: int | None
    unit: str | None
    unit_kind: str | None
    unit_ref: str | None


class ServiceEntry(TypedDict):
    """One of NVIDIA's systemd units as systemd says (``restarts``: its NRestarts)."""

    load_state: str
    active_state: str
    sub_state: str
    result: str
    restarts: int | None


class ClearEntry(TypedDict):
    """An operator's clear of ``kind`` (``all``: every latching kind) ``by`` a person (the
    login uid's user, else ``SUDO_USER``, else root: :func:`gpuagent.sources.kernel.clears.person`)
    ``at``."""

    kind: str
    by: str
    at: float


class _GpuEntryKeys(TypedDict):
    """GpuEntry's keys that are always there."""

    pci_slot: str
    uuid: str | None
    fields: dict[str, Value]
    sampled_at: float | None
    stale: bool
    health: str
    problems: list[ProblemEntry]
    xids: list[XidEntry]


# "class" is a keyword: the functional form.
PciEntry = TypedDict(
    "PciEntry", {"slot": str, "device_id": str, "class": str, "driver": str | None}
)


class GpuEntry(_GpuEntryKeys, total=False):
    """One GPU the agent knows: its last sample's ``fields`` by nvidia-smi query field (empty
    without one), when it was taken, whether it is ``stale``, its ``health`` (ok, warning,
    critical, unknown), problems and Xid counts; ``cleared`` the last operator's clear while
    the GPU has no problem since; ``processes_stale`` (true, else absent) where ``processes``
    are an earlier read's: nvidia-smi does not report the GPU now, or did not at the last
    read; ``vgpu`` its licence on a vGPU guest (absent elsewhere)."""

    nvlink: NvlinkEntry
    processes: list[ProcessEntry]
    processes_stale: bool
    vgpu: VgpuEntry
    cleared: ClearEntry


class ProbeEntry(TypedDict):
    """The probe: ``state`` (:class:`ProbeState`), ``gate`` while one holds,
    the failing probe's ``failure_class``, ``next_probe_in_ticks`` (None while gated),
    ``duration`` of the last run (s)."""

    state: str
    gate: str | None
    failure_class: str | None
    consecutive_failures: int
    next_probe_in_ticks: int | None
    spawns_total: int
    last_error: str | None
    last_success_at: float | None
    fields: list[str]
    duration: float | None


class Exit(TypedDict):
    """How the agent ended: ``reason`` ``ticks`` (ran the ticks asked for) or ``signal``."""

    reason: str
    at: float


class RemedyEntry(TypedDict):
    """The host's remedy (:mod:`gpuagent.remedy`): the one thing to do with the host now.
    ``action`` is the worst problem's (one of :data:`gpuagent.health.ACTIONS`, as the Slurm
    drain reason names it), ``says`` it in words (``drain and reboot``); ``fixes`` the
    problems that action ends and ``leaves`` the others, each named as the STATUS line named
    it (``0000:db:00.0 gone_from_bus``, ``0000:2a:00.0 Xid 119``, ``host gpu_count``), worst
    first.  Problems folded under a cause and those asking ``none`` are in neither."""

    action: str
    says: str
    fixes: list[str]
    leaves: list[str]


class _StateKeys(TypedDict):
    """State's keys that are always there."""

    schema: int
    version: str
    pid: int
    started_at: float
    updated_at: float
    ticks: int
    interval: float
    exit: Exit | None
    status: str
    pci: list[PciEntry]
    probe: ProbeEntry
    gpus: list[GpuEntry]
    sxids: list[SXidEntry]
    host_problems: list[ProblemEntry]
    missing: list[str]
    services: dict[str, ServiceEntry]
    problems: dict[str, str]
    history: str


class State(_StateKeys, total=False):
    """The state file.  ``problems`` is the agent's own trouble (``sysfs``, ``journal``,
    ``config``, ``textfile``, ``internal`` …), by kind; ``missing`` the GPUs bound to nvidia that
    nvidia-smi does not report; ``history`` what is known of the earlier boots (reading
    earlier boots, this boot only, no earlier boot yet, N earlier boots); ``remedy`` the
    host's remedy, null when no problem asks for anything (absent in an older agent's
    state); ``drain`` the config's (:data:`gpuagent.health.DRAIN_MODES`), which the
    scheduler's hooks read: ``report`` says what would drain and drains nothing (absent in an
    older agent's state: ``ask``)."""

    remedy: RemedyEntry | None
    drain: str
