"""What each source hands to the report each tick, and the vocabulary they share (pure).

The views are frozen: the report (:mod:`gpuagent.report`) is drawn from them and nothing
changes them after the tick.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

from gpuagent.compat import StrEnum
from gpuagent.edges.systemd.unitname import Owner
from gpuagent.health import ACTIONS, CRITICAL, SEVERITIES, WARNING, Health, Rank, named, rank
from gpuagent.schema import ProbeState, Value
from gpuagent.untrusted import MESSAGE_MAX, capped

if TYPE_CHECKING:
    from gpuagent.config import Config
    from gpuagent.sources.kernel.drivercatalog import Cause

__all__ = [
    "REASON_MAX",
    "AerHeard",
    "AerRecord",
    "BoardView",
    "BusView",
    "Clear",
    "Failure",
    "Finding",
    "Gate",
    "KernelView",
    "NvlinkGpu",
    "NvlinkView",
    "PciGpu",
    "PcieView",
    "ProbeView",
    "Problem",
    "ProcessView",
    "ProcessesView",
    "Row",
    "SXidCount",
    "Sample",
    "SamplesView",
    "Series",
    "ServicesView",
    "Table",
    "UnitView",
    "VgpuGpu",
    "VgpuView",
    "XidCount",
    "XidInfo",
    "plural",
    "uuid_of",
    "worst",
]

# One GPU's answer from nvidia-smi: each query field's value by its nvidia-smi name (None: N/A).
Row = dict[str, Value]


def plural(n: int, word: str) -> str:
    """``1 GPU``, ``2 GPUs``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# Longest reason a finding's ``unread`` carries (problems.json's reader takes no longer).
REASON_MAX = 1000


@dataclass(frozen=True)
class Finding:
    """One problem seen on one GPU (or the host): ``kind`` (``lost``, ``xid`` …), ``severity``
    (:data:`SEVERITIES`), ``action`` (:data:`ACTIONS`), a one-line ``message``, and ``extra``
    fields carried into the state beside them (``(("xid", 79),)``); ``ends`` when it ends by
    itself (``when nvidia-smi answers again``; ``""``: it holds until a clear or the boot).

    ``kind`` and ``extra`` together identify a problem across ticks: Xid 79 and Xid 48 on one
    GPU are two problems, each with its own start and end.  ``at`` is when the fault happened,
    where the source knows (an Xid's first kernel record): the problem's ``since``.
    ``unread`` is ``(last read, why not now)`` while its source cannot look (evidence before
    verdict: no read, no change).
    """

    kind: str
    severity: str
    action: str
    message: str
    extra: tuple[tuple[str, int | str], ...] = ()
    # When the fault itself happened (wall s), where the source knows (an Xid: its first
    # kernel record); not part of what the finding says.
    at: float | None = field(default=None, compare=False)
    # The systemd unit of the process that caused it (an application Xid's), where known: in
    # the message already, and a field of its own for the journal and the state.
    unit: str | None = field(default=None, compare=False)
    # When it ends by itself, said by the rule that makes it ("when nvidia-smi answers
    # again"); "" for one that holds until a clear or the next boot
    # (:func:`gpuagent.sources.kernel.clears.ending` says the whole of it).
    ends: str = field(default="", compare=False)
    # Its start and end are told by a line of the source's own (the probe's "nvidia-smi
    # failing", the gate's "module not loaded"), with that line's MESSAGE_ID since before it
    # was a problem: the verdict logs only a change of its severity or action.
    told: bool = field(default=False, compare=False)
    # While its source cannot look again (the module unloaded, nvidia-smi missing or failing,
    # the GPU absent from its answer, systemd's units unread): when it was last read (wall s)
    # and why it is not now.  It holds as last seen until a read shows its cause gone.
    unread: tuple[float, str] | None = None
    # What its end line says where it lapses by itself (the same rule as ``ends``): ``no
    # record for 3600 s (xid_warning_hold)``; "" where a read or a clear ends it.
    lapse: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} is not one of {ACTIONS}")
        # Messages and reasons carry tools' words: cut here, whoever built them, so no answer
        # makes a state or problems.json bigger than its readers take (issue 40).
        if len(self.message) > MESSAGE_MAX:
            object.__setattr__(self, "message", capped(self.message, MESSAGE_MAX))
        if self.unread is not None and len(self.unread[1]) > REASON_MAX:
            object.__setattr__(self, "unread", (self.unread[0], capped(self.unread[1], REASON_MAX)))

    @property
    def name(self) -> str:
        """The problem in a few words: its kind, or ``Xid 79`` for an Xid."""
        return named(self.kind, dict(self.extra).get("xid"))

    @property
    def caused(self) -> bool:
        """Folded under a host's problem, its ``cause`` (a GPU's fabric while the fabric
        manager is down): that problem is the one to act on."""
        return any(k == "cause" for k, _ in self.extra)

    @property
    def key(self) -> tuple[str, tuple[tuple[str, int | str], ...]]:
        """What identifies this problem from one tick to the next."""
        return self.kind, self.extra


