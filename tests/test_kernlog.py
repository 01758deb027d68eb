"""The journal source over real journal files made with make-test-journal.

Every journal is written with this machine's boot id, so "this boot" means the same here as in
production.  journal-remote files are 8 MiB each: a test makes few and removes them.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuagent.sources.kernel.kernlog import KernelLog
from gpuagent.sources.kernel.xidcount import XidCounter
from tests import xidcorpus
from tests.journalfeed import journal_remote, this_boot
from tests.tools import need, tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAKE = os.path.join(os.path.dirname(REPO), "shared", "tools", "make-test-journal")
OTHER_BOOT = "0123456789abcdef0123456789abcdef"


def remote() -> str:
    path = journal_remote()
    need(path is not None, "systemd-journal-remote is not installed")
    assert path is not None
    return path


@pytest.fixture
def make(tmp_path: str) -> Iterator[Any]:
    """make(text, name) writes ``text`` (kernel lines) to ``<tmp>/<name>/x.journal``."""
    need(os.access(MAKE, os.X_OK), f"{MAKE} is missing")
    remote()
    tool("journalctl")
    made: list[str] = []

    def make(
        text: str, name: str = "journal", boot: str | None = None, start: float | None = None
    ) -> str:
        """``start``: the boot's realtime start (s since the epoch; make-test-journal's
        default, in 2023, without it)."""
        source = os.path.join(tmp_path, name + ".txt")
        with open(source, "w", encoding="utf-8") as f:
            f.write(text)
        out = os.path.join(tmp_path, name, "x.journal")
        when = [] if start is None else ["--start-usec", str(int(start * 1e6))]
        subprocess.run(
            [MAKE, "--boot-id", boot or this_boot(), *when, source, out],
            check=True,
            capture_output=True,
            timeout=60,
        )
        made.append(out)
        return os.path.dirname(out)

    yield make
    for path in made:
        if os.path.exists(path):
            os.remove(path)


def append(directory: str, export: bytes) -> None:
    """Append entries in the export format to ``directory/x.journal``, as journald would."""
    subprocess.run(
        [remote(), f"--output={directory}/x.journal", "-"],
        input=export,
        check=True,
        capture_output=True,
        timeout=60,
    )


def userspace(
    message: str,
    *,
    comm: str,
    unit: str | None = None,
    identifier: str | None = None,
    transport: str = "stdout",
    realtime: float | None = None,
    boot: str | None = None,
) -> bytes:
    """One record a program logged (not the kernel), in the export format for :func:`append`,
    with the fields journald itself would set: ``_TRANSPORT``, ``_COMM`` (the process's
    command name), ``_SYSTEMD_UNIT`` (``unit``) and this boot's ``_BOOT_ID``.
    ``identifier`` is ``SYSLOG_IDENTIFIER``, which the program chooses (``logger -t``)."""
    when = int((time.time() if realtime is None else realtime) * 1e6)
    fields = {
        "__REALTIME_TIMESTAMP": str(when),
        "__MONOTONIC_TIMESTAMP": str(int(time.monotonic() * 1e6)),
        "_BOOT_ID": boot or this_boot(),
        "_MACHINE_ID": "f" * 32,
        "_HOSTNAME": "testhost",
        "_TRANSPORT": transport,
        "_COMM": comm,
        "_PID": "4242",
        "_UID": "0",
        "PRIORITY": "3",
        "SYSLOG_IDENTIFIER": identifier or comm,
        **({"_SYSTEMD_UNIT": unit} if unit else {}),
        "MESSAGE": message,
    }
    return b"".join(f"{k}={v}\n".encode() for k, v in fields.items()) + b"\n"


def export(directory: str) -> bytes:
    """The entries of ``directory/x.journal`` in the export format."""
    return subprocess.run(
        [tool("journalctl"), f"--file={directory}/x.journal", "-o", "export"],
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout


def corpus_text(name: str) -> str:
    with open(xidcorpus.path(name), encoding="utf-8") as f:
        return f.read()


Record = tuple[float, str]


def records(log: KernelLog) -> list[Record]:
    """What one poll hands over."""
    out: list[Record] = []
    log.poll(lambda time, message: out.append((time, message)))
    return out


def counted(log: KernelLog, counter: XidCounter | None = None) -> XidCounter:
    counter = counter or XidCounter()
    log.poll(counter.add)
    assert log.error is None
    return counter


def summary(counter: XidCounter) -> dict[object, object]:
    return {k: (c.count, c.info.severity, c.info.action) for k, c in counter.counts([]).items()}


@pytest.mark.parametrize("name", xidcorpus.names())
def test_every_corpus_file_through_a_real_journal(make: Any, name: str) -> None:
    log = KernelLog(make(corpus_text(name)))
    counter = counted(log)
    assert summary(counter) == xidcorpus.XIDS[name]
    assert {s: c.detail for s, c in counter.init_failures([]).items()} == xidcorpus.INIT.get(
        name, {}
    )
    sxids = {k: (c.count, c.fatal) for k, c in counter.sxid_counts().items()}
    assert sxids == xidcorpus.SXIDS.get(name, {})
    assert counter.unattributed == xidcorpus.UNATTRIBUTED.get(name, {})
    log.close()


def test_only_this_boot_and_only_the_kernel_count(make: Any) -> None:
    text = (
        corpus_text("xid-79-driver535-pid-unknown-crashdump")
        + f"#@boot {this_boot()}\n"
        + corpus_text("xid-13-driver535-a800-pid-unknown")
        # Any user can log this; only the kernel transport is the driver.
        + "#@transport stdout\n#@identifier evil\n"
        + "NVRM: Xid (PCI:0000:43:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        + "#@transport syslog\n"
        + "NVRM: Xid (PCI:0000:43:00): 48, pid=1, name=x, DBE\n"
    )
    log = KernelLog(make(text, boot=OTHER_BOOT))
    got = records(log)
    assert len(got) == 2
    assert all(time > 1e9 for time, _ in got)
    counter = XidCounter()
    for time_, message in got:
        counter.add(time_, message)
    assert summary(counter) == {("0000:43:00.0", 13): (2, "none", "restart_app")}


# NVIDIA/nvidia-docker#291 and #365: modprobe's words (the kernel has none for it).
NOT_FOUND = "modprobe: FATAL: Module nvidia not found in directory /lib/modules/4.4.0-83-generic"
# canonical/nvidia-graphics-drivers#61: modprobe's EKEYREJECTED under Secure Boot.
REJECTED = "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service"
XID = "NVRM: Xid (PCI:0000:43:00): 79, pid=1, name=x, GPU has fallen off the bus."


def test_the_module_loaders_records_go_to_their_own_sink(make: Any) -> None:
    directory = make(corpus_text("xid-13-driver535-a800-pid-unknown"))
    append(
        directory,
        # modprobe's stderr in a unit (nvidia-persistenced's ExecStartPre, udev's RUN), the
        # unit systemd-modules-load, and its own command name.
        userspace(NOT_FOUND, comm="modprobe", unit="nvidia-persistenced.service")
        + userspace(REJECTED, comm="modprobe", transport="syslog")
        + userspace("Failed to find module 'nvidia'", comm="systemd-modules-load")
        + userspace("Inserted module 'nvidia'", comm="kmod", unit="systemd-modules-load.service")
        # A loader logging an Xid's words is still no driver.
        + userspace(XID, comm="modprobe")
        # Forged: `logger -t modprobe` and `systemd-cat -t kernel` are logger's and cat's.
        + userspace(NOT_FOUND, comm="logger", identifier="modprobe", transport="syslog")
        + userspace(XID, comm="cat", identifier="kernel", transport="stdout")
        # Another boot's loader says nothing of this one.
        + userspace(REJECTED, comm="modprobe", boot=OTHER_BOOT),
    )
    log = KernelLog(directory)
    kernel: list[Record] = []
    loaders: list[Record] = []
    got = log.poll(lambda t, m: kernel.append((t, m)), lambda t, m: loaders.append((t, m)))
    assert log.error is None
    assert got == len(kernel) + len(loaders)
    assert [m for _, m in loaders] == [
        NOT_FOUND,
        REJECTED,
        "Failed to find module 'nvidia'",
        "Inserted module 'nvidia'",
        XID,
    ]
    assert all(t > 1e9 for t, _ in loaders)
    counter = XidCounter()
    for t, m in kernel:
        counter.add(t, m)
    assert summary(counter) == {("0000:43:00.0", 13): (2, "none", "restart_app")}
    # Without a sink for them they are skipped, and the kernel's records are the same.
    assert records(KernelLog(directory)) == kernel


def wait_for(log: KernelLog, want: int) -> list[Record]:
    """Poll as the agent's ticks would until ``want`` records came, within a deadline."""
    got: list[Record] = []
    deadline = time.monotonic() + 20
    fd = log.fileno()
    assert fd is not None
    while len(got) < want and time.monotonic() < deadline:
        select.select([fd], [], [], 0.2)
        got += records(log)
    return got


