"""Golden outputs of every surface over twelve scripted scenarios (see :mod:`tests.golden`).

Each scenario is a function of a :class:`~tests.golden.Golden`: it changes the fake host, the
config file and the journal between named steps.  ``GPUAGENT_GOLDEN_RECORD=1 ./scripts/test
tests/test_golden.py`` records them again; only do that for a change of output that is meant.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import pytest

from tests import fakesysfs, replay, test_kernlog
from tests import sick as demo
from tests.fakehost import FAKE_SMI
from tests.golden import DATA, Golden, check
from tests.test_kernlog import append, corpus_text, export

make = test_kernlog.make

Scenario = Callable[[Golden], None]
# name -> (the scenario, how many GPUs its host has)
SCENARIOS: dict[str, tuple[Scenario, int]] = {}


def scenario(gpus: int) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[fn.__name__] = (fn, gpus)
        return fn

    return register


def ticks(g: Golden, what: str, n: int) -> None:
    for i in range(1, n + 1):
        g.step(f"{what}, tick {i}")


@scenario(gpus=8)
def healthy(g: Golden) -> None:
    """Eight healthy H200s for four ticks."""
    g.start()
    ticks(g, "healthy", 4)
    g.finish("ticks")


@scenario(gpus=2)
def failing(g: Golden) -> None:
    """nvidia-smi fails (driver/library version mismatch): every tick for 3 failures, then
    every 2, 4, 8 ticks (retry_max 80 s caps the gap at 8); then it answers again."""
    g.configure(retry_max=80)
    g.start()
    ticks(g, "healthy", 1)
    g.host.failing()
    ticks(g, "failing", 20)
    g.host.healthy()
    ticks(g, "fixed", 6)
    g.finish("ticks")


@scenario(gpus=2)
def driver_gated(g: Golden) -> None:
    """The nvidia module is unloaded (no probe), then loaded again."""
    g.start()
    ticks(g, "loaded", 1)
    fakesysfs.set_module(g.host.root, False)
    ticks(g, "unloaded", 3)
    fakesysfs.set_module(g.host.root, True)
    ticks(g, "loaded again", 2)
    g.finish("ticks")


@scenario(gpus=2)
def smi_missing(g: Golden) -> None:
    """The configured nvidia-smi does not exist at start, then is installed."""
    os.unlink(g.host.smi)
    g.start()
    ticks(g, "missing", 3)
    os.symlink(FAKE_SMI, g.host.smi)
    ticks(g, "installed", 2)
    g.finish("ticks")


LOST = "0000:07:00.0"  # the slot the captured error line names


def _plug(g: Golden, slot: str) -> None:
    """Put an H200 bound to nvidia in ``slot``."""
    nvidia, h200, cls = fakesysfs.NVIDIA, fakesysfs.H200, fakesysfs.CLASS_3D
    fakesysfs.add_device(g.host.root, slot, nvidia, h200, cls, "nvidia")


@scenario(gpus=2)
def gpu_lost(g: Golden) -> None:
    """A third GPU that nvidia-smi prints an error line for (exit 255) beside the others'
    rows, then answers for again."""
    _plug(g, LOST)
    every = [LOST, *g.host.slots]
    g.host.healthy(slots=every)
    g.start()
    ticks(g, "answered", 1)
    g.host.healthy(prepend="device-handle-unknown-error-no-space-synology.txt", exit=255)
    ticks(g, "lost", 3)
    g.host.healthy(slots=every)
    ticks(g, "answered again", 2)
    g.finish("ticks")


@scenario(gpus=2)
def gone_from_bus(g: Golden) -> None:
    """A GPU disappears from the PCI bus (and from nvidia-smi), then comes back; with
    expected_gpus 2, the host's gpu_count names it."""
    gone, other = g.host.slots
    g.configure(expected_gpus=2)
    g.start()
    ticks(g, "both", 1)
    fakesysfs.remove_device(g.host.root, gone)
    g.host.healthy(slots=[other])
    ticks(g, "gone", 3)
    _plug(g, gone)
    g.host.healthy()
    ticks(g, "back", 2)
    g.finish("ticks")


def _xid(slot: str, code: int, text: str) -> str:
    return f"NVRM: Xid (PCI:{slot[:-2]}): {code}, {text}\n"


RECOVERY = "GPU recovery action changed from {} to {}"
RESET = "0x1 (GPU Reset Required)"


