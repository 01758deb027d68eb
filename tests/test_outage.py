"""gpuagent.sources.probe.outage: the probe's own host problems, for every probe state and
failure class (the writer decides; status only reads them)."""

from __future__ import annotations

import pytest

from gpuagent.health import CRITICAL, WARNING
from gpuagent.logs import Event
from gpuagent.schema import ProbeState
from gpuagent.sources.probe.outage import DRIVERS, outage
from gpuagent.views import Failure, Gate, ProbeView


def kinds(view: ProbeView, after: int = 3) -> list[tuple[str, str, str]]:
    return [(f.kind, f.severity, f.action) for f in outage(view, after)]


@pytest.mark.parametrize("failure", [f for f in Failure if f not in DRIVERS])
def test_every_failure_class_but_the_driver_s_is_smi_failing(failure: Failure) -> None:
    view = ProbeView(
        state=ProbeState.FAILING, failure=failure, failures=3, last_error="exit 9: no driver"
    )
    (f,) = outage(view, 3)
    # Critical only where nvidia-smi says a GPU is lost: any other class may be the agent's
    # own trouble (its sandbox), which never drains (issue 39).
    severity = CRITICAL if failure is Failure.GPU_LOST else WARNING
    assert (f.kind, f.severity, f.action) == ("smi_failing", severity, "check_host")
    assert f.message.startswith(f"nvidia-smi failing ({failure.value}): exit 9: no driver; ")
    assert f.ends == "when nvidia-smi answers again"
    # Told by the probe's "nvidia-smi failing" line (its class's MESSAGE_ID), not the verdict.
    assert f.told
    assert Event.failing(failure.value).name == f"FAILING_{failure.name}"


@pytest.mark.parametrize("failure", sorted(DRIVERS))
def test_a_timeout_and_exit_18_are_the_driver_s_problems(failure: Failure) -> None:
    assert kinds(ProbeView(state=ProbeState.FAILING, failure=failure, failures=9)) == []


def test_a_blip_before_the_outage_is_none() -> None:
    view = ProbeView(state=ProbeState.FAILING, failure=Failure.UNPARSEABLE, failures=2)
    assert kinds(view) == []
    assert [k for k, _, _ in kinds(view, after=2)] == ["smi_failing"]


def test_nvidia_smi_missing_is_a_warning() -> None:
    (f,) = outage(ProbeView(state=ProbeState.GATED, gate=Gate.NVIDIA_SMI_MISSING))
    assert (f.kind, f.severity, f.action) == ("nvidia_smi_missing", WARNING, "check_host")
    assert f.ends == "when nvidia-smi is found"
    assert f.told  # by the gate's "nvidia-smi not found" (5db6b6b5…)
    assert Event.NVIDIA_SMI_MISSING.value == "5db6b6b58a7b4b4a8fe49e8609753bea"


@pytest.mark.parametrize(
    "view",
    [
        ProbeView(state=ProbeState.OK),
        ProbeView(state=ProbeState.IDLE, gate=Gate.NO_GPU),
        ProbeView(state=ProbeState.GATED, gate=Gate.DRIVER_NOT_LOADED),  # no_driver_module's
        ProbeView(state=ProbeState.STUCK, failure=Failure.TIMEOUT),  # driver_hung's
    ],
    ids=["ok", "idle", "gated driver", "stuck"],
)
def test_the_other_states_have_none_of_their_own(view: ProbeView) -> None:
    assert kinds(view) == []