def worst(findings: Iterable[Finding]) -> Health:
    """The health of a GPU with ``findings``: ``critical``, ``warning`` or ``ok`` (none)."""
    severities = {f.severity for f in findings}
    if CRITICAL in severities:
        return Health.CRITICAL
    return Health.WARNING if WARNING in severities else Health.OK


@dataclass(frozen=True)
class Problem:
    """A :class:`Finding` that holds on the GPU in ``slot`` (``""``: the host) since ``since``
    (Unix time, s)."""

    slot: str
    finding: Finding
    since: float

    @property
    def rank(self) -> Rank:
        """Where it sorts among problems, worst first (:func:`rank`)."""
        f = self.finding
        return rank(f.severity, f.action, self.slot, f.kind, caused=f.caused)


@dataclass(frozen=True)
class PciGpu:
    """One NVIDIA GPU function on the PCI bus.

    ``slot`` is the sysfs BDF (``0000:41:00.0``), ``device_id`` and ``pci_class`` are the
    sysfs hex strings (``0x2335``, ``0x030200``), ``driver`` the bound driver's name
    (``nvidia``, ``nouveau``, ``vfio-pci``) or ``None`` when unbound.
    """

    slot: str
    device_id: str
    pci_class: str
    driver: str | None

    @property
    def probeable(self) -> bool:
        """Whether nvidia-smi can be asked about it: bound to ``nvidia``, or not bound yet."""
        return self.driver in (None, "nvidia")


@dataclass(frozen=True)
class BusView:
    """One scan: ``gpus`` on the bus now (sorted by slot), ``seen`` every slot seen on it since
    the agent started (or since ``sysfs_root`` changed), ``problems`` one line per sysfs file
    that could not be read, whether the ``nvidia`` kernel module is loaded, ``not_back``
    the slots of ``seen`` last on the bus in an earlier boot and not yet in this one, and
    ``gone_since`` when those missing from it before the agent started were first found
    missing (wall s; their ``gone_from_bus`` is no new fault to this agent), ``removed`` the
    slots root said left for good (``gpuagent clear SLOT gone_from_bus``) and not on the bus
    since, each with the ``expected_gpus`` of its clear (None: unset), and ``replaced`` the
    slots whose board was replaced while this agent ran, each with when it saw the new one
    (wall s): their recurrence starts afresh there; ``boards`` the UUID remembered in each
    slot (:mod:`gpuagent.sources.bus.known`); ``departed`` the boards replaced out of this
    host, by UUID (lower case) and by serial number, each with what its problems say should
    it be back."""

    gpus: tuple[PciGpu, ...] = ()
    seen: frozenset[str] = frozenset()
    problems: tuple[str, ...] = ()
    module_loaded: bool = False
    not_back: frozenset[str] = frozenset()
    gone_since: Mapping[str, float] = field(default_factory=dict)
    removed: Mapping[str, int | None] = field(default_factory=dict)
    replaced: Mapping[str, float] = field(default_factory=dict)
    boards: Mapping[str, str] = field(default_factory=dict)
    departed: Mapping[str, str] = field(default_factory=dict)

    @property
    def slots(self) -> list[str]:
        """The PCI slots of the GPUs on the bus now."""
        return [g.slot for g in self.gpus]

    @property
    def probeable(self) -> list[PciGpu]:
        """The GPUs nvidia-smi could answer for (not handed to another driver on purpose)."""
        return [g for g in self.gpus if g.probeable]


