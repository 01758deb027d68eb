"""nvidia-smi's loop output cut into samples, and the signs of a driver change (pure)."""

from __future__ import annotations

from gpuagent.sources.probe.blocks import Blocks
from gpuagent.sources.probe.driverwatch import DriverSigns, DriverWatch

A, B, C = "0, 00000000:18:00.0, 1", "1, 00000000:2A:00.0, 2", "2, 00000000:3B:00.0, 3"
LOST_B = "Unable to determine the device handle for GPU 0000:2A:00.0: GPU is lost"


def test_a_sample_completes_at_its_count_and_a_repeat_starts_the_next() -> None:
    blocks = Blocks(1, 2)
    assert blocks.feed([A]) == []
    assert blocks.feed([B, A]) == [[A, B]]
    assert blocks.pending == (A,)
    # A GPU gone from the output: the sample completes when the next begins, and the next
    # at the new count.
    assert blocks.feed([A]) == [[A], [A]]
    assert blocks.expected == 1


def test_an_error_line_counts_as_its_gpu_and_a_gpu_more_is_taken_next_time() -> None:
    blocks = Blocks(1, 2)
    assert blocks.feed([A, LOST_B]) == [[A, LOST_B]]
    assert blocks.feed([A, B, C]) == [[A, B]]  # C: one GPU more, dropped this once
    assert blocks.feed([A, B, C]) == [[A, B, C]]


def test_a_warning_stays_in_its_sample_and_garbage_ends_it() -> None:
    blocks = Blocks(1, 2)
    assert blocks.feed(["WARNING: infoROM is corrupted at gpu 0000:18:00.0", A, B]) == [
        ["WARNING: infoROM is corrupted at gpu 0000:18:00.0", A, B]
    ]
    assert blocks.feed([A, "garbage"]) == [[A, "garbage"]]


def test_the_driver_signs() -> None:
    watch = DriverWatch()
    up = DriverSigns("active", "590.48.01", "590.48.01", frozenset({"nvidia_uvm"}))
    assert watch.why(up) is None
    assert watch.why(DriverSigns("deactivating", "590.48.01", "590.48.01", up.holders)) == (
        "nvidia-persistenced is deactivating"
    )
    assert watch.why(up) is None
    assert watch.why(DriverSigns("active", "590.48.01", "595.84", up.holders)) == (
        "driver 595.84 is installed, 590.48.01 loaded"
    )
    assert watch.why(DriverSigns("active", "590.48.01", "590.48.01")) == (
        "nvidia_uvm unloaded from the nvidia module"
    )
    assert watch.why(DriverSigns(module_loaded=False)) == "the nvidia module is not loaded"
    # Loaded afresh: the holders start over; persistenced never seen running says nothing.
    fresh = DriverWatch()
    assert fresh.why(DriverSigns("inactive", "590.48.01", "590.48.01")) is None
    assert fresh.why(DriverSigns(going=True)) == "the nvidia module is being unloaded"
