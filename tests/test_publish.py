"""The tick's outputs (:mod:`gpuagent.publish`) from one immutable State a tick: the publisher's
write trouble of a tick is in the next tick's report, and the state file's one rule
(:func:`gpuagent.report.stored`: it never says it could not be written).

Each scenario drives a real daemon on the fake host (:class:`tests.golden.Golden`, as a
driver: nothing is recorded) and says, tick by tick, which of the publisher's kinds each
output names: the state file and the textfile on disk, and the STATUS systemd has.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuagent import report, state
from gpuagent.edges import safefile
from gpuagent.schema import ProbeState, State
from gpuagent.sources.kernel.xidcatalog import lookup
from gpuagent.views import (
    BusView,
    Clear,
    Finding,
    KernelView,
    NvlinkGpu,
    NvlinkView,
    ProbeView,
    Problem,
    ProcessesView,
    ProcessView,
    SamplesView,
    ServicesView,
    SXidCount,
    UnitView,
    XidCount,
)
from tests import states
from tests.golden import Golden

KINDS = ("internal_publish", "state_file", "textfile")
PROBLEM = 'gpuagent_agent_problem{kind="'


class Faults:
    """What fails on the next tick: every state file write (``state``: True), the first only
    (``"first"``), the textfile's write (``textfile``), or turning the state into metrics
    (``bug``: a bug in publishing, not an I/O error)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.state: bool | str = False
        self.textfile = self.bug = False
        write, atomic = state.write, safefile.write_atomic

        def write_state(path: str, st: State) -> None:
            if self.state:
                self.state = self.state is True  # "first": this one only
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            write(path, st)

        def write_atomic(path: str, data: bytes) -> None:
            if self.textfile and path.endswith(".prom"):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            atomic(path, data)

        def metrics(registry: CollectorRegistry) -> bytes:
            if self.bug:
                raise RuntimeError("a bug in the metrics")
            return generate_latest(registry)

        monkeypatch.setattr(state, "write", write_state)
        monkeypatch.setattr(safefile, "write_atomic", write_atomic)
        monkeypatch.setattr("gpuagent.metrics.generate_latest", metrics)

    def set(self, **faults: Any) -> None:
        self.state, self.textfile, self.bug = False, False, False
        for name, value in faults.items():
            setattr(self, name, value)


@pytest.fixture
def g(tmp_path: str) -> Iterator[Golden]:
    metrics = os.path.join(tmp_path, "metrics")
    os.mkdir(metrics)
    g = Golden(str(tmp_path), lambda *_, **__: "", 2)
    g.configure(textfile=os.path.join(metrics, "gpuagent.prom"))
    g.start()
    try:
        yield g
    finally:
        g.close()


def named(status: str) -> list[str]:
    """The publisher's kinds a status line names."""
    trouble = status.partition("; agent ")[2]
    return [k for k in KINDS if k in trouble]


def status(g: Golden) -> str:
    """The STATUS systemd has now: the last one sent (a STATUS is sent when it changes)."""
    sent: list[str] = [m for step in g.steps for m in step["notify"] if "STATUS=" in m]
    return sent[-1].partition("STATUS=")[2]


def said(g: Golden) -> tuple[list[str], list[str], list[str]]:
    """The publisher's kinds the state file, the textfile and STATUS name now."""
    with open(g.state_file, encoding="utf-8") as f:
        st = json.load(f)
    with open(g.textfile, encoding="utf-8") as f:
        metrics = [line for line in f.read().splitlines() if line.startswith(PROBLEM)]
    on_disk = [k for k in st["problems"] if k in KINDS]
    assert named(st["status"]) == on_disk  # the file's status line says its problems
    return (
        on_disk,
        [line[len(PROBLEM) :].partition('"')[0] for line in metrics],
        named(status(g)),
    )