class Failure(StrEnum):
    """Why a probe produced no samples."""

    NOT_FOUND = "not_found"
    PERMISSION_DENIED = "permission_denied"
    TIMEOUT = "timeout"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    LIBRARY_MISSING = "library_missing"
    VERSION_MISMATCH = "version_mismatch"
    NO_DEVICES = "no_devices"
    GPU_LOST = "gpu_lost"
    BLOCKED_BY_OS = "blocked_by_os"
    UNPARSEABLE = "unparseable"
    OTHER = "other"


class Gate(StrEnum):
    """Why the agent does not probe."""

    NO_GPU = "no_gpu"
    NVIDIA_SMI_MISSING = "nvidia_smi_missing"
    DRIVER_NOT_LOADED = "driver_not_loaded"


@dataclass(frozen=True)
class Sample:
    """One GPU's row from one probe: ``fields`` by query field name, both clocks' times (s)."""

    fields: Row
    sampled_at: float
    sampled_mono: float


@dataclass(frozen=True)
class SamplesView:
    """``samples`` by slot; ``fresh`` the slots whose sample is current; ``missing`` the slots
    bound to nvidia that the last answer did not report, in bus order."""

    samples: Mapping[str, Sample] = field(default_factory=dict)
    fresh: frozenset[str] = frozenset()
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeView:
    """The probe as of the last tick.  Times: ``last_success_at`` wall s; ``duration`` s of
    the last run; ``next_in_ticks`` ticks until the next probe (1: the next tick);
    ``probes_total`` probes run, ``timed_out`` whether the last one timed out."""

    state: ProbeState = ProbeState.IDLE
    gate: Gate | None = None
    failure: Failure | None = None
    failures: int = 0
    next_in_ticks: int = 1
    spawns_total: int = 0
    last_error: str | None = None
    last_success_at: float | None = None
    duration: float | None = None
    fields: tuple[str, ...] = ()
    probes_total: int = 0
    timed_out: bool = False
    binary: str | None = None
    samples: SamplesView = field(default_factory=SamplesView)


@dataclass(frozen=True)
class ApiMismatch:
    """The kernel's ``NVRM: API mismatch`` record: a client of driver ``client`` (the
    program's name where the driver prints it) talked to kernel module ``kernel``."""

    client: str
    kernel: str
    program: str | None = None


@dataclass(frozen=True)
class DriverRecords:
    """What the kernel's records said about the driver: the absence ``reasons``
    (:data:`gpuagent.sources.driver.driver.REASONS`) of the records read this tick, and the
    boot's latest API-mismatch record."""

    reasons: tuple[str, ...] = ()
    mismatch: ApiMismatch | None = None


@dataclass(frozen=True)
class XidInfo:
    """One Xid code: ``name`` (short), ``severity`` (``none``, ``warning``, ``critical``),
    ``action`` (one of :data:`gpuagent.health.ACTIONS`) and ``advice`` (one sentence).

    ``why`` is set where gpuagent departs from NVIDIA's catalog (its immediate resolution
    bucket, or the severity and action the reference table derives from it), and says why.
    """

    name: str
    severity: str
    action: str
    advice: str
    why: str = ""


@dataclass(frozen=True)
class XidCount:
    """One (GPU, Xid code) of this boot: ``count`` records, the ``first`` and ``last`` one's
    time (s since the epoch), what it means (``info``: the worst seen; for 154 the latest),
    the last record's words (``text``) and the process it names (``pid``, ``process``: its
    ``pid=`` and ``name=``; ``None`` where it names none).  The problem it makes is
    :func:`gpuagent.sources.kernel.xidcount.finding`'s."""

    code: int
    count: int
    first: float
    last: float
    info: XidInfo
    text: str
    pid: int | None = None
    process: str | None = None