@scenario(gpus=4)
def xids(g: Golden) -> None:
    """Kernel records in a real journal: Xid 79 (fallen off the bus, with the GPU's UUID
    line), an application Xid 13, an SXid, Xid 154 asking for a reset and a line any user
    could log; appended while the agent runs: Xid 154 back to 0x0 (None) and Xid 31."""
    fell, app, recovery, late = g.host.slots
    text = (
        # The capture's placeholder UUID: the one the fake nvidia-smi gives the GPU in the slot.
        corpus_text("xid-79-driver535-pid-unknown-crashdump")
        .replace("0000:a1:00", fell[:-2])
        .replace("GPU-11111111-2222-3333-4444-555555555555", replay.gpu_uuid(fell))
        + corpus_text("xid-13-driver535-a800-pid-unknown").replace("0000:43:00", app[:-2])
        + corpus_text("sxid-22013-driver570-open-nvswitch")
        + _xid(recovery, 154, RECOVERY.format("0x0 (None)", RESET))
        + "#@transport stdout\n#@identifier evil\n"
        + _xid(late, 48, "pid=1, DBE")
    )
    journal = g.make(text, "kernel")
    g.configure(journal_directory=journal)
    g.start()
    ticks(g, "journal read", 2)
    more = _xid(recovery, 154, RECOVERY.format(RESET, "0x0 (None)")) + _xid(
        late, 31, "pid=4242, name=python3, channel 0x00000019, intr 10000000. MMU Fault"
    )
    append(journal, export(g.make(more, "appended")))
    ticks(g, "records appended", 2)
    g.finish("ticks")


@scenario(gpus=8)
def sick(g: Golden) -> None:
    """What ``scripts/demo --sick`` shows a newcomer (tests/sick.py, the same fixtures): a
    critical Xid 119 on one GPU, one reading [GPU requires reset], one gone from the bus."""
    slots = g.host.slots
    journal = g.make("\n".join(demo.xid_messages(slots[demo.XID])) + "\n", "kernel")
    g.configure(journal_directory=journal)
    g.host.healthy(override=demo.reset_cells(slots[demo.NEEDS_RESET]))
    g.start()
    ticks(g, "sick", 1)
    fakesysfs.remove_device(g.host.root, slots[demo.GONE])
    g.host.healthy(slots=slots[: demo.GONE], override=demo.reset_cells(slots[demo.NEEDS_RESET]))
    ticks(g, "one gone", 1)
    g.finish("ticks")


@scenario(gpus=2)
def journal_unreadable(g: Golden) -> None:
    """journal_directory does not exist, then is an empty directory, then holds a journal
    (with an application Xid)."""
    missing = os.path.join(g.dir, "no-journal")
    g.configure(journal_directory=missing)
    g.start()
    ticks(g, "no directory", 2)
    os.mkdir(missing)
    ticks(g, "empty directory", 2)
    made = g.make(_xid(g.host.slots[1], 13, "pid=1, name=x, Graphics Exception"), "late")
    os.rename(os.path.join(made, "x.journal"), os.path.join(missing, "x.journal"))
    ticks(g, "journal there", 2)
    g.finish("ticks")


@scenario(gpus=2)
def state_unwritable(g: Golden) -> None:
    """The state file's directory is missing at start (no lock either), then made; then it
    is a regular file; then a directory again.  (Root writes anywhere: chmod would not do.)"""
    run = os.path.join(g.dir, "run")
    g.configure(state_file=os.path.join(run, "state.json"))
    g.start()
    ticks(g, "no directory", 2)
    os.mkdir(run)
    ticks(g, "directory made", 2)
    shutil.rmtree(run)
    with open(run, "w") as f:
        f.write("")
    ticks(g, "a file in its place", 2)
    os.unlink(run)
    os.mkdir(run)
    ticks(g, "a directory again", 2)
    g.finish("ticks")


@scenario(gpus=2)
def reload(g: Golden) -> None:
    """SIGHUP: a good change (interval 20 s, expected_gpus 3: a gpu_count problem) probes at
    once; a bad file within the interval is refused, the old config kept, and probes on the
    next tick; a later good one (expected_gpus 2) clears the problem."""
    g.start()
    ticks(g, "before", 2)
    g.advance(3)
    g.reload("reload: interval 20, expected_gpus 3", interval=20, expected_gpus=3)
    g.step("ticked at once", at_once=True)
    g.advance(5)
    g.reload("reload: interval -1 (refused)", interval=-1)
    ticks(g, "after the refused reload", 2)
    g.advance(20)
    g.reload("reload: interval 20, expected_gpus 2", interval=20, expected_gpus=2)
    g.step("ticked at once again", at_once=True)
    ticks(g, "after", 1)
    g.finish("ticks")


@scenario(gpus=2)
def finish_on_signal(g: Golden) -> None:
    """A second agent on the same state file is refused (exit 75) and touches nothing; the
    first stops on SIGTERM: STOPPING=1, the textfile removed, the final state with exit."""
    g.start()
    ticks(g, "running", 2)
    second = g.new_daemon()
    g.record("a second agent starts", returned=second.start(install_signals=False))
    g.finish("signal")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_golden(name: str, tmp_path: Any, make: Any) -> None:
    play, gpus = SCENARIOS[name]
    g = Golden(str(tmp_path), make, gpus)
    try:
        play(g)
    finally:
        g.close()
    check(name, play.__doc__ or "", g.steps)


def test_every_scenario_is_recorded_and_every_recording_a_scenario() -> None:
    assert sorted(f[: -len(".json")] for f in os.listdir(DATA)) == sorted(SCENARIOS)