# (faults of the tick, what the state file, the textfile and STATUS name after it; STATUS as
# the tick's report says, once the report is written): a write
# that fails is said by the outputs of the next tick; the tick it works again still says it
# (that tick's report was built before), the state file excepted.
EPISODES: dict[str, list[tuple[dict[str, Any], tuple[list[str], list[str], list[str]]]]] = {
    "state file": [
        ({}, ([], [], [])),
        ({"state": True}, ([], [], [])),  # the file is the tick before's
        ({"state": True}, ([], ["state_file"], ["state_file"])),
        ({}, ([], ["state_file"], ["state_file"])),
        ({}, ([], [], [])),
    ],
    "textfile": [
        ({}, ([], [], [])),
        ({"textfile": True}, ([], [], [])),  # the file is the tick before's
        ({"textfile": True}, (["textfile"], [], ["textfile"])),
        ({}, (["textfile"], ["textfile"], ["textfile"])),
        ({}, ([], [], [])),
    ],
    "a bug in publishing": [
        ({}, ([], [], [])),
        ({"bug": True}, ([], [], [])),  # the state file is written before the metrics
        ({"bug": True}, (["internal_publish"], [], [])),  # no STATUS while it holds
        # It ended: the state file is written again without it.
        ({}, ([], ["internal_publish"], ["internal_publish"])),
        ({}, ([], [], [])),
    ],
    "the bug ends as the textfile starts failing": [
        ({}, ([], [], [])),
        ({"bug": True}, ([], [], [])),
        ({"bug": True}, (["internal_publish"], [], [])),  # no STATUS while it holds
        # Written again at the bug's end with the trouble as it is then.
        ({"textfile": True}, (["textfile"], [], ["internal_publish"])),
        ({}, (["textfile"], ["textfile"], ["textfile"])),
        ({}, ([], [], [])),
    ],
}


@pytest.mark.parametrize("episode", list(EPISODES))
def test_each_tick_says_what_the_tick_before_could_not_write(
    g: Golden, monkeypatch: pytest.MonkeyPatch, episode: str
) -> None:
    faults = Faults(monkeypatch)
    for i, (fault, expected) in enumerate(EPISODES[episode], 1):
        faults.set(**fault)
        g.step(f"tick {i}")
        assert said(g) == expected, f"tick {i}"


