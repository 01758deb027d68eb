"""wrong_driver and no_driver_module under systemd: the packaged service (Debian 12 and 13) on
a fake host whose GPU nouveau took and whose nvidia module is not loaded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuagent.logs import Event
from tests import fakesysfs
from tests.system.test_deb import (  # noqa: F401 - container and deb are fixtures
    FAKE,
    FAKE_CONFIG,
    Container,
    container,
    deb,
    fake_gpu_host,
    install,
    one,
    wait_for,
)

pytestmark = pytest.mark.system


def test_driver_problems_under_systemd(deb: str, container: Container) -> None:  # noqa: F811
    c = container
    slots = fakesysfs.gpu_slots(8)
    taken = slots[1]
    try:
        install(c, deb)
        fake_gpu_host(c)
        # mattshma/bigdata#133's state: nouveau holds a GPU and the nvidia module is absent.
        make = (
            f"from tests import fakesysfs; fakesysfs.bind('{FAKE}/sys', '{taken}', 'nouveau'); "
            f"fakesysfs.set_module('{FAKE}/sys', False)"
        )
        c.run("env", f"PYTHONPATH={FAKE}", "python3", "-c", make)
        # The running agent sees nouveau first: the one error line.
        wait_for("wrong_driver", lambda: c.events(Event.problem("wrong_driver")), 30)
        c.write(f"{FAKE}/gpuagent.toml", FAKE_CONFIG + "driver_absent_grace = 2\n")
        c.run("systemctl", "restart", "gpuagent")

        def restated() -> list[dict[str, Any]]:
            return [e for e in c.events(Event.STILL_HOLDS) if e.get("PROBLEM") == "wrong_driver"]

        # The restarted agent restates it at info (no new start), from problems.json.
        still = one(wait_for("wrong_driver restated", restated, 30), "wrong_driver restated")
        assert (still["PRIORITY"], still["PCI_SLOT"], still["ACTION"]) == ("6", taken, "check_host")
        assert still["MESSAGE"].endswith(", seen before the restart")

        def critical() -> list[dict[str, Any]]:
            # A warning within driver_absent_grace, then restated critical once it is over.
            absent = c.events(Event.problem("no_driver_module"))
            return [e for e in absent if e.get("PRIORITY") == "3"]

        wait_for("no_driver_module critical", critical, 30)
        wrong = one(c.events(Event.problem("wrong_driver")), "wrong_driver")
        assert (wrong["PRIORITY"], wrong["PCI_SLOT"], wrong["ACTION"]) == ("3", taken, "check_host")
        assert "bound to nouveau, not nvidia: blacklist nouveau" in wrong["MESSAGE"]
        absent = one(critical(), "no_driver_module")
        assert (absent["PRIORITY"], absent["ACTION"]) == ("3", "check_host")
        assert absent["MESSAGE"].startswith("host: critical no_driver_module: ")
        status = c.status()
        assert status.returncode == 2, status.stdout + status.stderr
        assert "wrong_driver" in status.stdout and "no_driver_module" in status.stdout
        as_json = c.status("--json")
        assert (as_json.returncode, as_json.stderr) == (2, "")
        st = json.loads(as_json.stdout)
        assert [p["kind"] for p in st["host_problems"]] == ["no_driver_module"]
        entry = next(g for g in st["gpus"] if g["pci_slot"] == taken)
        assert [p["kind"] for p in entry["problems"]] == ["wrong_driver"]
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}")
        raise
