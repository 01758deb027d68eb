"""NVLink: ``nvidia-smi nvlink --status`` and ``--errorcounters`` parsed, and the rules that
turn them into ``nvlink_down`` and ``nvlink_errors`` problems (pure).

Both answers are GPU blocks: a header ``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)``, then
link lines indented with a tab and a space (or spaces, in copies pasted from a terminal), or
one line for the whole GPU instead (no NVLink, all links inactive, MIG mode).  A link is up
when it shows a speed (``26.562 GB/s``); anything else (``<inactive>``) is not up.  Error
counter names are kept as printed (``Replay Errors``, ``Recovery Errors``, ``CRC Errors``;
Blackwell's may differ).  A line that fits none of these is returned, never guessed at.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuagent.compat import StrEnum
from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.bus.pciaddr import sysfs_slot
from gpuagent.untrusted import whole
from gpuagent.views import Finding, Row

__all__ = [
    "COUNTERS_ARGS",
    "STATUS_ARGS",
    "Gpu",
    "GpuState",
    "Link",
    "Parsed",
    "Watch",
    "findings_by_slot",
    "parse_counters",
    "parse_status",
    "slots_by_key",
]

STATUS_ARGS = ("nvlink", "--status")
COUNTERS_ARGS = ("nvlink", "--errorcounters")


class GpuState(StrEnum):
    """What a GPU's block says."""

    LINKS = "links"  # link lines, some maybe not up
    ALL_INACTIVE = "all_inactive"  # it has NVLink, and no link is up
    NO_NVLINK = "no_nvlink"
    MIG = "mig"  # unknown: nvidia-smi does not answer for a GPU in MIG mode


# The whole-GPU lines, matched in lower case: their casing varies by driver ("Nvlink",
# "NVLink", "inActive").
_GPU_LINES = (
    ("all links are inactive", GpuState.ALL_INACTIVE),
    ("does not have or support nvlink", GpuState.NO_NVLINK),
    ("not supported for devices in mig mode", GpuState.MIG),
)
_HEADER = re.compile(r"^GPU (?P<index>\d{1,6}): (?P<name>.*?)(?: \(UUID: (?P<uuid>[^)]*)\))?\s*$")
_UUID = re.compile(r"GPU-[0-9a-fA-F-]+")
_LINK = re.compile(r"^\s*Link\s+(?P<n>\d{1,4}):\s*(?P<value>.*?)\s*$")
_SPEED = re.compile(r"(?P<speed>\d+(?:\.\d+)?) GB/s")
# A link's line of --errorcounters, its value a counter (_LINK's value, read in one match:
# an answer has 24 such lines a GPU).
_COUNTER = re.compile(
    r"^\s*Link\s+(?P<n>\d{1,4}):\s*(?P<name>[A-Za-z][A-Za-z -]*?):\s*(?P<value>\S+)\s*$"
)
_NO_VALUE = frozenset({"N/A", "[N/A]", "Not Supported", "[Not Supported]"})
# nvlink_down's end: every link up earlier in the boot, and as many as its peers have, up.
_UP = "when its links are up again"
_COUNT_DIGITS = 20


@dataclass(frozen=True)
class Link:
    """One link of ``nvlink --status``: its number, whether it is up, what was printed."""

    number: int
    up: bool
    text: str
    speed: float | None = None  # GB/s, one direction


