"""IMEX where it applies (gpuagent.sources.services.nvservices.imex_findings): the daemon down
on a host that enabled it is a problem; installed but disabled, the package's default and
the Kubernetes way, says nothing (NVIDIA/aicr#2641, NVSentinel#1471, DCGM#308)."""

from __future__ import annotations

import logging

import pytest

from gpuagent.commands.statusrows import services_row
from gpuagent.health import CRITICAL
from gpuagent.logs import Event
from gpuagent.sources.services.nvservices import IMEX, UnitFacts, imex_findings
from tests.conftest import Host
from tests.fake_units import FakeUnits, unit
from tests.test_nvidia_scenarios import FM, PD


def facts(active: str, sub: str, file_state: str, load: str = "loaded") -> UnitFacts:
    return UnitFacts(
        IMEX, load, active, sub, "exit-code" if active == "failed" else "success", 0, file_state
    )


@pytest.mark.parametrize(
    ("unit_facts", "down"),
    [
        # aicr#2641: an idle GB300, IMEX installed, no ComputeDomain: disabled, not running;
        # DCGM#308 the same on the host: IMEX runs in the ComputeDomain's pods.
        (facts("inactive", "dead", "disabled"), False),
        # NVSentinel#1471: a single HGX box without the package at all.
        (facts("inactive", "dead", "", load="not-found"), False),
        (facts("inactive", "dead", "masked", load="masked"), False),
        (facts("active", "running", "enabled"), False),
        (facts("failed", "failed", "enabled"), True),
        (facts("inactive", "dead", "enabled"), True),
        (facts("activating", "auto-restart", "enabled-runtime"), True),
        (None, False),  # not known (no system bus)
    ],
)
def test_down_only_where_the_host_enabled_it(unit_facts: UnitFacts | None, down: bool) -> None:
    found = imex_findings(unit_facts)
    if not down:
        assert found == []
        return
    (f,) = found
    assert (f.kind, f.severity, f.action) == ("imex_down", CRITICAL, "restart_service")
    assert f.message.startswith(f"{IMEX} is ")
    assert f.ends == f"when {IMEX} runs again, or is disabled"


def test_an_idle_gb300_with_imex_installed_and_disabled_says_nothing(host: Host) -> None:
    """NVIDIA/aicr#2641 on the fake host: no problem, no line, exit 0; the status row shows
    the unit as it is."""
    units = FakeUnits()
    units.set(unit(FM), unit(PD), unit(IMEX, "inactive", "dead", file_state="disabled"))
    host.make_agent(units=units)
    st = host.tick(3).state
    assert st["host_problems"] == []
    assert all(not g["problems"] for g in st["gpus"])
    assert host.events(Event.PROBLEM_IMEX_DOWN) == []
    assert [r for r in host.logs.records if r.levelno >= logging.WARNING] == []
    assert services_row(st["services"]) == (
        "fabric manager active, persistenced active, imex inactive (dead)"
    )


def test_the_daemon_of_a_tray_that_uses_imex_stopping_is_one_line(host: Host) -> None:
    units = FakeUnits()
    units.set(unit(FM), unit(PD), unit(IMEX, file_state="enabled"))
    host.make_agent(units=units)
    assert host.tick(2).state["host_problems"] == []
    units.set(
        unit(FM),
        unit(PD),
        unit(IMEX, "failed", "failed", result="exit-code", file_state="enabled"),
    )
    st = host.tick(3).state
    assert [(p["kind"], p["severity"], p["action"]) for p in st["host_problems"]] == [
        ("imex_down", "critical", "restart_service")
    ]
    (line,) = host.events(Event.PROBLEM_IMEX_DOWN)
    assert line.levelno == logging.ERROR
    units.set(unit(FM), unit(PD), unit(IMEX, file_state="enabled"))
    assert host.tick(2).state["host_problems"] == []
    assert [r.getMessage() for r in host.events(Event.PROBLEM_CLEARED)] == [
        "host: imex_down cleared"
    ]


def test_a_host_without_imex_shows_no_imex() -> None:
    absent = {"load_state": "not-found", "active_state": "inactive", "sub_state": "dead"}
    running = {"load_state": "loaded", "active_state": "active", "sub_state": "running"}
    services = {
        "nvidia-fabricmanager.service": running,
        "nvidia-persistenced.service": running,
        IMEX: absent,
    }
    assert services_row(services) == "fabric manager active, persistenced active"
