"""Logging: structured journal fields through a fake sender, plain stderr otherwise."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import pytest
from systemd.journal import JournalHandler

from gpuagent import logs
from gpuagent.logs import Event, EventLog
from gpuagent.views import Failure


def test_every_failure_class_but_exit_18_s_has_an_event() -> None:
    for failure in Failure:
        if failure is Failure.VERSION_MISMATCH:  # driver_mismatch's lines tell it
            with pytest.raises(KeyError):
                Event.failing(failure.value)
            continue
        assert Event.failing(failure.value).name == f"FAILING_{failure.name}"


def test_message_ids_are_unique_128_bit_hex() -> None:
    ids = [e.value for e in Event]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_journal_fields_through_a_fake_sender() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    # JournalHandler passes the record's own attributes too ("message", "msg", ...).
    def sender(*args: str, **fields: Any) -> None:
        sent.append((args[0], fields))

    logger = logging.getLogger("test.journal")
    logger.handlers[:] = [JournalHandler(sender_function=sender, SYSLOG_IDENTIFIER="gpuagent")]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    EventLog(logger)(
        logging.WARNING,
        Event.FAILING_DRIVER_NOT_LOADED,
        "nvidia-smi failing",
        failure_class="driver_not_loaded",
        exit_code=9,
        pci_slot=None,
    )
    ((message, fields),) = sent
    assert message == "nvidia-smi failing"
    assert fields["MESSAGE_ID"] == Event.FAILING_DRIVER_NOT_LOADED.value
    assert fields["SYSLOG_IDENTIFIER"] == "gpuagent"
    assert fields["FAILURE_CLASS"] == "driver_not_loaded"
    assert fields["EXIT_CODE"] == "9"
    assert fields["GPUAGENT_EVENT"] == "failing_driver_not_loaded"
    assert fields["PRIORITY"] == "4"
    assert "PCI_SLOT" not in fields


def test_stderr_lines_are_plain(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logs.setup("info", journal=False)
    EventLog(logger)(logging.INFO, Event.RECOVERED, "nvidia-smi is answering again")
    EventLog(logger)(logging.DEBUG, None, "hidden at info")
    assert capsys.readouterr().err == "info: nvidia-smi is answering again\n"


def test_journal_stream_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    st = os.fstat(sys.stderr.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    assert logs.journal_stream()
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")
    assert not logs.journal_stream()
    monkeypatch.setenv("JOURNAL_STREAM", "garbage")
    assert not logs.journal_stream()
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not logs.journal_stream()
