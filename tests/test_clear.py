"""``gpuagent clear``: the entry root sends, read back by the agent in order with the kernel's
records from real journal files (make-test-journal, then entries appended as journald would)."""

from __future__ import annotations

import json
import logging
import os
import pwd
import time
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent.commands import clearcli, statustext
from gpuagent.commands.cli import main
from gpuagent.edges import safefile
from gpuagent.logs import Event
from gpuagent.schema import GpuEntry, State
from gpuagent.sources.driver.hangs import ProbeHangs
from gpuagent.sources.kernel import clears
from gpuagent.sources.kernel.earlier import EarlierBoots
from gpuagent.sources.kernel.journalboot import booted_at
from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.views import Clear, Problem
from tests import states
from tests.conftest import Host
from tests.fake_units import FakeUnits, unit
from tests.journalfeed import this_boot
from tests.test_kernel import FELL_OFF
from tests.test_kernlog import append, export_entry, make
from tests.test_nvidia_scenarios import FM, PD, nvswitch_host
from tests.test_status import write_state

__all__ = ["make"]  # the fixture

SLOT = "0000:18:00.0"
LATER = 1_700_001_000  # s: after every record make-test-journal writes


def entry(state: State, slot: str = SLOT) -> GpuEntry:
    return next(g for g in state["gpus"] if g["pci_slot"] == slot)


def clear_entry(
    uid: str,
    at: float,
    slot: str = SLOT,
    kind: str = "xid",
    by: str = "root",
    boot: str | None = None,
    login: str | None = None,
    sudo_user: str | None = None,
) -> bytes:
    """The entry `gpuagent clear` sends, as journald stores it from a sender of ``uid``
    (stamped with ``boot``, this machine's boot by default, and with the sender's ``login``
    uid where it has one: journald's ``_AUDIT_LOGINUID``); ``sudo_user`` the ``SUDO_USER`` it
    sends."""
    stamped = [("_AUDIT_LOGINUID", login.encode())] if login is not None else []
    sent = [("SUDO_USER", sudo_user.encode())] if sudo_user is not None else []
    return export_entry(
        [
            ("__REALTIME_TIMESTAMP", str(int(at * 1e6)).encode()),
            ("__MONOTONIC_TIMESTAMP", str(int((at - 1_699_990_000) * 1e6)).encode()),
            ("_BOOT_ID", (boot or this_boot()).encode()),
            ("_TRANSPORT", b"journal"),
            ("_UID", uid.encode()),
            *stamped,
            ("MESSAGE_ID", Event.OPERATOR_CLEAR.value.encode()),
            ("SYSLOG_IDENTIFIER", b"gpuagent"),
            ("PCI_SLOT", slot.encode()),
            ("KIND", kind.encode()),
            ("CLEARED_BY", by.encode()),
            *sent,
            ("MESSAGE", f"GPU {slot}: {kind} cleared by {by}".encode()),
        ]
    )


def xid_entry(at: float, code: int = 79) -> bytes:
    """An Xid record from the kernel, logged at ``at``."""
    return export_entry(
        [
            ("__REALTIME_TIMESTAMP", str(int(at * 1e6)).encode()),
            ("__MONOTONIC_TIMESTAMP", str(int((at - 1_699_990_000) * 1e6)).encode()),
            ("_BOOT_ID", this_boot().encode()),
            ("_TRANSPORT", b"kernel"),
            (
                "MESSAGE",
                f"NVRM: Xid (PCI:0000:18:00): {code}, pid=1, GPU has fallen off the bus.".encode(),
            ),
        ]
    )


def xid_problems(state: State) -> list[tuple[str, int]]:
    return [(p["kind"], p.get("xid", 0)) for p in entry(state)["problems"]]


def test_a_clear_from_root_ends_the_xid_and_survives_a_restart(host: Host, make: Any) -> None:
    journal = make(FELL_OFF)
    host.make_agent(journal_directory=journal)
    assert xid_problems(host.tick().state) == [("xid", 79)]
    append(journal, clear_entry("0", LATER))
    st = host.tick().state
    assert xid_problems(st) == []
    assert entry(st)["health"] == "ok"
    assert entry(st)["cleared"] == {"kind": "xid", "by": "root", "at": LATER}
    assert entry(st)["xids"][0]["count"] == 1  # the boot's counts are facts: kept
    (end,) = host.events(Event.PROBLEM_CLEARED)
    clock = time.strftime("%H:%M:%S", time.localtime(LATER))
    assert end.getMessage() == f"GPU {SLOT}: Xid 79 cleared by an operator (root at {clock})"
    assert end.CLEARED_BY == "root"  # type: ignore[attr-defined]
    text = statustext.render(st, host.agent.wall(), 0, "", width=200)  # type: ignore[union-attr]
    assert f"cleared by root at {clock}" in text
    # A restart reads the boot again, the clear in its place: still cleared.
    host.make_agent(journal_directory=journal)
    st = host.tick().state
    assert xid_problems(st) == [] and entry(st)["cleared"]["by"] == "root"
    assert len(host.events(Event.XID_PROBLEM)) == 1  # not opened again


