"""gpuagent.sources.driver.hangs: a hung driver at once when stuck, a slow nvidia-smi (a
warning, never more) when it times out, ended by three normal answers in a row."""

from __future__ import annotations

from gpuagent.health import CRITICAL, WARNING
from gpuagent.logs import Event
from gpuagent.sources.driver.hangs import GOOD_PROBES, ProbeHangs
from gpuagent.sources.kernel import clears

ENDS = "once nvidia-smi has answered normally 3 probes in a row, or the nvidia module is unloaded"


def test_a_child_that_outlives_sigkill_is_a_hung_driver_at_once() -> None:
    # NVIDIA/nvidia-docker#377: "an unkillable nvidia-smi means the driver is hung"; the stuck
    # child blocks every later probe, so no count of timeouts would ever come.
    hangs = ProbeHangs(after=300.0)
    hangs.observe(0.0, module_loaded=True, stuck=True)
    f = hangs.finding(0.0)
    assert f is not None
    assert (f.kind, f.severity, f.action) == ("driver_hung", CRITICAL, "reboot")
    assert f.message.startswith("nvidia-smi did not exit after SIGKILL (stuck in the driver)")
    assert Event.problem(f.kind).name == "PROBLEM_DRIVER_HUNG"
    # Its ending is said once, by the ends field, never in the message too.
    assert f.ends == ENDS
    assert "answered" not in f.message
    assert clears.ending("", f.kind, f.ends) == (f"ends by itself {ENDS}", False)


def test_timeouts_alone_are_a_warning_whatever_they_last() -> None:
    # Timeouts are no evidence about the driver (issue 39): never a critical, never a drain.
    hangs = ProbeHangs(after=300.0)
    hangs.observe(0.0, module_loaded=True, timed_out=True)
    f = hangs.finding(0.0)
    assert f is not None
    assert (f.kind, f.severity, f.action) == ("smi_timeout", WARNING, "check_host")
    assert f.message.startswith(
        "nvidia-smi timed out once with the nvidia module loaded; the GPUs are not read; "
        "run `time nvidia-smi` by hand"
    )
    assert Event.problem(f.kind).name == "PROBLEM_SMI_TIMEOUT"
    hangs.observe(30.0, module_loaded=True, answered=True)
    hangs.observe(60.0, module_loaded=True, timed_out=True)
    assert hangs.finding(299.0).severity == WARNING  # type: ignore[union-attr]
    f = hangs.finding(3000.0)
    assert f is not None and (f.kind, f.severity) == ("smi_timeout", WARNING)
    assert f.message.startswith(
        "nvidia-smi timed out 2 times with the nvidia module loaded, for 300 s and more; "
    )


def test_what_explains_the_timeouts_is_said_with_its_action() -> None:
    hangs = ProbeHangs(after=300.0)
    hangs.observe(0.0, module_loaded=True, timed_out=True)
    f = hangs.finding(0.0, ("nvidia-persistenced is not running", "restart_service"))
    assert f is not None and (f.severity, f.action) == (WARNING, "restart_service")
    assert f.message.endswith("; the GPUs are not read; nvidia-persistenced is not running")


def test_three_normal_answers_in_a_row_end_it() -> None:
    hangs = ProbeHangs(after=300.0)
    hangs.observe(0.0, module_loaded=True, stuck=True)
    for t in range(1, GOOD_PROBES):
        hangs.observe(float(t), module_loaded=True, answered=True)
        assert hangs.finding(float(t)) is not None
    hangs.observe(8.0, module_loaded=True)  # no probe this tick: the row holds
    hangs.observe(9.0, module_loaded=True, failed=True)  # another failure breaks it
    for t in range(10, 10 + GOOD_PROBES - 1):
        hangs.observe(float(t), module_loaded=True, answered=True)
    assert hangs.finding(20.0) is not None
    hangs.observe(21.0, module_loaded=True, answered=True)
    assert hangs.finding(21.0) is None
    # A new episode starts over: a warning again.
    hangs.observe(22.0, module_loaded=True, timed_out=True)
    assert hangs.finding(22.0).severity == WARNING  # type: ignore[union-attr]


def test_a_critical_hang_stays_critical_until_it_ends() -> None:
    hangs = ProbeHangs(after=10.0)
    hangs.observe(0.0, module_loaded=True, stuck=True)
    hangs.observe(1.0, module_loaded=True, answered=True)  # the thaw: a first answer
    assert hangs.finding(1.0).severity == CRITICAL  # type: ignore[union-attr]


def test_an_unloaded_module_ends_it_and_timeouts_without_it_do_not_count() -> None:
    hangs = ProbeHangs(after=0.0)
    for t in (0.0, 10.0, 20.0):
        hangs.observe(t, module_loaded=False, timed_out=True)
    assert hangs.finding(20.0) is None
    hangs.observe(30.0, module_loaded=True, stuck=True)
    assert hangs.finding(30.0) is not None
    hangs.observe(60.0, module_loaded=False)  # unloaded: a new driver
    assert hangs.finding(60.0) is None


def test_answers_without_a_hang_are_nothing() -> None:
    hangs = ProbeHangs()
    for t in range(5):
        hangs.observe(float(t), module_loaded=True, answered=True)
    assert hangs.finding(5.0) is None