@dataclass(frozen=True)
class XidHeard:
    """One Xid record as the kernel source took it: the GPU's ``slot``, ``code``, time ``at``
    (s since the epoch), the process it names (``pid``, ``process``; None: none), the Xid it
    says caused it (``cause``: ``… caused by previous Xid 149``; None: none) and its
    ``severity`` as this site judges it (the catalog's, or the site's ``[xid]`` entry)."""

    slot: str
    code: int
    at: float
    pid: int | None
    process: str | None
    cause: int | None
    severity: str


@dataclass(frozen=True)
class SXidCount:
    """One (NVSwitch, SXid code) of this boot: records, first and last time (s since the
    epoch), and whether any of its lines called it fatal."""

    code: int
    count: int
    first: float
    last: float
    fatal: bool = False


@dataclass(frozen=True)
class Clear:
    """An operator's clear of ``kind`` (or ``all``) on the GPU in ``slot`` by the person
    ``by`` (:func:`gpuagent.sources.kernel.clears.person`, else root) at ``at`` (s since the
    epoch); which problems it ends, :func:`gpuagent.sources.kernel.clears.covers` says."""

    slot: str
    kind: str
    by: str
    at: float


@dataclass(frozen=True)
class AerRecord:
    """One kernel AER record: at ``time`` (wall s) the ``port`` that printed it got an error
    message of ``kind`` (``correctable``, ``nonfatal``, ``fatal``) from ``source``, the
    device that erred (:mod:`gpuagent.sources.kernel.aerrecord`)."""

    time: float
    port: str
    source: str
    kind: str