# A user the test machine's user database has (Debian's nobody), as journald's login uid.
PERSON_UID = 65534


def test_the_clear_records_the_person_behind_sudo(host: Host, make: Any) -> None:
    # `sudo gpuagent clear …` from a login of PERSON_UID: journald stamps its login uid.
    person = pwd.getpwuid(PERSON_UID).pw_name
    journal = make(FELL_OFF)
    host.make_agent(journal_directory=journal)
    host.tick()
    append(journal, clear_entry("0", LATER, login=str(PERSON_UID), sudo_user="forged"))
    st = host.tick().state
    assert entry(st)["cleared"] == {"kind": "xid", "by": person, "at": LATER}
    (end,) = host.events(Event.PROBLEM_CLEARED)
    clock = time.strftime("%H:%M:%S", time.localtime(LATER))
    assert end.getMessage() == f"GPU {SLOT}: Xid 79 cleared by an operator ({person} at {clock})"
    assert vars(end)["CLEARED_BY"] == person
    text = statustext.render(st, host.agent.wall(), 0, "", width=200)  # type: ignore[union-attr]
    assert f"cleared by {person} at {clock}" in text
    # A restart reads it back the same.
    host.make_agent(journal_directory=journal)
    assert entry(host.tick().state)["cleared"]["by"] == person


def test_without_a_login_uid_the_clear_names_sudo_s_user(host: Host, make: Any) -> None:
    journal = make(FELL_OFF)
    host.make_agent(journal_directory=journal)
    host.tick()
    # A process no login started (a unit, a container without audit): no login uid.
    unset = str(clears.NO_LOGIN)
    append(journal, clear_entry("0", LATER, login=unset, sudo_user="alice"))
    assert entry(host.tick().state)["cleared"]["by"] == "alice"


def test_the_same_entry_from_another_uid_does_nothing(host: Host, make: Any) -> None:
    journal = make(FELL_OFF)
    host.make_agent(journal_directory=journal)
    host.tick()
    append(journal, clear_entry("1000", LATER))
    st = host.tick(2).state
    assert xid_problems(st) == [("xid", 79)]
    assert "cleared" not in entry(st)
    assert host.events(Event.PROBLEM_CLEARED) == []


def test_an_xid_after_the_clear_opens_it_again(host: Host, make: Any) -> None:
    journal = make(FELL_OFF)
    host.make_agent(journal_directory=journal)
    host.tick()
    append(journal, clear_entry("0", LATER))
    assert xid_problems(host.tick().state) == []
    append(journal, xid_entry(LATER + 60))
    st = host.tick().state
    assert xid_problems(st) == [("xid", 79)]
    assert "cleared" not in entry(st)  # shown until the next problem
    assert len(host.events(Event.XID_PROBLEM)) == 2
    # Read from the start (a restart): Xid, clear, Xid: open.
    host.make_agent(journal_directory=journal)
    assert xid_problems(host.tick().state) == [("xid", 79)]


def test_a_clear_of_all_and_of_another_gpu(host: Host, make: Any) -> None:
    journal = make(FELL_OFF)
    host.make_agent(journal_directory=journal)
    host.tick()
    append(journal, clear_entry("0", LATER, slot="0000:2a:00.0", kind="all"))
    assert xid_problems(host.tick().state) == [("xid", 79)]
    append(journal, clear_entry("0", LATER + 1, slot="0000:18:00.0", kind="all"))
    st = host.tick().state
    assert xid_problems(st) == [] and entry(st)["cleared"]["kind"] == "all"


