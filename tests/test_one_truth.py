"""One fact, one truth (issue 39): a host problem that other problems explain says so and is
not paged apart.

One GPU lost from the bus with ``expected_gpus`` set was two critical pages (its
``gone_from_bus``, the host's ``gpu_count``); the README promises one.
"""

from __future__ import annotations

import time

from gpuagent import metrics
from gpuagent.commands.statustext import render
from gpuagent.logs import Event
from tests.conftest import Host
from tests.test_known import unplug


def critical_series(text: str) -> list[str]:
    """The series GpuagentGpuProblemCritical pages on: a GPU's worst, a host's problem."""
    return [
        line
        for line in text.splitlines()
        if line.startswith(("gpuagent_gpu_worst_problem{", "gpuagent_host_problem{"))
        and 'severity="critical"' in line
    ]


def test_one_lost_gpu_is_one_page(host: Host) -> None:
    host.make_agent(expected_gpus=8)
    host.tick()
    sick = host.slots[3]
    unplug(host, sick)
    st = host.tick().state
    (count,) = st["host_problems"]
    assert (count["kind"], count["cause"]) == ("gpu_count", "gone_from_bus")
    (page,) = critical_series(metrics.render(st))
    assert f'pci_slot="{sick}"' in page and 'kind="gone_from_bus"' in page
    # One start line: the GPU's.
    assert len(host.events(Event.problem("gone_from_bus"))) == 1
    assert host.events(Event.problem("gpu_count")) == []
    shown = render(st, time.time(), 2, "", width=200)
    assert "cause: the GPUs' gone_from_bus" in shown


def test_a_shortfall_no_lost_gpu_explains_pages_on_its_own(host: Host) -> None:
    """Nine expected, eight ever seen: the ninth is no GPU this agent knows."""
    host.make_agent(expected_gpus=9)
    st = host.tick().state
    (count,) = st["host_problems"]
    assert "cause" not in count
    (page,) = critical_series(metrics.render(st))
    assert 'kind="gpu_count"' in page
    sick = host.slots[0]
    unplug(host, sick)
    st = host.tick().state
    (count,) = st["host_problems"]
    assert "cause" not in count  # one of the two missing is no known GPU's
    assert len(critical_series(metrics.render(st))) == 2