def test_the_textfile_gets_the_reports_one_state(
    g: Golden, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert g.daemon is not None
    handed: list[State] = []
    textfile = g.daemon.publisher.textfile
    real = textfile.write

    def write(st: State) -> None:
        handed.append(st)
        real(st)

    monkeypatch.setattr(textfile, "write", write)
    g.step("tick")
    assert g.daemon.report is not None
    assert handed == [g.daemon.report.state] and handed[0] is g.daemon.report.state


def test_a_state_file_written_never_says_it_could_not_be(
    g: Golden, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = Faults(monkeypatch)
    g.step("a tick")
    faults.set(bug=True)
    g.step("a bug")
    g.step("the bug again")
    # The bug ends; the first write fails, the one after the bug's end works.
    faults.set(state="first")
    g.step("the first write fails")
    assert said(g) == ([], ["internal_publish"], ["internal_publish"])
    faults.set(state=True)
    g.step("every write fails")
    faults.set()
    g.finish("ticks")  # its own write works
    with open(g.state_file, encoding="utf-8") as f:
        st = json.load(f)
    assert st["exit"]["reason"] == "ticks"
    assert (st["problems"], st["status"]) == ({}, "2 GPUs, sampling")


def built(trouble: dict[str, str], published: dict[str, str] | None) -> report.Report:
    """A report of a healthy one-GPU host with the agent's own ``trouble`` and the
    publisher's ``published``."""
    return report.build(
        report.Origin(1, "v", 1, 0.0, 10.0),
        now=5.0,
        ticks=3,
        bus=BusView((states.nvidia(),), frozenset({states.SLOT}), (), True),
        probe=ProbeView(state=ProbeState.OK, last_success_at=5.0),
        samples=SamplesView({states.SLOT: states.sample(at=5.0)}, frozenset({states.SLOT}), ()),
        kernel=states.NO_KERNEL,
        nvlink=NvlinkView({}),
        services=ServicesView({}),
        problems={},
        trouble=trouble,
        published=published,
    )


def test_the_state_file_gets_the_state_without_its_own_trouble() -> None:
    r = built({"journal": "j"}, {"state_file": "s", "internal_publish": "i"})
    assert r.status == "1 GPU, sampling; agent problems: internal_publish, journal, state_file"
    assert r.state["problems"] == {"internal_publish": "i", "journal": "j", "state_file": "s"}
    on_disk = report.stored(r)
    assert on_disk["problems"] == {"internal_publish": "i", "journal": "j"}
    assert on_disk["status"] == "1 GPU, sampling; agent problems: internal_publish, journal"
    # The publisher's trouble as it is now, in place of what the report was built with.
    fresh = report.stored(r, {"textfile": "t", "state_file": "s"})
    assert fresh["problems"] == {"journal": "j", "textfile": "t"}
    assert fresh["status"] == "1 GPU, sampling; agent problems: journal, textfile"
    assert list(r.state["problems"]) == ["internal_publish", "journal", "state_file"]
    # Nothing of the publisher's to leave out: the state itself, as the textfile gets it.
    plain = built({"journal": "j"}, None)
    assert report.stored(plain) is plain.state
    ended = report.finished(r, "signal", 9.0, {})
    assert (ended["problems"], ended["exit"]) == ({"journal": "j"}, {"reason": "signal", "at": 9.0})


def test_a_reports_state_refuses_every_change_at_every_depth() -> None:
    st = states.state()
    gpu = st["gpus"][0]
    changes: list[Callable[[], object]] = [
        lambda: st.update({"ticks": 1}),
        lambda: st.__setitem__("ticks", 1),
        lambda: gpu.pop("cleared", None),
        lambda: st["problems"].setdefault("x", "y"),
        lambda: st["services"].__delitem__("x"),
        lambda: st["gpus"].append(gpu),
        lambda: st["gpus"].sort(key=id),
        lambda: gpu["fields"].__setitem__("name", "forged"),
        gpu["problems"].clear,
        lambda: st["pci"].__iadd__([]),
    ]
    for change in changes:
        with pytest.raises(TypeError, match="does not change"):
            change()
    # Still a dict and lists to the JSON writer and to ==, and a copy is a plain dict.
    assert json.loads(json.dumps(st)) == st
    copy = {**st, "ticks": 1}
    assert copy["ticks"] == 1 and st["ticks"] == 360


def _containers(
    value: object, where: str = "state"
) -> Iterator[tuple[str, dict[Any, Any] | list[Any]]]:
    """Every dict and list in ``value``, with where it is."""
    if isinstance(value, dict):
        yield where, value
        for k, v in value.items():
            yield from _containers(v, f"{where}[{k!r}]")
    elif isinstance(value, list):
        yield where, value
        for i, v in enumerate(value):
            yield from _containers(v, f"{where}[{i}]")


def test_every_container_of_a_full_state_is_read_only() -> None:
    # A state with every optional key: each container is made read-only as it is built, so
    # one added without it shows here.
    other = "0000:2a:00.0"
    kernel = KernelView(
        {(states.SLOT, 79): XidCount(79, 2, states.NOW, states.NOW, lookup(79), "m")},
        {("nvswitch0", 12028): SXidCount(12028, 1, states.NOW, states.NOW)},
        {states.SLOT: "GPU-1"},
        {other: Clear(other, "xid", "root", states.NOW)},
    )
    fabric = Finding("fabric", "critical", "restart_service", "m", (("cause", "fm"),), unit="u")
    unit = UnitView("loaded", "active", "running", "success", 0)
    st = states.state(
        bus=(states.nvidia(), states.nvidia(other)),
        kernel=kernel,
        problems={
            "": [Problem("", fabric, states.NOW)],
            states.SLOT: [states.problem("xid", "critical", "reboot")],
        },
        trouble={"journal": "j"},
        nvlink=NvlinkView({states.SLOT: NvlinkGpu(18, (3,), {0: {"Replay Errors": 1}})}),
        services=ServicesView({"nvidia-fabricmanager.service": unit}),
        processes=ProcessesView(
            {states.SLOT: (ProcessView(1, "python3", 5, "u", "service", "r"),)}
        ),
    )
    found = list(_containers(st))
    assert {"nvlink", "processes", "xids"} <= set(st["gpus"][0]) and "cleared" in st["gpus"][1]
    assert st["sxids"] and st["host_problems"] and st["services"] and len(found) > 30
    for where, container in found:
        with pytest.raises(TypeError, match="does not change"):
            container.clear()
            pytest.fail(f"{where} can be changed")
