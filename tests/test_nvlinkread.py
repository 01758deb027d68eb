"""gpuagent.sources.nvlink.nvlinkread: the NVLink reads' cadence, spawns, failures and warnings,
with the fake nvidia-smi answering from the corpus's nvlink captures and the probe's Runner."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuagent.edges.cadence import Cadence
from gpuagent.edges.runner import Runner
from gpuagent.sources.nvlink.nvlink import GpuState
from gpuagent.sources.nvlink.nvlinkread import Reader
from tests import fakehost, fakesysfs
from tests.fakehost import FakeHost

H200 = "nvlink-status-h200-driver590.48.01-18-links.txt"
L40S = "nvlink-status-l40s-driver595.80-device-does-not-support-nvlink.txt"
COUNTERS = "nvlink-errorcounters-h100-80gb-hbm3-driverUNKNOWN-placeholder-uuid-TRIMMED.txt"
MIG = "nvlink-not-supported-in-MIG-mode-exit0.txt"
B200_INACTIVE = "nvlink-status-b200-driverUNKNOWN-all-links-inactive-uuid-redacted.txt"


@pytest.fixture
def host(tmp_path: str) -> FakeHost:
    return fakehost.create(str(tmp_path), gpus=4)


def nvlink(host: FakeHost, **nv: Any) -> None:
    host.scenario(capture=fakehost.H200_LOAD, slots=host.slots, nvlink=nv)


def reader(host: FakeHost, every: int = 3, timeout: float = 5.0) -> Reader:
    """A reader every ``every`` ticks of 10 s, backing off after 3 failures, 4 reads at most."""
    runner = Runner(timeout=timeout, kill_grace=0.3)
    cadence = Cadence(10.0 * every, 10.0, 3, 40.0 * every)
    return Reader(runner, cadence=cadence, sysfs_root=host.root)


def calls(host: FakeHost) -> list[list[str]]:
    with open(host.calls_log, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_status_and_counters_every_n_ticks(host: FakeHost) -> None:
    nvlink(host, status=H200, errorcounters=COUNTERS)
    r = reader(host)
    first = r.tick(host.smi, host.slots)
    assert (first.ran, first.failure, first.spawns) == (True, "", 2)
    assert first.status is not None and first.counters is not None
    assert [g.active for g in first.status.gpus] == [18, 18, 18, 18]
    assert len(first.counters.gpus[0].counters) == 18
    assert [c[:2] for c in calls(host)] == [["nvlink", "--status"], ["nvlink", "--errorcounters"]]
    # Then nothing for two ticks, and the third reads again.
    assert [r.tick(host.smi, host.slots).ran for _ in range(5)] == [False, False, True] + [
        False
    ] * 2
    assert host.nvlink_spawns == 4


def test_a_host_without_nvlink_learns_it_with_one_spawn(host: FakeHost) -> None:
    nvlink(host, status=L40S)
    r = reader(host, every=1)
    first = r.tick(host.smi, host.slots)
    assert (first.no_nvlink, first.spawns, first.counters) == (True, 1, None)
    for _ in range(20):
        assert r.tick(host.smi, host.slots).no_nvlink
    assert host.nvlink_spawns == 1
    # Another set of GPUs (one hot-added) is asked once more.
    fakesysfs.add_device(host.root, "0000:e0:00.0", fakesysfs.NVIDIA, fakesysfs.H200, 0x030200)
    assert r.tick(host.smi, [*host.slots, "0000:e0:00.0"]).spawns == 1
    assert host.nvlink_spawns == 2


def test_an_older_driver_that_prints_nothing_has_no_nvlink(host: FakeHost) -> None:
    host.healthy()  # a step without "nvlink": empty output, exit 0
    r = reader(host, every=1)
    assert r.tick(host.smi, host.slots).no_nvlink
    r.tick(host.smi, host.slots)
    assert host.nvlink_spawns == 1


def test_mig_mode_is_not_no_nvlink(host: FakeHost) -> None:
    nvlink(host, status=MIG, errorcounters=COUNTERS)
    r = reader(host, every=1)
    read = r.tick(host.smi, host.slots)
    assert read.status is not None
    assert (read.no_nvlink, read.counters, read.spawns) == (False, None, 1)
    assert read.status.gpus[0].state is GpuState.MIG
    r.tick(host.smi, host.slots)
    assert host.nvlink_spawns == 2  # still watched


def test_a_line_it_cannot_read_is_one_warning_and_reads_go_on(host: FakeHost) -> None:
    # The only counters capture is trimmed by its author ("[...]"): as nvidia-smi printed it.
    host.scenario(nvlink={"status": H200, "errorcounters": COUNTERS})
    r = reader(host, every=1)
    first = r.tick(host.smi, host.slots)
    assert first.warnings == (
        "nvidia-smi nvlink --errorcounters: cannot read the line '[...]'; the rest is read",
    )
    assert first.counters is not None and first.counters.gpus[0].counters[17]["CRC Errors"] == 0
    assert r.tick(host.smi, host.slots).warnings == ()
    assert r.tick(host.smi, host.slots).counters is not None


def test_a_failing_read_backs_off_and_warns_once(host: FakeHost) -> None:
    host.failing()  # version mismatch, exit 18, for nvlink too
    r = reader(host, every=1)
    reads = [r.tick(host.smi, host.slots) for _ in range(12)]
    ran = [i for i, x in enumerate(reads) if x.ran]
    assert ran == [0, 1, 2, 4, 8]  # after 3 failures, gaps of 2 then 4 (the cap) reads
    assert [x.warn for x in reads if x.ran] == [False, False, True, False, False]
    assert reads[0].failure.startswith("nvidia-smi nvlink --status: exit 18: Failed to initialize")
    nvlink(host, status=H200, errorcounters=COUNTERS)
    back = [r.tick(host.smi, host.slots) for _ in range(3)]
    assert [(x.ran, x.recovered) for x in back] == [(True, True), (True, False), (True, False)]
    r.expedite()
    assert r.tick(host.smi, host.slots).ran


def test_a_hung_read_is_a_timeout(host: FakeHost) -> None:
    nvlink(host, hang=30)
    r = reader(host, every=1, timeout=0.5)
    read = r.tick(host.smi, host.slots)
    assert (read.failure, read.spawns) == ("nvidia-smi nvlink --status: no answer within 0.5 s", 1)


def test_nothing_runs_without_the_module_or_while_a_child_is_stuck(host: FakeHost) -> None:
    nvlink(host, status=MIG)
    r = reader(host, every=1)
    fakesysfs.set_module(host.root, False)
    assert r.tick(host.smi, host.slots).skipped == "module"
    fakesysfs.set_module(host.root, True)

    class Stuck:
        def poll(self) -> None:
            return None

    r.runner.stuck = Stuck()  # type: ignore[assignment]
    assert r.tick(host.smi, host.slots).skipped == "busy"
    r.runner.stuck = None
    assert r.tick(host.smi, host.slots).spawns == 1
    assert host.nvlink_spawns == 1


def test_no_binary_or_no_gpu_reads_nothing(host: FakeHost) -> None:
    r = reader(host, every=1)
    assert not r.tick(None, host.slots).ran
    assert not r.tick(host.smi, []).ran
    assert host.nvlink_spawns == 0


def test_the_same_answer_is_parsed_once_and_a_new_one_again(host: FakeHost) -> None:
    nvlink(host, status=H200, errorcounters=COUNTERS)
    r = reader(host, every=1)
    first, again = r.tick(host.smi, host.slots), r.tick(host.smi, host.slots)
    # A quiet host's answers, read after read: what the last one parsed to, as it was.
    assert first.status is not None and first.counters is not None
    assert again.status is first.status and again.counters is first.counters
    nvlink(host, status=B200_INACTIVE, errorcounters=COUNTERS)
    changed = r.tick(host.smi, host.slots)
    assert changed.status is not None and changed.status is not first.status
    assert [g.state for g in changed.status.gpus] == [GpuState.ALL_INACTIVE] * len(
        changed.status.gpus
    )
    assert host.nvlink_spawns == 5  # every read ran: only the parse is spared