def test_appended_records_come_with_the_next_poll_and_a_restart_recounts(make: Any) -> None:
    directory = make(corpus_text("xid-48-63-94-driver550-dbe-rowremap"))
    log = KernelLog(directory)
    counter = counted(log)
    assert records(log) == []
    assert [f.code for f in counter.take_new([])] == [48, 63, 94]
    # What journald does: append to the open file.
    extra = make(corpus_text("xid-79-driver535-pid-unknown-crashdump"), "extra")
    append(directory, export(extra))
    for time_, message in wait_for(log, 4):
        counter.add(time_, message)
    assert records(log) == []
    assert [(f.slot, f.code) for f in counter.take_new([])] == [("0000:a1:00.0", 79)]
    # An agent restart: a fresh reader reads the boot from its start to the same counts.
    again = counted(KernelLog(directory))
    assert summary(again) == summary(counter)
    assert summary(counter)[("0000:a1:00.0", 79)] == (1, "critical", "reboot")
    log.close()


def test_a_reopened_journal_goes_on_where_it_stopped(make: Any) -> None:
    log = KernelLog(make(corpus_text("xid-13-31-32-driver418-no-pid")))
    assert len(records(log)) == 7
    log.close()
    assert records(log) == []


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 8])
def test_the_boot_read_a_chunk_at_a_time_hands_each_record_once(make: Any, chunk: int) -> None:
    # 7 kernel records: chunks that divide them, that do not, and one larger than all.
    directory = make(corpus_text("xid-13-31-32-driver418-no-pid"))
    whole = records(KernelLog(directory))
    assert len(whole) == 7
    log = KernelLog(directory, chunk=chunk)
    assert records(log) == whole
    assert log.error is None
    assert log.fileno() is not None  # open, watching for what comes next
    extra = make(corpus_text("xid-79-driver535-pid-unknown-crashdump"), "extra")
    append(directory, export(extra))
    assert len(wait_for(log, 4)) == len(records(KernelLog(extra)))
    log.close()


