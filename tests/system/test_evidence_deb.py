"""Evidence at fault time under a real systemd: a critical fault of a fake GPU starts
gpuagent-evidence@, the bundle appears with its parts and the GPU's problem names it, a fake
nvidia-bug-report.sh that hangs is killed at its timeout and the manifest says so; a storm of
requests makes no more bundles than the caps allow; the agent stays unprivileged.  Boots
Debian as tests/system/test_deb.py.
"""

from __future__ import annotations

import json

import pytest

from gpuagent.logs import Event
from tests import fakesysfs
from tests.system.test_deb import (  # noqa: F401
    CAPTURE,
    FAKE,
    FAKE_CONFIG,
    Container,
    container,
    deb,
    fake_host,
    install,
    wait_for,
)

pytestmark = pytest.mark.system

EVIDENCE = "/var/lib/gpuagent/evidence"
HANGS = "#!/bin/sh\necho 'Running nvidia-smi -q'\nexec sleep 600\n"


def test_a_critical_fault_gathers_a_bounded_bundle(
    deb: str,  # noqa: F811
    container: Container,  # noqa: F811
) -> None:
    c = container
    slots = fakesysfs.gpu_slots(8)
    sick = slots[0]
    try:
        install(c, deb)
        assert c.out("systemctl", "is-active", "gpuagent-evidence.path") == "active"
        fake_host(c, {"capture": CAPTURE, "slots": slots})
        # The root units read the system's file: the same fake host, a short report timeout.
        c.write("/etc/gpuagent/gpuagent.toml", FAKE_CONFIG + "evidence_report_timeout = 3\n")
        c.write("/usr/local/sbin/nvidia-bug-report.sh", HANGS)
        c.run("chmod", "755", "/usr/local/sbin/nvidia-bug-report.sh")
        step = {
            "capture": CAPTURE,
            "slots": slots,
            "override": {sick: {"gpu_recovery_action": "Reset"}},
        }
        c.write(f"{FAKE}/scenario.json", json.dumps(step))

        def bundles() -> list[str]:
            listing = c.run("ls", "-1", EVIDENCE, check=False).stdout.split()
            return [n for n in listing if not n.startswith(".")]

        [name] = wait_for("the bundle", bundles, 90)
        assert name.endswith(f"-{sick}")
        files = c.out("ls", "-1", f"{EVIDENCE}/{name}").split()
        for part in ["manifest.json", "nvidia-smi-q.txt", "journal-kernel.txt", "state-run.json"]:
            assert part in files, files
        manifest = json.loads(c.out("cat", f"{EVIDENCE}/{name}/manifest.json"))
        assert manifest["slot"] == sick and manifest["trigger"] == "request"
        [report] = [p for p in manifest["parts"] if p["what"] == "nvidia-bug-report.sh"]
        assert report["outcome"] == "timeout", report

        def said() -> list[dict[str, str]]:
            text = c.out("journalctl", f"MESSAGE_ID={Event.EVIDENCE_BUNDLE.value}", "-o", "json")
            return [json.loads(ln) for ln in text.splitlines() if ln.strip()]

        line = wait_for("the journal line", said, 30)[0]
        assert line["PCI_SLOT"] == sick and line["EVIDENCE_BUNDLE"] == f"{EVIDENCE}/{name}"

        # The problem names it too: the unprivileged agent lists the directory's names.
        def named() -> list[str]:
            st = json.loads(c.status("--json").stdout)
            [gpu] = [g for g in st["gpus"] if g["pci_slot"] == sick]
            return [p.get("evidence") for p in gpu["problems"] if p["severity"] == "critical"]

        wait_for("the problem's bundle", lambda: named() == [f"{EVIDENCE}/{name}"], 30)
        status = c.status(columns=200)
        assert f"\n        evidence: {EVIDENCE}/{name}\n" in status.stdout, status.stdout
        # A storm of requests, as the agent's user: no second bundle of the sick GPU this
        # boot, and the hour's limit (2) allows one more of another.
        for _ in range(3):
            for slot in [*slots, "0000:03:00.0", "junk"]:
                c.run(
                    "runuser",
                    "-u",
                    "gpuagent",
                    "--",
                    "touch",
                    f"/run/gpuagent/evidence-requests/{slot}",
                )
            wait_for(
                "the requests taken",
                lambda: c.run("ls", "-A", "/run/gpuagent/evidence-requests").stdout == "",
                30,
            )
        wait_for("the second bundle", lambda: len(bundles()) == 2, 90)
        c.run("systemctl", "start", "gpuagent-evidence.service")  # nothing left to admit
        assert len(bundles()) == 2
        # The agent ran unprivileged throughout.
        assert (
            c.prop("User") == "gpuagent"
            and c.out("stat", "-c", "%U", "/run/gpuagent") == "gpuagent"
        )
        assert c.out("stat", "-c", "%U %a", EVIDENCE) == "root 755"
    except BaseException:
        print(c.run("journalctl", "--no-pager", "-n", "200", check=False).stdout)
        raise
