"""A board replaced, under systemd: the packaged service (Debian 12 and 13) remembers each
slot's board in /var/lib/gpuagent/gpus.json; another board in a slot is one line, and the
slot's Xids of earlier boots (the system journal's, read at start) no longer make the new
board an RMA, while the slot beside it, whose board stayed, is sent for one.  The boards' wear
is recorded once a boot: a restart records nothing again."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import pytest

from gpuagent.logs import Event
from tests import fakesysfs, replay, xidcorpus
from tests.system.test_deb import (  # noqa: F401 - container and deb are fixtures
    CAPTURE,
    FAKE,
    MAKE_JOURNAL,
    Container,
    container,
    deb,
    fake_host,
    install,
    need_make_journal,
    one,
    place_journal,
    system_journal,
    wait_for,
)

pytestmark = pytest.mark.system

OLD = "GPU-11111111-2222-3333-4444-555555555555"
XID79 = "xid-79-driver535-pid-unknown-crashdump"
# Two earlier boots, a day apart, within history_days (30).
EARLIER = ("a0" * 16, "b0" * 16)


def fell(slots: list[str]) -> str:
    """The corpus's Xid 79 (its record and the driver's lines after it) for each of ``slots``,
    without its times, and without the driver's UUID line: the records name the slot only,
    as an older driver's do, which only the swap tells apart from the new board's."""
    with open(xidcorpus.path(XID79), encoding="utf-8") as f:
        text = f.read()
    lines = "".join(text.replace("0000:a1:00", s.rpartition(".")[0]) for s in slots)
    return "".join(
        line.partition("] ")[2] if line.startswith("[") else line
        for line in lines.splitlines(keepends=True)
        if "NVRM: GPU at PCI:" not in line
    )


def earlier_boots(c: Container, work: str, slots: list[str]) -> None:
    """Xid 79 on ``slots`` in two earlier boots, placed in ``c``'s system journal before the
    agent starts (it reads the earlier boots at start)."""
    text = ""
    for n, boot in enumerate(EARLIER):
        stamp = time.strftime("[%a %b %d %H:%M:%S %Y] ", time.gmtime(time.time() - (3 - n) * 86400))
        records = "".join(
            line if line[:1].isspace() else stamp + line
            for line in fell(slots).splitlines(keepends=True)
        )
        text += (f"#@boot {boot}\n" if n else "") + records
    source = os.path.join(work, "earlier.txt")
    with open(source, "w", encoding="utf-8") as f:
        f.write(text)
    made = os.path.join(work, "earlier.journal")
    argv = [MAKE_JOURNAL, "--boot-id", EARLIER[0], source, made]
    subprocess.run(argv, check=True, timeout=60, capture_output=True)
    system_journal(c, made, "gpuagent-earlier", c.out("cat", "/etc/machine-id"))


def test_a_board_swap_resets_its_slots_recurrence_under_systemd(
    deb: str,  # noqa: F811
    container: Container,  # noqa: F811
    tmp_path: str,
) -> None:
    need_make_journal()
    c = container
    slots = fakesysfs.gpu_slots(8)
    swapped, stayed = slots[0], slots[1]
    try:
        install(c, deb)
        fake_host(c, {"capture": CAPTURE, "slots": slots})
        wait_for("8 GPUs sampled", lambda: c.prop("StatusText") == "8 GPUs, sampling", 20)
        c.run("systemctl", "stop", "gpuagent")
        # What the host had: another board in the first slot than the one answering now, last
        # on the bus in an earlier boot (a board changes only off the bus: a reboot here).
        kept = json.loads(c.out("cat", "/var/lib/gpuagent/gpus.json"))
        for g in kept["gpus"]:
            if g["pci_slot"] == swapped:
                g["uuid"], g["serial"], g["boot"] = OLD, "1320221034567", EARLIER[1]
        c.write("/var/lib/gpuagent/gpus.json", json.dumps(kept))
        c.run("chown", "gpuagent:gpuagent", "/var/lib/gpuagent/gpus.json")
        earlier_boots(c, str(tmp_path), [swapped, stayed])
        c.run("systemctl", "start", "gpuagent")

        def history_read() -> bool:
            st = json.loads(c.status("--json").stdout or "{}")
            return bool(st.get("history") == "2 earlier boots")

        wait_for("the earlier boots read", history_read, 30)
        swap = one(wait_for("the swap", lambda: c.events(Event.BOARD_REPLACED), 15), "swap")
        assert {k: swap.get(k) for k in ("PCI_SLOT", "OLD_UUID", "OLD_SERIAL", "GPU_UUID")} == {
            "PCI_SLOT": swapped,
            "OLD_UUID": OLD,
            "OLD_SERIAL": "1320221034567",
            "GPU_UUID": replay.gpu_uuid(swapped),
        }
        # This boot's Xid 79 on both: the new board's first, the old board's third boot.
        place_journal(c, str(tmp_path), fell([swapped, stayed]))

        def actions() -> dict[str, str]:
            lines = c.events(Event.XID_PROBLEM)
            return {e["PCI_SLOT"]: e["ACTION"] for e in lines if e.get("XID") == "79"}

        wait_for("both Xid lines", lambda: len(actions()) == 2, 20)
        assert actions() == {swapped: "reboot", stayed: "drain_and_rma"}
        st = json.loads(c.status("--json").stdout)
        worst = {g["pci_slot"]: g["problems"][0] for g in st["gpus"] if g["problems"]}
        assert worst[stayed]["message"].startswith(f"Xid 79 on {stayed} in 3 boots since ")
        assert worst[swapped]["action"] == "reboot"
        history = c.out("gpuagent", "history", swapped)
        assert f"board_replaced {OLD} (serial 1320221034567) -> {replay.gpu_uuid(swapped)}" in (
            history
        )
        wear_once_a_boot(c, slots)
    except BaseException:
        print(f"--- journalctl -u gpuagent ---\n{c.journal()}")
        raise


def wear_once_a_boot(c: Container, slots: list[str]) -> None:
    """The boards' wear recorded once this boot, in one record naming every board
    (WEAR_BOARDS); a restart records nothing again (wear.json names the boot)."""
    records = wait_for("the wear record", lambda: len(c.events(Event.WEAR_RECORDED)) == 1, 15)
    assert records
    (line,) = c.events(Event.WEAR_RECORDED)
    assert line["MESSAGE"] == f"wear of {len(slots)} GPUs recorded: every counter 0"
    wore: list[dict[str, Any]] = json.loads(line["WEAR_BOARDS"])
    assert sorted(b["pci_slot"] for b in wore) == sorted(slots)
    assert {b["remapped_rows_correctable"] for b in wore} == {0}
    kept = json.loads(c.out("cat", "/var/lib/gpuagent/wear.json"))
    assert len(kept["boards"]) == len(slots)
    c.run("systemctl", "restart", "gpuagent")

    def restarted() -> bool:
        st = json.loads(c.status("--json").stdout or "{}")
        return str(st.get("pid")) == c.prop("MainPID") and int(st.get("ticks", 0)) >= 4

    wait_for("the restarted agent's first ticks", restarted, 30)
    assert len(c.events(Event.WEAR_RECORDED)) == 1