@dataclass
class Gpu:
    """One GPU's block.  ``uuid`` is ``""`` when the header has none (or a masked one);
    ``counters`` (``--errorcounters``) is ``{link: {counter name: value}}``, None where the
    driver prints ``N/A``."""

    index: int
    name: str
    uuid: str
    state: GpuState = GpuState.LINKS
    links: list[Link] = field(default_factory=list)
    counters: dict[int, dict[str, int | None]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """What names the GPU across reads: its UUID, else ``index:N``."""
        return self.uuid or f"index:{self.index}"

    @property
    def active(self) -> int | None:
        """Links up; None where it is not known (MIG, a block without link lines) or there
        is no NVLink."""
        if self.state is GpuState.LINKS:
            return sum(link.up for link in self.links) if self.links else None
        return 0 if self.state is GpuState.ALL_INACTIVE else None


@dataclass(frozen=True)
class Parsed:
    """One answer: the GPU blocks, and each line that could not be read, in order."""

    gpus: tuple[Gpu, ...]
    unreadable: tuple[str, ...] = ()

    @property
    def no_nvlink(self) -> bool:
        """Whether the answer says that no GPU has NVLink: every block says so, or the
        answer is empty (older drivers print nothing for a GPU without NVLink)."""
        if not self.gpus:
            return not self.unreadable
        return all(g.state is GpuState.NO_NVLINK for g in self.gpus)

    @property
    def has_links(self) -> bool:
        """Whether some GPU has links to count errors on."""
        return any(g.state is GpuState.LINKS and g.links for g in self.gpus)


def _gpu_line(line: str) -> GpuState | None:
    low = line.lower()
    return next((state for needle, state in _GPU_LINES if needle in low), None)


def _parse(text: str, read: Callable[[Gpu, str], bool]) -> Parsed:
    """The GPU blocks of an answer, each link's line given to ``read`` (whether it could)."""
    gpus: list[Gpu] = []
    unreadable: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        if line.startswith("GPU ") and (m := _HEADER.match(line)):
            uuid = m["uuid"] or ""
            gpus.append(Gpu(int(m["index"]), m["name"], uuid if _UUID.fullmatch(uuid) else ""))
            continue
        gpu = gpus[-1] if gpus else None
        # A whole-GPU line only counts before the GPU's first link: looked for only there.
        state = _gpu_line(line) if gpu is not None and not gpu.links and not gpu.counters else None
        if gpu is not None and state is not None:
            gpu.state = state
        elif gpu is None or gpu.state is not GpuState.LINKS or not read(gpu, line):
            unreadable.append(line.strip())
    return Parsed(tuple(gpus), tuple(unreadable))


def _status(gpu: Gpu, line: str) -> bool:
    link = _LINK.match(line)
    if link is None:
        return False
    value = link["value"]
    speed = _SPEED.fullmatch(value)
    up = speed is not None
    gpu.links.append(Link(int(link["n"]), up, value, float(speed["speed"]) if speed else None))
    return True


def _counter(gpu: Gpu, line: str) -> bool:
    m = _COUNTER.match(line)
    if m is None:
        return False
    value = m["value"]
    if value in _NO_VALUE:
        count = None
    elif (got := whole(value, _COUNT_DIGITS)) is not None:
        count = got
    else:
        return False
    gpu.counters.setdefault(int(m["n"]), {})[m["name"].strip()] = count
    return True


def parse_status(text: str) -> Parsed:
    """Parse ``nvidia-smi nvlink --status``."""
    return _parse(text, _status)


def parse_counters(text: str) -> Parsed:
    """Parse ``nvidia-smi nvlink --errorcounters``."""
    return _parse(text, _counter)


def slots_by_key(rows: Iterable[Row]) -> dict[str, str]:
    """The sysfs slot of each GPU key (UUID and ``index:N``) in the probe's rows."""
    out: dict[str, str] = {}
    for row in rows:
        bus = row.get("pci.bus_id")
        if not isinstance(bus, str):
            continue
        slot = sysfs_slot(bus)
        if isinstance(row.get("uuid"), str):
            out[str(row["uuid"])] = slot
        if isinstance(row.get("index"), int):
            out[f"index:{row['index']}"] = slot
    return out


def _label(counter: str) -> str:
    """``Recovery Errors`` -> ``recovery``: the counter as the problem's message names it."""
    low = counter.lower()
    return low.removesuffix(" errors")


def _budget_of(counter: str, recovery: int, replay: int) -> int | None:
    low = counter.lower()
    if "recovery" in low:
        return recovery
    if "replay" in low:
        return replay
    return None  # CRC and whatever else: counted by nvidia-smi, not judged here


_Sample = tuple[float, int]


class Watch:
    """What the reads of this boot say about each GPU's NVLink.

    :meth:`status` and :meth:`counters` take each read (``now``: monotonic seconds); then
    :meth:`findings` says, per GPU key, ``nvlink_down`` (critical, ``reset_gpu``) for a link
    that was up earlier in this boot and is not now, or for fewer links up than another GPU
    of its model on this host has; and ``nvlink_errors`` (warning, ``reset_gpu``) for a
    recovery or replay counter that rose by more than its budget within ``window`` seconds.
    The first count of a counter is its baseline: a lifetime count already there is no rise.
    A GPU in MIG mode is unknown: no problem, and nothing forgotten about it.
    """

    def __init__(self, window: float, recovery_budget: int, replay_budget: int) -> None:
        self.window = window
        self.recovery_budget = recovery_budget
        self.replay_budget = replay_budget
        self._gpus: dict[str, Gpu] = {}
        self._was_up: dict[str, set[int]] = {}
        self._history: dict[tuple[str, int, str], deque[_Sample]] = {}
        self._rising: dict[str, list[str]] = {}

    @property
    def links_up(self) -> dict[str, set[int]]:
        """The links seen up this boot, by GPU key."""
        return self._was_up

    def remember(self, links_up: Mapping[str, Iterable[int]]) -> None:
        """Links up earlier in this boot, before this agent read any (a restart)."""
        for key, links in links_up.items():
            self._was_up.setdefault(key, set()).update(links)

    def status(self, parsed: Parsed) -> None:
        """Take one ``nvlink --status`` answer."""
        # A GPU missing from the answer is the probe's to report (lost), not a link problem.
        self._gpus = {gpu.key: gpu for gpu in parsed.gpus}
        for gpu in parsed.gpus:
            if gpu.state is GpuState.LINKS:
                self._was_up.setdefault(gpu.key, set()).update(
                    link.number for link in gpu.links if link.up
                )

    def counters(self, now: float, parsed: Parsed) -> None:
        """Take one ``nvlink --errorcounters`` answer read at ``now``."""
        rising: dict[str, list[str]] = {}
        for gpu in parsed.gpus:
            if gpu.state is not GpuState.LINKS:
                continue
            for number, values in sorted(gpu.counters.items()):
                for name, value in values.items():
                    budget = _budget_of(name, self.recovery_budget, self.replay_budget)
                    if value is None or budget is None:
                        continue
                    base = self._sample(now, (gpu.key, number, name), value)
                    if value - base > budget:
                        rising.setdefault(gpu.key, []).append(
                            f"link {number} {_label(name)} {base} \u2192 {value}"
                        )
        self._rising = rising

    def _sample(self, now: float, key: tuple[str, int, str], value: int) -> int:
        """Record ``value`` and return the count the rise is measured from: the newest
        sample at least ``window`` old, else the oldest (the baseline)."""
        history = self._history.setdefault(key, deque())
        if history and value < history[-1][1]:
            history.clear()  # reset (nvidia-smi nvlink -r, a driver reload): a new baseline
        history.append((now, value))
        while len(history) > 1 and history[1][0] <= now - self.window:
            history.popleft()
        return history[0][1]

    def findings(self) -> dict[str, list[Finding]]:
        """The problems of each GPU key (a GPU without any is left out)."""
        out: dict[str, list[Finding]] = {}
        # Each GPU's links up, counted once: every GPU is compared with its peers.
        active = {key: gpu.active for key, gpu in self._gpus.items()}
        for key, gpu in self._gpus.items():
            down = self._down(gpu, active)
            if down:
                out.setdefault(key, []).append(
                    Finding("nvlink_down", CRITICAL, "reset_gpu", down, ends=_UP)
                )
        for key, links in self._rising.items():
            text = f"NVLink error counters rising: {'; '.join(links)}"
            ends = f"when the counters have not risen for {self.window:g} s"
            out.setdefault(key, []).append(
                Finding("nvlink_errors", WARNING, "reset_gpu", text, ends=ends)
            )
        return out

    def _down(self, gpu: Gpu, actives: Mapping[str, int | None]) -> str:
        active = actives[gpu.key]
        if active is None:
            return ""
        up = {link.number for link in gpu.links if link.up}
        lost = sorted(self._was_up.get(gpu.key, set()) - up)
        parts = []
        if lost:
            which = ", ".join(map(str, lost))
            plural = "s" if len(lost) > 1 else ""
            parts.append(f"link{plural} {which} down, up earlier in this boot")
        peers = [
            actives[p.key]
            for p in self._gpus.values()
            if p.key != gpu.key and p.name == gpu.name and actives[p.key] is not None
        ]
        best = max((n for n in peers if n is not None), default=0)
        if active < best:
            parts.append(f"{active} links up where another {gpu.name} on this host has {best}")
        return "; ".join(parts)


def findings_by_slot(
    findings: Mapping[str, list[Finding]], slots: Mapping[str, str]
) -> dict[str, list[Finding]]:
    """``findings`` keyed by sysfs slot (:func:`slots_by_key`); a key without a slot stays."""
    out: dict[str, list[Finding]] = {}
    for key, fs in findings.items():
        out.setdefault(slots.get(key, key), []).extend(fs)
    return out