def test_placed_from_the_tail_only_where_the_last_entry_is_the_one_read_last(
    make: Any,
) -> None:
    # The end of the boot read is placed from the journal's tail (cheap) where its last
    # matching entry is the one read last; where more came in between, from the cursor.
    directory = make(corpus_text("xid-13-31-32-driver418-no-pid"))
    whole = records(KernelLog(directory))
    log = KernelLog(directory)
    reader = log._open()  # one record read, six came after it
    assert reader._next()
    log._cursor = reader._get_cursor()
    reader.close()
    log._reader = log._open(tail=True)
    rest: list[Record] = []
    log.poll(lambda time, message: rest.append((time, message)))
    assert rest == whole[1:]
    log.close()


def export_entry(fields: list[tuple[str, bytes]]) -> bytes:
    """One entry in the journal export format; MESSAGE in its binary-safe form."""
    out = b""
    for key, value in fields:
        if key == "MESSAGE":
            out += key.encode() + b"\n" + len(value).to_bytes(8, "little") + value + b"\n"
        else:
            out += key.encode() + b"=" + value + b"\n"
    return out + b"\n"


def test_odd_entries_are_read_without_raising(tmp_path: str) -> None:
    directory = os.path.join(tmp_path, "odd")
    os.mkdir(directory)
    common = [
        ("__REALTIME_TIMESTAMP", b"1700000000000000"),
        ("__MONOTONIC_TIMESTAMP", b"1000000"),
        ("_BOOT_ID", this_boot().encode()),
        ("_TRANSPORT", b"kernel"),
    ]
    stream = export_entry([*common, ("MESSAGE", b"NVRM: Xid (PCI:0000:01:00): 48, \xff\xfe bad")])
    stream += export_entry(common)  # no MESSAGE at all
    stream += export_entry([*common, ("MESSAGE", b"NVRM: Xid (PCI:0000:01:00): 13, ok")])
    append(directory, stream)
    log = KernelLog(directory)
    got = records(log)
    assert [message for _, message in got] == [
        "NVRM: Xid (PCI:0000:01:00): 48, \ufffd\ufffd bad",
        "NVRM: Xid (PCI:0000:01:00): 13, ok",
    ]
    assert got[0][0] == 1700000000.0
    os.remove(os.path.join(directory, "x.journal"))


