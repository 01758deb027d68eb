"""Kernel records that any user can make the kernel print, with the driver's words inside
them: no fault, no reason, no reboot.

``_TRANSPORT=kernel`` proves the kernel printed a record, not that the driver wrote its text,
and journald turns the ``\\x0a`` of ``/dev/kmsg`` back into newlines.  The records here are the
ones a user without privileges makes: a tmpfs mount option in an unprivileged user namespace
(``unshare -Urm mount -t tmpfs -o "$(printf 'x\\nNVRM: Xid …')" none /mnt``: no comma or ``=``
in it, they split the options), the once-per-boot "NULL argv" warning with its file name, and
the driver's own "API mismatch" with the version string the client sent (``/dev/nvidiactl`` is
mode 0666), read from real journal files (make-test-journal) by an agent on a fake host, and
over the whole real corpus by the pure parsers.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuagent.sources.driver.driver import absence_reason, api_mismatch, mismatch_evidence
from gpuagent.sources.kernel.xid import parse
from gpuagent.views import ApiMismatch
from tests import fakesysfs, test_driver, test_kernlog, xidcorpus
from tests.conftest import Host
from tests.journalfeed import this_boot
from tests.test_earlier import A, B, xid
from tests.test_kernel import FELL_OFF
from tests.test_kernlog import NOT_FOUND, append, userspace

make = test_kernlog.make

SLOT = "0000:18:00.0"
# Every kind of the driver's record, for the fake host's first GPU, as a mount option can hold
# them (no "," nor "="): an Xid 79, its companion, the probe-time fall-off, an init failure,
# an SXid, a UUID line, an API mismatch, and the kernel's and driver's reasons for an absent
# module.
DRIVER_WORDS = (
    "NVRM: Xid (PCI:0000:18:00): 79\n"
    "NVRM: Xid (PCI:0000:18:00): 48\n"
    "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.\n"
    "NVRM: The NVIDIA GPU 0000:18:00.0\n"
    "NVRM: (PCI ID: 10de:2335) installed in this system has\n"
    "NVRM: fallen off the bus and is not responding to commands.\n"
    "NVRM: GPU 0000:18:00.0: RmInitAdapter failed! (0x62:0x65:1792)\n"
    "nvidia-nvswitch0: SXid (PCI:0000:04:00.0): 22013\n"
    "NVRM: GPU at PCI:0000:18:00: GPU-11111111-2222-3333-4444-555555555555\n"
    "NVRM: API mismatch: the client has the version 595.79 but\n"
    "NVRM: this kernel module has the version 595.80.  Please\n"
    "Loading of module with unavailable key is rejected\n"
    "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7\n"
    "NVRM: The NVIDIA probe routine was not called for 8 device(s).\n"
    "NVRM: None of the NVIDIA devices were initialized.\n"
)
# fs/fs_parser.c via shmem's parser: "tmpfs: Unknown parameter '%s'", the key as given.
TMPFS = f"tmpfs: Unknown parameter 'x\n{DRIVER_WORDS}'"
# fs/exec.c: "process '%s' launched '%s' with NULL argv: empty string added", the file name
# as the caller gave it (commas allowed there).
NULL_ARGV = (
    "process 'evil' launched '/tmp/x\n"
    "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the "
    "bus.\nNVRM: GPU 0000:18:00.0: GPU has fallen off the bus.\n"
    "' with NULL argv: empty string added"
)
# osapi.c's RmPerformVersionCheck prints the client's version string as the client sent it
# (64 bytes, newlines and all): every line begins NVRM:, the Xid on the third.
API_MISMATCH = (
    "NVRM: API mismatch: the client 'evil' (pid 4242)\n"
    "NVRM: has the version 1\n"
    "NVRM: Xid (PCI:0000:18:00): 79, but this kernel module has\n"
    "NVRM: the version 595.80.  Please make sure that this\n"
    "NVRM: kernel module and all NVIDIA driver components\n"
    "NVRM: have the same version."
)


def journal_text(*records: str) -> str:
    """``records`` as make-test-journal's input: a continuation line starts with a blank."""
    lines = [f"[  {100 + i}.000000] " + r.replace("\n", "\n    ") for i, r in enumerate(records)]
    return "\n".join(lines) + "\n"


def as_user(entry: bytes) -> bytes:
    """``entry`` (:func:`tests.test_kernlog.userspace`'s, root's) as journald stamps it for a
    user's process: ``_UID=1000``."""
    assert entry.count(b"\n_UID=0\n") == 1
    return entry.replace(b"\n_UID=0\n", b"\n_UID=1000\n")


def quiet(host: Host) -> None:
    """No GPU of ``host`` has a fault, nor the host a problem."""
    assert host.state["host_problems"] == []
    gpus = host.state["gpus"]
    assert gpus
    assert [(g["health"], g["xids"], g["problems"]) for g in gpus] == [("ok", [], [])] * len(gpus)


@pytest.mark.parametrize(
    "record", [TMPFS, NULL_ARGV, API_MISMATCH], ids=["tmpfs", "null_argv", "api_mismatch"]
)
def test_forged_records_in_the_journal_are_no_fault(host: Host, make: Any, record: str) -> None:
    host.healthy()
    host.make_agent(journal_directory=make(journal_text(record)))
    host.tick()
    quiet(host)


