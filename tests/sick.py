"""``scripts/demo --sick``: the captured host made sick, so that a newcomer sees every surface.

Eight H200s replaying a real capture; GPU 1 has a critical Xid in this boot's journal (a real
Xid 119 line moved to its slot), GPU 5 reads ``[GPU requires reset]``, and GPU 7 leaves the
PCI bus while the agent runs.  ``python3 -m tests.sick DIR GPUAGENT`` runs the agent for two
ticks, then ``gpuagent status``, and exits with the status's exit code.  It needs nothing
outside the repository but Debian's packages (the journal: systemd-journal-remote).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from tests import fakehost, fakesysfs, replay, xidcorpus

RESET = "[GPU requires reset]"
# The UUID the capture's "GPU at PCI" line gives (anonymised by its poster).
_CAPTURED_UUID = "GPU-11111111-2222-3333-4444-555555555555"
# Seconds the agent may take to start and write its first tick.
START = 60.0


def xid_messages(slot: str) -> list[str]:
    """The sick GPU's kernel records: a real Xid 119 (xid-119-gsp-rpc-timeout-xe9680) moved
    to ``slot``, its dmesg -T times dropped (they are logged just after the agent starts: a
    new fault to it), and its driver's UUID line naming the board the fake host has there:
    one board, one story (a record with another UUID would be another board in a slot that
    never left the bus).  The golden scenario ``sick`` reads the same (tests/test_golden.py)."""
    with open(xidcorpus.path("xid-119-gsp-rpc-timeout-xe9680"), encoding="utf-8") as f:
        text = f.read().replace("0000:9b:00", slot[: -len(".0")])
    text = text.replace(_CAPTURED_UUID, replay.gpu_uuid(slot))
    messages = [re.sub(r"^\[[A-Z][a-z]{2} [^]]*\] ", "", line) for line in text.splitlines()]
    return [m for m in messages if m]


def reset_cells(slot: str) -> dict[str, dict[str, str]]:
    """The GPU in ``slot`` reading ``[GPU requires reset]``, as nvidia-smi's override."""
    return {slot: {"power.draw": RESET, "temperature.gpu": RESET}}


# The sick GPUs by their index among the host's eight: a critical Xid, a reset asked for, one
# gone from the bus while the agent runs.
XID, NEEDS_RESET, GONE = 1, 5, 7


def _journal(directory: str, slot: str) -> str:
    """A journal directory with the sick GPU's records (:func:`xid_messages`), in this boot;
    without systemd-journal-remote, a journal without them (and a line that says so)."""
    messages = xid_messages(slot)
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        boot = f.read().strip().replace("-", "")
    out = os.path.join(directory, "journal", "x.journal")
    start = int((time.time() + 1) * 1e6)
    if fakehost.kernel_journal(out, messages, boot=boot, start_usec=start):
        return os.path.dirname(out)
    print(
        "sick: no systemd-journal-remote (apt install systemd-journal-remote): no Xid",
        file=sys.stderr,
    )
    return fakehost.quiet_journal()


def _first_tick(state_file: str, run: subprocess.Popen[bytes]) -> None:
    """Wait until the agent has written its first tick (it has seen GPU 7 on the bus),
    however long its start takes on a busy machine; at most :data:`START` s."""
    deadline = time.monotonic() + START
    while True:
        try:
            with open(state_file, encoding="utf-8") as f:
                if json.load(f)["ticks"] >= 1:
                    return
        except FileNotFoundError:
            pass
        if run.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"sick: the agent wrote no tick to {state_file}")
        time.sleep(0.05)


def main(directory: str, gpuagent: str) -> int:
    slots = fakesysfs.gpu_slots(8)
    journal = _journal(directory, slots[XID])
    host = fakehost.create(
        directory,
        interval=fakehost.PATIENT_INTERVAL,
        probe_timeout=fakehost.PATIENT,
        journal_directory=journal,
    )
    host.healthy(override=reset_cells(slots[NEEDS_RESET]))
    env = {**os.environ, "GPUAGENT_CONFIG": host.conf}
    # Two ticks: the first sees GPU 7, the second sees it gone.
    run = subprocess.Popen([gpuagent, "run", "--ticks", "2"], env=env)
    _first_tick(os.path.join(directory, "state.json"), run)
    fakesysfs.remove_device(host.root, slots[GONE])
    host.healthy(slots=slots[:GONE], override=reset_cells(slots[NEEDS_RESET]))
    run.wait(timeout=120)
    print(flush=True)
    return subprocess.run([gpuagent, "status"], env=env, check=False, timeout=60).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