def test_parse_honours_root_only_and_latching_kinds() -> None:
    good = {"_UID": b"0", "PCI_SLOT": b"0000:18:00.0", "KIND": b"xid", "CLEARED_BY": b"root"}
    assert clears.parse(good, 5.0) == Clear(SLOT, "xid", "root", 5.0)
    assert clears.parse({**good, "PCI_SLOT": b"18:00.0"}, 5.0) == Clear(SLOT, "xid", "root", 5.0)
    for bad in (
        {**good, "_UID": b"1000"},
        {k: v for k, v in good.items() if k != "_UID"},
        {**good, "KIND": b"Throttled!"},
        {**good, "PCI_SLOT": b"nonsense"},
        {k: v for k, v in good.items() if k != "KIND"},
    ):
        assert clears.parse(bad, 5.0) is None
    # The person: the login uid journald stamps, named; else SUDO_USER; else CLEARED_BY.
    names = {1000: "alice"}.get
    login = {**good, "_AUDIT_LOGINUID": b"1000", "SUDO_USER": b"bob"}
    assert clears.parse(login, 5.0, names) == Clear(SLOT, "xid", "alice", 5.0)
    assert clears.parse(login, 5.0) == Clear(SLOT, "xid", "uid 1000", 5.0)
    root = {**good, "_AUDIT_LOGINUID": b"0"}
    assert clears.parse(root, 5.0, {0: "root"}.get) == Clear(SLOT, "xid", "root", 5.0)
    unset = {**good, "_AUDIT_LOGINUID": b"4294967295", "SUDO_USER": b"bob"}
    assert clears.parse(unset, 5.0, names) == Clear(SLOT, "xid", "bob", 5.0)
    for odd in (b"4294967295", b"-1", b"x", b""):
        assert clears.parse({**good, "_AUDIT_LOGINUID": odd}, 5.0, names) == Clear(
            SLOT, "xid", "root", 5.0
        )
    assert clears.parse({**good, "SUDO_USER": b""}, 5.0) == Clear(SLOT, "xid", "root", 5.0)
    assert clears.covers("all", "init_failed")
    assert not clears.covers("xid", "init_failed")
    assert not clears.covers("all", "throttled")
    assert clears.refusal("xid") is None and clears.refusal("all") is None
    assert "read live" in (clears.refusal("recovery_action") or "")


class Sent:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entries: list[dict[str, Any]] = []
        monkeypatch.setattr(clearcli, "send", lambda **f: self.entries.append(f))
        monkeypatch.setattr(os, "geteuid", lambda: 0)


def clear_cli(conf: str, *args: str) -> tuple[int, str, str]:
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "clear", *args])
    return res.exit_code, res.stdout, res.stderr


def xid_state() -> State:
    xid = states.problem("xid", "critical", "reboot", slot=SLOT, since=time.time())
    live = states.problem("recovery_action", "critical", "reset_gpu", slot=SLOT, since=time.time())
    bus = (states.nvidia(SLOT),)
    return states.state(now=time.time(), bus=bus, problems={SLOT: [xid, live]})


