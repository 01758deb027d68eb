"""Fuzz targets (issue 40): each parser of what others write (a tool's answer, a journal
field, a state file, journald.conf) returns a value or raises its own one-line error, never
another exception.  Hypothesis from Debian's python3-hypothesis, derandomised (the same
examples every run) and bounded (a few hundred examples a target, well under 20 s in all)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from gpuagent.held import _parsed as held_parsed
from gpuagent.sources.imex import domain
from gpuagent.sources.kernel import clears, timeline
from gpuagent.sources.nvlink import nvlink
from gpuagent.sources.probe import smi
from gpuagent.sources.retention import judge
from gpuagent.sources.vgpu import licence
from gpuagent.sources.wear import boards, counters
from gpuagent.untrusted import capped, printable, whole

BOUNDED = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# Digits of every kind (², ٣, a 5,000-digit run) among the words the parsers look for.
_DIGITY = st.sampled_from(["\u00b2", "\u0663", "9" * 5000, "-1", "0", "17", "0x1f", "1e999"])
_WORDS = st.sampled_from(
    [
        "Node #",
        " - ",
        "READY",
        "Domain State: ",
        "UP",
        "Nodes From\\To ",
        " C ",
        "GPU 00000000:02:01.0",
        "    vGPU Software Licensed Product",
        "        License Status : ",
        "    GPU Virtualization Mode",
        "Link 3: ",
        " GB/s",
        "GPU 0: H100 (UUID: GPU-1)",
        "Replay Errors: ",
        "00000000:18:00.0, ",
        "[N/A]",
        "\n",
        ", ",
        "G",
        "\x1b[2K",
    ]
)
TEXT = st.lists(st.one_of(_WORDS, _DIGITY, st.text(max_size=20)), max_size=30).map("".join)
# JSON as json.loads makes it, with numbers of any size.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
SMI_FIELDS = ("pci.bus_id", "index", "uuid", "name", "temperature.gpu", "memory.used")


@seed(40)
@BOUNDED
@given(TEXT)
@example("Nodes From\\To  0 \u00b2\nDomain State: UP")  # each the run's case (issue 40)
@example(f"Node #{'9' * 5000} - a - READY\nDomain State: DOWN")
@example(f"Node #1 - {'a' * 200_000} - DOWN\nDomain State: DOWN")
def test_imex_domain(text: str) -> None:
    read = domain.parse(text)
    if read is not None:
        found = domain.finding(read)
        assert found is None or len(found.message) < 4000


@seed(40)
@BOUNDED
@given(TEXT)
def test_journald_size(text: str) -> None:
    got = judge.size(text)
    assert got is None or 0 <= got < 2**64


@seed(40)
@BOUNDED
@given(TEXT)
def test_vgpu_licence(text: str) -> None:
    for g in licence.parse(text):
        licence.finding(g, "the licence server")


@seed(40)
@BOUNDED
@given(TEXT)
def test_smi_csv(text: str) -> None:
    with contextlib.suppress(smi.ParseError):
        smi.parse_output(text, SMI_FIELDS)


@seed(40)
@BOUNDED
@given(TEXT)
def test_nvlink(text: str) -> None:
    nvlink.parse_status(text)
    nvlink.parse_counters(text)


# JSON of what a WEAR_BOARDS value holds: lists of objects with its keys and others.
_KEYS = st.sampled_from(["pci_slot", "gpu_uuid", "serial", "remapped_rows_correctable", "x"])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner) | st.dictionaries(_KEYS, inner),
)


@seed(40)
@BOUNDED
@given(TEXT)
def test_wear_counters(text: str) -> None:
    with contextlib.suppress(ValueError):
        counters.parse(text, ("remapped_rows.correctable",))


@seed(40)
@BOUNDED
@given(st.one_of(TEXT, _JSON.map(json.dumps)))
def test_wear_boards(text: str) -> None:
    # A record's WEAR_BOARDS: anyone may log one; its boards or none, never an error.
    assert all(b.counts for b in boards.read(text))


@seed(40)
@BOUNDED
@given(
    st.dictionaries(
        st.sampled_from(
            [
                *("_AUDIT_LOGINUID", "XID", "PCI_SLOT", "MESSAGE_ID", "_SYSTEMD_UNIT"),
                *("PROBLEM", "_TRANSPORT", "MESSAGE", "KIND", "CLEARED_BY", "_UID", "GPU_UUID"),
            ]
        ),
        st.one_of(_DIGITY, TEXT).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )
)
def test_journal_fields(entry: dict[str, bytes]) -> None:
    # A clear's or an agent's line with any field: the timeline's steps or none.
    for unit in ("gpuagent.service", None):
        fields: dict[str, object] = dict(entry)
        if unit is not None:
            fields["_SYSTEMD_UNIT"] = unit.encode()
        clears.person(fields)
        steps = timeline.events([(1.7e9, fields)], None)
        assert "\x1b" not in timeline.render(steps)


@seed(40)
@BOUNDED
@given(JSON)
@example(
    {"source": "s", "pci_slot": "", "kind": "k", "severity": "warning", "action": "check_host"}
    | {"message": "m", "extra": [], "since": 10**400}
)
def test_problems_json(data: Any) -> None:
    try:
        held_parsed({"boot_id": "b", "problems": [data], "told": []})
        held_parsed(data)
    except (TypeError, ValueError):
        pass


@seed(40)
@BOUNDED
@given(st.text())
def test_the_helpers(text: str) -> None:
    got = whole(text)
    assert got is None or (text.isascii() and 0 <= got < 10**18)
    assert len(capped(text)) <= 200
    assert printable(text).isprintable()