def test_a_journal_that_cannot_be_opened_is_a_one_line_error(tmp_path: str) -> None:
    missing = os.path.join(tmp_path, "absent")
    log = KernelLog(missing)
    assert records(log) == []
    assert log.error == f"{missing}: cannot read: no such file or directory"
    empty = os.path.join(tmp_path, "empty")
    os.mkdir(empty)
    log = KernelLog(empty)
    assert records(log) == []
    assert log.error is not None
    assert log.error.startswith(f"{empty}: cannot read: no journal file this process may read")
    assert "\n" not in log.error
    assert log.fileno() is None


def test_permission_denied_as_an_unprivileged_user(make: Any) -> None:
    directory = make(corpus_text("xid-74-nvlink-domain0003"))
    os.chmod(os.path.join(directory, "x.journal"), 0o600)
    script = (
        "from gpuagent.sources.kernel.kernlog import KernelLog\n"
        f"log = KernelLog({directory!r}); print(log.poll(print), log.error)\n"
    )
    if os.geteuid() == 0:
        argv = [tool("setpriv"), "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    else:
        os.chmod(directory, 0)
        argv = []
    # nobody may not read the checkout (a fresh machine's is under /root): a copy of the
    # package goes where anyone may read it.
    with tempfile.TemporaryDirectory() as code:
        os.chmod(code, 0o755)  # noqa: S103 - for nobody to read
        package = os.path.join(code, "gpuagent")
        shutil.copytree(
            os.path.join(REPO, "gpuagent"), package, ignore=shutil.ignore_patterns("__pycache__")
        )
        for where, _dirs, files in os.walk(package):
            os.chmod(where, 0o755)  # noqa: S103 - for nobody to read
            for name in files:
                os.chmod(os.path.join(where, name), 0o644)
        proc = subprocess.run(
            [*argv, "/usr/bin/python3", "-c", script],
            capture_output=True,
            text=True,
            cwd=code,
            check=False,
            timeout=60,
        )
    os.chmod(directory, 0o700)
    assert proc.stderr == ""
    assert proc.stdout.startswith(f"0 {directory}: cannot read: ")


class BrokenReader:
    """A reader whose reads fail as a vanished or truncated journal file can."""

    def __init__(self, fail: BaseException) -> None:
        self.fail = fail
        self.closed = False

    def get_usage(self) -> int:
        return 1

    def add_match(self, *_: str, **__: str) -> None:
        pass

    def add_disjunction(self) -> None:
        pass

    def add_conjunction(self) -> None:
        pass

    def this_boot(self, _: str | None = None) -> None:
        pass

    def fileno(self) -> int:
        return 99

    def seek_head(self) -> None:
        pass

    def _next(self) -> bool:
        raise self.fail

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("fail", "reason"),
    [
        (OSError(74, "Bad message"), "bad message"),
        (PermissionError(13, "Permission denied"), "permission denied"),
        (ValueError("invalid entry"), "invalid entry"),
    ],
)
def test_read_errors_are_one_line_and_the_next_poll_retries(fail: Exception, reason: str) -> None:
    readers: list[BrokenReader] = []

    def open_reader(_: str) -> BrokenReader:
        readers.append(BrokenReader(fail))
        return readers[-1]

    log = KernelLog("/var/log/journal", open_reader=open_reader)
    assert records(log) == []
    assert log.error == f"/var/log/journal: cannot read: {reason}"
    assert readers[0].closed
    records(log)
    assert len(readers) == 2
    assert KernelLog("", open_reader=open_reader).where == "the system journal"


def test_a_journal_directory_it_may_not_open_is_one_line() -> None:
    # As root a directory's mode refuses nothing: the refusal sd-journal gives another user.
    def refused(directory: str) -> Any:
        raise PermissionError(13, "Permission denied", directory)

    log = KernelLog("/srv/journal", open_reader=refused)
    assert records(log) == []
    assert log.error == "/srv/journal: cannot read: permission denied"