@dataclass(frozen=True)
class AerHeard:
    """This boot's kernel AER records: how many and the last one's time (wall s) by (source,
    kind), the ``recent`` ones, oldest first (what an Xid 79 looks back on), and the
    kernel's last word on each recovery, by the port that ran it: when (wall s) and whether
    it was successful (``device recovery successful``, ``… failed``)."""

    counts: Mapping[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    recent: tuple[AerRecord, ...] = ()
    recoveries: Mapping[str, tuple[float, bool]] = field(default_factory=dict)


@dataclass(frozen=True)
class PcieView:
    """The GPUs' PCIe paths as the AER counters last said: each function's last rise as the
    agent saw it (wall s) and its kind (``fatal``, ``nonfatal``): what blames an Xid 79 on
    its path on a host whose firmware handles PCIe errors first (no kernel record)."""

    rose: Mapping[str, tuple[float, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelView:
    """This boot's kernel records as counted: Xids by (GPU slot, code), SXids by (NVSwitch
    slot or ``nvswitchN``, code), the GPU UUIDs the driver printed, by slot, and each GPU's
    last operator's clear (root's ``gpuagent clear``), by slot.  ``told``: the lines of
    counted Xids and SXids logged this boot, as (slot, ``xid`` or ``sxid``, code), by this
    agent or the one before a restart (:mod:`gpuagent.held` keeps them).  ``aer``: the
    kernel's AER records (:class:`AerHeard`).  ``wear``: the earlier boots' wear records by
    board UUID (lower case), each boot's first, oldest first, as counters by name
    (:mod:`gpuagent.sources.wear.counters`); None until the earlier boots are read.
    ``causes``: the driver's own words on why it could not take each GPU this boot, by slot
    (:mod:`gpuagent.sources.kernel.drivercatalog`).  ``heard``: the Xid records taken since
    the last step, logged since the agent started (:class:`XidHeard`), oldest first."""

    xids: Mapping[tuple[str, int], XidCount] = field(default_factory=dict)
    sxids: Mapping[tuple[str, int], SXidCount] = field(default_factory=dict)
    uuids: Mapping[str, str] = field(default_factory=dict)
    cleared: Mapping[str, Clear] = field(default_factory=dict)
    forgotten: tuple[str, ...] = ()
    driver: DriverRecords = field(default_factory=DriverRecords)
    recurrence: Recurring | None = None
    history: str = "this boot only"
    told: frozenset[tuple[str, str, int]] = frozenset()
    aer: AerHeard = field(default_factory=AerHeard)
    wear: Mapping[str, tuple[Mapping[str, int], ...]] | None = None
    causes: Mapping[str, Cause] = field(default_factory=dict)
    heard: tuple[XidHeard, ...] = ()


@dataclass(frozen=True)
class NvlinkGpu:
    """One GPU's links as last read: how many, which are not up (by number), and each link's
    error counters by counter name (``replay``, ``recovery``, ``crc``; None: N/A)."""

    links: int
    inactive: tuple[int, ...]
    counters: Mapping[int, Mapping[str, int | None]]


@dataclass(frozen=True)
class NvlinkView:
    """The NVLink reads: each GPU's links by slot (GPUs in MIG mode and without NVLink left
    out), whether the host's GPUs have no NVLink at all, and the reads' spawns so far;
    ``stale`` the slots of ``gpus`` whose links are an earlier read's (nvidia-smi does not
    report the GPU now, or did not when the last read ran)."""

    gpus: Mapping[str, NvlinkGpu] = field(default_factory=dict)
    no_nvlink: bool = False
    spawns_total: int = 0
    stale: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ProcessView:
    """One compute process on a GPU: ``pid``, ``name`` and ``used_memory_mib`` as nvidia-smi
    gives them (``--query-compute-apps`` fields ``pid``, ``process_name``, ``used_memory``,
    MiB; ``None``: it cannot tell); ``unit`` the systemd unit it is in (``None``: none known),
    ``kind`` and ``ref`` what the unit's name says (:mod:`gpuagent.edges.systemd.unitname`; ``kind``
    is ``None`` when systemd could not be asked)."""

    pid: int
    name: str | None
    used_memory_mib: int | None
    unit: str | None
    kind: str | None
    ref: str | None


@dataclass(frozen=True)
class ProcessesView:
    """The processes read: each GPU's, by slot (every GPU sampled; an idle one has none), or
    ``None`` while they are not known (not read yet, the read failing, the probe failing);
    the reads' spawns so far; ``stale`` the slots of ``gpus`` whose processes are an earlier
    read's (nvidia-smi does not report the GPU now, or did not when the last read ran)."""

    gpus: Mapping[str, tuple[ProcessView, ...]] | None = None
    spawns_total: int = 0
    last_seen: Mapping[int, Seen] = field(default_factory=dict)
    stale: frozenset[str] = frozenset()


@dataclass(frozen=True)
class VgpuGpu:
    """One GPU's licence on a vGPU guest as ``nvidia-smi -q`` last said: its virtualization
    ``mode`` (``VGPU``, ``Pass-Through``), licensed ``product`` and ``status`` (``Licensed
    (Expiry: ...)``, ``Unlicensed (Restricted)``); None where ``-q`` has no such line."""

    mode: str | None
    product: str | None
    status: str | None


@dataclass(frozen=True)
class VgpuView:
    """The licence reads: each GPU's with a licensed product, by slot (none on bare metal),
    and the reads' spawns so far."""

    gpus: Mapping[str, VgpuGpu] = field(default_factory=dict)
    spawns_total: int = 0


@dataclass(frozen=True)
class BoardView:
    """The boards' serial numbers as last read (nvidia-smi's ``serial``), by slot, each with
    the UUID the slot's board had then (None: not known): the GPUs whose board has one."""

    serials: Mapping[str, tuple[str | None, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class UnitView:
    """One of NVIDIA's systemd units as last read over D-Bus; ``file_state`` its
    ``UnitFileState`` (``enabled``: the host means to run it), where read."""

    load_state: str
    active_state: str
    sub_state: str
    result: str
    restarts: int | None
    file_state: str = ""


@dataclass(frozen=True)
class ServicesView:
    """NVIDIA's units by name; empty when not watched (no system bus) or the bus failed."""

    units: Mapping[str, UnitView] = field(default_factory=dict)
    host: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class Seen:
    """A process as last seen on a GPU: ``pid``, ``name`` (its ``/proc/<pid>/comm``, else
    the name in systemd's command line for it, else ``None``), ``unit`` (``None``: systemd
    knows none, or was not asked), ``owner`` (``None``: systemd could not be asked — no
    system bus, or it failed) and the GPU's ``slot``."""

    pid: int
    name: str | None
    unit: str | None
    owner: Owner | None
    slot: str | None = None


# One series' label values and its value.
Series = tuple[tuple[str, ...], float]


class Table(NamedTuple):
    """One Prometheus family as data, before prometheus_client makes it
    (:mod:`gpuagent.metrics`): a ``gauge`` or a ``counter`` (``kind``), its ``name`` (a
    counter's without ``_total``), ``doc``, the names of its ``labels`` and its ``rows``, one
    :data:`Series` each."""

    kind: Literal["gauge", "counter"]
    name: str
    doc: str
    labels: tuple[str, ...]
    rows: tuple[Series, ...]


class Recurring(Protocol):
    """The earlier boots' record of critical problems (the kernel's, once read): what a
    finding of this boot becomes when it recurs."""

    def escalate(
        self, slot: str, uuid: str | None, finding: Finding, swapped: float | None = None
    ) -> Finding:
        """``finding`` as the earlier boots make it; ``swapped``: when the slot's board came
        into it this boot (wall s; None: not known to)."""
        ...


def uuid_of(slot: str, kernel: KernelView, samples: SamplesView) -> str | None:
    """The UUID of the GPU in ``slot``: the one the driver printed, else nvidia-smi's
    (``uuid`` of its last sample); None where neither is known."""
    sample = samples.samples.get(slot)
    smi = sample.fields.get("uuid") if sample else None
    return kernel.uuids.get(slot) or (smi if isinstance(smi, str) else None)


@dataclass(frozen=True)
class Tick:
    """One tick's facts, filled in the sequence's order (:mod:`gpuagent.sources.sequence`):
    ``now`` (wall s) and ``mono`` (monotonic s) at its start, the ``config`` in use, the
    ``previous`` tick (``None`` on its own: one tick back only), and one view per source.

    A view a source has not stepped yet this tick is the previous tick's: a source reads the
    fields of the sources before it, and ``previous`` for what came after it last time.
    ``scan`` is the PCI scan alone, ``bus`` the scan with the GPUs this host had."""

    now: float
    mono: float
    config: Config
    previous: Tick | None = None
    scan: BusView = field(default_factory=BusView)
    kernel: KernelView = field(default_factory=KernelView)
    bus: BusView = field(default_factory=BusView)
    pcie: PcieView = field(default_factory=PcieView)
    services: ServicesView = field(default_factory=ServicesView)
    probe: ProbeView = field(default_factory=ProbeView)
    board: BoardView = field(default_factory=BoardView)
    nvlink: NvlinkView = field(default_factory=NvlinkView)
    processes: ProcessesView = field(default_factory=ProcessesView)
    vgpu: VgpuView = field(default_factory=VgpuView)

    @property
    def last(self) -> Tick:
        """The previous tick, or this one where there is none (the first)."""
        return self.previous or self

    def uuid(self, slot: str) -> str | None:
        """The UUID of the GPU in ``slot`` (:func:`uuid_of`)."""
        return uuid_of(slot, self.kernel, self.probe.samples)

    def serial(self, slot: str) -> str | None:
        """The serial number of the board in ``slot``, where read for the board there now."""
        read_for, serial = self.board.serials.get(slot, (None, None))
        return serial if read_for in (None, self.uuid(slot)) else None

    def next(self, now: float, mono: float, config: Config) -> Tick:
        """The tick after this one, at ``now`` (wall s) and ``mono`` (monotonic s): this
        one's views until its sources step, this one (one tick back only) as ``previous``."""
        last = self._with(previous=None)
        return last._with(now=now, mono=mono, config=config, previous=last)

    def with_view(self, name: str, view: object) -> Tick:
        """This tick with source ``name``'s ``view`` as its field; raises TypeError for a
        view of another type than the field's (a source's bug)."""
        if not isinstance(view, type(getattr(self, name))):
            raise TypeError(f"the {name} source gave a {type(view).__name__}")
        return self._with(**{name: view})

    def _with(self, **fields: object) -> Tick:
        # A copy with ``fields`` replaced: dataclasses.replace runs __init__ over every
        # field, 2 us each time, ten times a tick; the fields here are the class's own.
        new = object.__new__(Tick)
        new.__dict__.update(self.__dict__, **fields)
        return new