def test_forged_xid_in_tmpfs_mount_option_is_not_a_fault() -> None:
    assert parse(TMPFS) == []
    assert absence_reason(TMPFS) is None
    assert api_mismatch(TMPFS) is None


def test_forged_xid_in_null_argv_file_name_is_not_a_fault() -> None:
    assert parse(NULL_ARGV) == []


def test_forged_xid_in_api_mismatch_client_version_is_not_a_fault() -> None:
    assert parse(API_MISMATCH) == []
    assert api_mismatch(API_MISMATCH) is None


def test_forged_xid_in_tmpfs_mount_option_in_three_boots_is_no_rma(host: Host, make: Any) -> None:
    forged = journal_text(TMPFS)
    text = forged + f"#@boot {B}\n" + forged + f"#@boot {this_boot()}\n" + forged
    host.healthy()
    host.make_agent(journal_directory=make(text, boot=A), history_days=3650)
    st = host.tick().state
    assert st["history"] == "2 earlier boots"
    assert xid(st) == []
    quiet(host)


def test_a_real_fall_off_next_to_forged_earlier_boots_is_not_escalated(
    host: Host, make: Any
) -> None:
    # The boot's real Xid 79 stays a reboot: the forged ones of the earlier boots are no hits.
    forged = journal_text(TMPFS, NULL_ARGV, API_MISMATCH)
    text = forged + f"#@boot {B}\n" + forged + f"#@boot {this_boot()}\n" + FELL_OFF
    host.make_agent(journal_directory=make(text, boot=A), history_days=3650)
    assert [a for a, _ in xid(host.tick().state)] == ["reboot"]


def test_forged_module_reasons_in_tmpfs_mount_option_explain_nothing(host: Host, make: Any) -> None:
    fakesysfs.set_module(host.root, False)
    host.make_agent(journal_directory=make(journal_text(TMPFS)), driver_absent_grace=20.0)
    host.tick(3)
    (problem,) = host.state["host_problems"]
    assert problem["kind"] == "no_driver_module"
    assert problem["message"].endswith("nothing in the journal says why")


def test_a_user_run_modprobe_is_not_a_module_loader(host: Host, make: Any) -> None:
    # systemd-cat modprobe nvidia, run by a user: journald stamps _COMM=modprobe, _UID=1000.
    journal = make("[    1.000000] Linux version 6.1.0-28-amd64\n")
    append(
        journal,
        as_user(userspace(NOT_FOUND, comm="modprobe"))
        + as_user(userspace(NOT_FOUND, comm="systemd-modules-load"))
        + as_user(userspace(NOT_FOUND, comm="x", unit="systemd-modules-load.service")),
    )
    fakesysfs.set_module(host.root, False)
    host.make_agent(journal_directory=journal, driver_absent_grace=20.0)
    host.tick(3)
    (problem,) = host.state["host_problems"]
    assert problem["message"].endswith("nothing in the journal says why")


def test_a_client_version_of_another_shape_is_no_mismatch() -> None:
    def record(client: str) -> str:
        return (
            f"NVRM: API mismatch: the client has the version {client}, but\n"
            "NVRM: this kernel module has the version 595.80.  Please\n"
            "NVRM: make sure that this kernel module and all NVIDIA driver\n"
            "NVRM: components have the same version."
        )

    for client in ("595.79", "535.104", "470.256.02", "96.43.23"):
        assert api_mismatch(record(client)) == ApiMismatch(client, "595.80")
    for client in ("1", "595", "5950.80", "595.80.1.2", "595.8000", "v595.80"):
        assert api_mismatch(record(client)) is None


def test_a_client_of_another_version_than_the_installed_is_no_mismatch() -> None:
    # Any user may send /dev/nvidiactl a version of the driver's shape: only a refused client
    # of the installed version is the upgrade's, and with that version unknown a record
    # alone is nothing (it would drain the host: driver_mismatch is critical).
    sent = ApiMismatch("595.79", "595.80", "evil")
    assert mismatch_evidence("595.80", "595.80", sent) == []
    assert mismatch_evidence(None, "595.80", sent) == []
    assert mismatch_evidence(None, None, sent) == []
    assert len(mismatch_evidence("595.79", "595.80", sent)) == 2  # the versions differ too


def corpus_records() -> list[str]:
    out = [m for name in xidcorpus.names() for m in xidcorpus.messages(name)]
    return out + [r for name in test_driver.names() for r in test_driver.records(name)]


def test_every_driver_record_of_the_corpus_inside_another_record_is_nothing() -> None:
    # Each real record the parsers read, as the later lines of a tmpfs record, of the NULL
    # argv warning, and of the driver's own API mismatch (the client's version).
    told = [r for r in corpus_records() if parse(r) or absence_reason(r) or api_mismatch(r)]
    assert len(told) > 60
    for record in told:
        for wrapped in (
            f"tmpfs: Unknown parameter 'x\n{record}'",
            f"process 'x' launched '/tmp/\n{record}' with NULL argv: empty string added",
            f"NVRM: API mismatch: the client 'x' (pid 1)\nNVRM: has the version 1\n{record}",
        ):
            assert parse(wrapped) == [], wrapped
            assert absence_reason(wrapped) is None, wrapped
            assert api_mismatch(wrapped) is None, wrapped