def test_the_command_sends_root_s_entry(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = Sent(monkeypatch)
    conf = write_state(str(tmp_path), xid_state())
    code, out, err = clear_cli(conf, "0000:18:00.0", "xid")
    assert (code, err) == (0, "")
    assert out.startswith(f"{SLOT}: xid cleared by ")
    (e,) = sent.entries
    assert e["MESSAGE_ID"] == Event.OPERATOR_CLEAR.value
    assert (e["PCI_SLOT"], e["KIND"]) == (SLOT, "xid")
    assert e["CLEARED_BY"] == pwd.getpwuid(os.getuid()).pw_name
    assert "SUDO_USER" not in e
    assert clear_cli(conf, "18:00.0", "--all")[0] == 0
    assert sent.entries[-1]["KIND"] == "all"


def test_the_command_sends_the_person_sudo_ran_it_for(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    monkeypatch.setenv("SUDO_USER", "alice")
    conf = write_state(str(tmp_path), xid_state())
    code, out, _ = clear_cli(conf, SLOT, "xid")
    by = pwd.getpwuid(os.getuid()).pw_name
    assert (code, out) == (0, f"{SLOT}: xid cleared by alice (as {by})\n")
    (e,) = sent.entries
    assert (e["CLEARED_BY"], e["SUDO_USER"]) == (by, "alice")
    assert e["MESSAGE"] == f"GPU {SLOT}: xid cleared by alice (as {by})"


def test_the_command_refuses_what_it_cannot_clear(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    conf = write_state(str(tmp_path), xid_state())
    code, _, err = clear_cli(conf, SLOT, "recovery_action")
    assert code == 1 and "recovery_action is read live" in err
    code, _, err = clear_cli(conf, SLOT, "init_failed")
    assert code == 1 and "has no init_failed problem to clear; recovery_action read live" in err
    assert clear_cli(conf, "bogus", "xid")[0] == 2
    assert clear_cli(conf, SLOT)[0] == 2  # neither KIND nor --all
    assert clear_cli(conf, SLOT, "xid", "--all")[0] == 2
    assert sent.entries == []
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, _, err = clear_cli(conf, SLOT, "xid")
    assert code == clearcli.EX_NOPERM and "only root's clears count" in err
    assert sent.entries == []


def test_without_a_running_agent_the_clear_is_sent_for_later(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    conf = write_state(str(tmp_path), xid_state())
    os.unlink(os.path.join(str(tmp_path), "state.json"))
    code, out, _ = clear_cli(conf, SLOT, "xid")
    assert code == 0 and "applies the clear when it starts" in out
    assert len(sent.entries) == 1


def test_the_kernel_log_s_match_is_the_event_s() -> None:
    from gpuagent.sources.kernel.kernmatch import CLEARS  # noqa: PLC0415

    assert {"MESSAGE_ID": Event.OPERATOR_CLEAR.value, "_UID": "0"} == CLEARS


def test_gone_from_bus_is_the_one_bus_kind_a_clear_accepts(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    gone = states.problem("gone_from_bus", "critical", "reboot", slot=SLOT, since=time.time())
    st = states.state(now=time.time(), bus=(), problems={SLOT: [gone]})
    conf = write_state(str(tmp_path), st)
    code, out, _ = clear_cli(conf, SLOT, "gone_from_bus")
    assert code == 0 and out.startswith(f"{SLOT}: gone_from_bus cleared by ")
    assert sent.entries[-1]["KIND"] == "gone_from_bus"
    assert clears.covers("gone_from_bus", "gone_from_bus")
    assert not clears.covers("all", "gone_from_bus")


# Two boots: the kernel's id as a sandboxed service sees it is neither (systemd-nspawn gives
# the container a boot id of its own, which journald stamps; ProtectProc='s /proc shows the
# kernel's).
A = "0123456789abcdef0123456789abcdef"
B = "fedcba9876543210fedcba9876543210"
KERNELS = "f" * 32


def test_this_boot_is_journalds_where_the_kernels_id_is_not_in_the_system_journal(
    make: Any,
) -> None:
    # Logged in this machine's boot (an entry of B before it would be no boot of now).
    start = booted_at() + 1
    directory = make(FELL_OFF + f"#@boot {B}\n" + FELL_OFF, boot=A, start=start)
    append(directory, clear_entry("0", start + 3600, boot=B))

    def read(log: KernelLog) -> tuple[int, list[dict[str, bytes]]]:
        kernel: list[str] = []
        got: list[dict[str, bytes]] = []
        log.poll(lambda _, m: kernel.append(m), None, lambda _, f: got.append(f))
        assert log.error is None
        return len(kernel), got

    def system(_: str) -> Any:  # the system journal, as the agent opens it, is this one
        from systemd import journal  # noqa: PLC0415

        return journal.Reader(path=directory)

    # The system journal without the kernel's id: the boot of its latest entry, journald's.
    log = KernelLog("", open_reader=system, kernel_boot=lambda: KERNELS)
    lines, got = read(log)
    assert log.boot == B
    assert lines > 0 and [f["KIND"] for f in got] == [b"xid"]
    # The kernel's id in it: that boot, as on a host that is no container.
    log = KernelLog("", open_reader=system, kernel_boot=lambda: A)
    assert read(log) == (lines, [])
    assert log.boot == A
    # A directory (copied, made for a test) is read for the id this process sees, only.
    log = KernelLog(directory, kernel_boot=lambda: KERNELS)
    assert read(log) == (0, [])
    # The earlier boots stop at the same one: A is earlier, B is this boot.
    boots = EarlierBoots("", 3650, 2, open_reader=system, this_boot=lambda: KERNELS)
    boots.step(budget=10.0)
    assert boots.done and boots.boots == {A}
    # A system journal of earlier boots only (journald writing nowhere now) is no boot of
    # this one: nothing in it is read as this boot's.
    old = make(FELL_OFF + f"#@boot {B}\n" + FELL_OFF, name="old", boot=A)

    def stale(_: str) -> Any:
        from systemd import journal  # noqa: PLC0415

        return journal.Reader(path=old)

    log = KernelLog("", open_reader=stale, kernel_boot=lambda: KERNELS)
    assert read(log) == (0, [])
    assert log.boot == KERNELS


def test_a_state_it_may_not_read_is_said_not_taken_for_a_stopped_agent(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    conf = write_state(str(tmp_path), xid_state())
    state_file = os.path.join(str(tmp_path), "state.json")

    def refused(path: str, _limit: int) -> bytes:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(safefile, "read_regular", refused)
    code, out, err = clear_cli(conf, SLOT, "xid")
    assert (code, err) == (0, "")
    assert out.endswith(
        f"({state_file}: cannot read: Permission denied: the agent applies the clear as it "
        "reads the journal)\n"
    )
    assert len(sent.entries) == 1


def test_a_journal_that_refuses_the_clear_is_one_line(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    Sent(monkeypatch)
    conf = write_state(str(tmp_path), xid_state())

    def refused(**_fields: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(clearcli, "send", refused)
    assert clear_cli(conf, SLOT, "xid") == (
        1,
        "",
        "gpuagent: cannot send the clear to the journal: Permission denied\n",
    )


def hung_state() -> State:
    """A host whose nvidia-smi is stuck in the driver, as the agent writes it."""
    hangs = ProbeHangs()
    hangs.observe(0.0, module_loaded=True, stuck=True)
    hung = hangs.finding(0.0)
    assert hung is not None
    return states.state(now=time.time(), problems={"": [Problem("", hung, time.time())]})


def test_a_host_problem_is_refused_saying_how_it_ends(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 24: `gpuagent clear` refused driver_hung saying it is "read live"; a host's
    # problem has no clear, and the refusal says what ends it.
    sent = Sent(monkeypatch)
    conf = write_state(str(tmp_path), hung_state())
    code, out, err = clear_cli(conf, "host", "driver_hung")
    assert (code, out) == (1, "")
    assert err == (
        "gpuagent: cannot clear host driver_hung: host driver_hung ends by itself once "
        "nvidia-smi has answered normally 3 probes in a row, or the nvidia module is unloaded; "
        "no clear ends it (a clear takes a GPU's slot and ends its xid, init_failed, "
        "pcie_error or gone_from_bus; the host's fabricmanager_restarted, or a problem held "
        "unread)\n"
    )
    assert "read live" not in err
    code, _, err = clear_cli(conf, "HOST", "gpu_count")
    assert code == 1
    assert err.startswith("gpuagent: cannot clear host gpu_count: the host has no gpu_count ")
    assert clear_cli(conf, "host", "--all")[0] == 1
    os.unlink(os.path.join(str(tmp_path), "state.json"))
    code, _, err = clear_cli(conf, "host", "driver_hung")
    assert code == 1 and "a host problem ends when its cause does; no clear ends it" in err
    assert sent.entries == []


def test_the_command_clears_a_live_problem_held_unread(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A problem read live is ended by its cause, unless its source cannot look: then only
    root's clear of its own kind ends it (issue 39)."""
    sent = Sent(monkeypatch)
    st: State = json.loads(json.dumps(xid_state()))  # a copy to change
    st["gpus"][0]["problems"][1]["unread_since"] = time.time()
    st["gpus"][0]["problems"][1]["unread"] = "the nvidia module is not loaded"
    conf = write_state(str(tmp_path), st)
    code, out, err = clear_cli(conf, SLOT, "recovery_action")
    assert (code, err) == (0, "")
    assert out.startswith(f"{SLOT}: recovery_action cleared by ")
    (e,) = sent.entries
    assert e["KIND"] == "recovery_action"


def restarted_state(unread: bool = False) -> State:
    """A host whose fabric manager runs again after a stop (and, ``unread``, whose
    fabricmanager_down is held unread: the system bus failing)."""
    now = time.time()
    fm = states.problem("fabricmanager_restarted", "critical", "drain_and_reset", slot="")
    down = states.problem("fabricmanager_down", "critical", "restart_service", slot="")
    if unread:
        dark = replace(down.finding, unread=(now, "systemd's units not read"))
        down = replace(down, finding=dark)
    return states.state(now=now, problems={"": [fm, down]})


def test_the_command_clears_the_fabric_managers_restart_on_the_host(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    conf = write_state(str(tmp_path), restarted_state())
    code, out, err = clear_cli(conf, "host", "fabricmanager_restarted")
    assert (code, err) == (0, "")
    assert out.startswith("host: fabricmanager_restarted cleared by ")
    (e,) = sent.entries
    assert (e["PCI_SLOT"], e["KIND"]) == ("host", "fabricmanager_restarted")
    assert e["MESSAGE"].startswith("host: fabricmanager_restarted cleared by ")
    # fabricmanager_down is read live: refused, saying how it ends.
    code, _, err = clear_cli(conf, "host", "fabricmanager_down")
    assert code == 1 and "cannot clear host fabricmanager_down" in err
    # Held unread (the bus fails), its own name ends it.
    conf = write_state(str(tmp_path), restarted_state(unread=True))
    assert clear_cli(conf, "host", "fabricmanager_down")[0] == 0
    assert sent.entries[-1]["KIND"] == "fabricmanager_down"
    # A host without it: nothing to clear.
    conf = write_state(str(tmp_path), hung_state())
    code, _, err = clear_cli(conf, "host", "fabricmanager_restarted")
    assert code == 1 and "host has no fabricmanager_restarted problem to clear" in err
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    conf = write_state(str(tmp_path), restarted_state())
    assert clear_cli(conf, "host", "fabricmanager_restarted")[0] == clearcli.EX_NOPERM
    assert len(sent.entries) == 2


def test_a_host_clear_is_read_back_for_the_host() -> None:
    entry = {
        "_UID": "0",
        "PCI_SLOT": "host",
        "KIND": "fabricmanager_restarted",
        "CLEARED_BY": "root",
    }
    assert clears.parse(entry, 5.0) == Clear("", "fabricmanager_restarted", "root", 5.0)
    assert clears.parse({**entry, "_UID": "1000"}, 5.0) is None
    assert clears.covers("fabricmanager_restarted", "fabricmanager_restarted")
    assert not clears.covers("all", "fabricmanager_restarted")
    assert clears.ending("", "fabricmanager_restarted", "") == (
        "holds until the next boot; after the reset: gpuagent clear host fabricmanager_restarted",
        True,
    )


def test_the_fabric_managers_restart_holds_until_the_reset_roots_clear_says(
    host: Host, make: Any
) -> None:
    # NVIDIA's Fabric Manager guide: the GPUs and NVSwitches are reset between its stop and
    # its start; no record shows the reset, so only a reboot or root's word ends it.
    nvswitch_host(host)
    host.healthy()
    journal = make("[    1.000000] nvidia: loading out-of-tree module taints kernel.\n")
    units = FakeUnits()
    units.set(unit(FM), unit(PD))  # its first start this boot: nothing to say
    host.make_agent(units=units, journal_directory=journal)
    assert host.tick(1).state["host_problems"] == []
    units.set(unit(FM, "failed", "failed", result="exit-code"), unit(PD))
    host.tick(1)
    units.set(replace(unit(FM), rerun=1_700_000_500.0), unit(PD))
    st = host.tick(1).state
    (p,) = st["host_problems"]
    assert (p["kind"], p["severity"], p["action"]) == (
        "fabricmanager_restarted",
        "critical",
        "drain_and_reset",
    )
    assert p["ends"] == (
        "holds until the next boot; after the reset: gpuagent clear host fabricmanager_restarted"
    )
    (line,) = host.events(Event.PROBLEM_FABRICMANAGER_RESTARTED)
    assert line.levelno == logging.ERROR
    assert [r.getMessage() for r in host.events(Event.PROBLEM_CLEARED)] == [
        "host: fabricmanager_down cleared"
    ]
    # It holds tick after tick, and across a restart of the agent.
    host.tick(3)
    host.make_agent(units=units, journal_directory=journal)
    assert [p["kind"] for p in host.tick(1).state["host_problems"]] == ["fabricmanager_restarted"]
    # Root's clear after the reset ends it, and says who.
    append(journal, clear_entry("0", LATER, slot="host", kind="fabricmanager_restarted"))
    assert host.tick(1).state["host_problems"] == []
    (end,) = [r for r in host.events(Event.PROBLEM_CLEARED) if "restarted" in r.getMessage()]
    assert end.getMessage().startswith(
        "host: fabricmanager_restarted cleared by an operator (root at "
    )
    # A restart after the clear is a new one.
    units.set(replace(unit(FM), rerun=LATER + 60.0), unit(PD))
    assert [p["kind"] for p in host.tick(1).state["host_problems"]] == ["fabricmanager_restarted"]
