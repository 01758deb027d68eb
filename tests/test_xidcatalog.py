"""gpuagent.sources.kernel.xidcatalog against NVIDIA's Xid catalog, every code of it, and a site's
[xid] table.

The reference table (tests/data/reference/xid-catalog.tsv, a byte-exact copy of the shared
reference) holds each code's severity and action as derived from NVIDIA's resolution buckets
("Analyzing Xid Errors with the Xid Catalog", docs.nvidia.com/deploy/xid-errors), and the
buckets themselves.  gpuagent follows it; where it departs, the entry's ``why`` says why.
"""

from __future__ import annotations

import csv
import os
from dataclasses import replace

import pytest

from gpuagent.configkeys import Override
from gpuagent.health import ACTIONS, CRITICAL, WARNING
from gpuagent.sources.kernel.xid import Xid, assess
from gpuagent.sources.kernel.xidcatalog import CATALOG, NONE, lookup, override
from gpuagent.sources.kernel.xidcount import XidCounter, finding
from gpuagent.views import Finding, XidCount, XidInfo
from tests import xidcorpus

TSV = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "reference", "xid-catalog.tsv"
)


def rows() -> dict[int, dict[str, str]]:
    with open(TSV, encoding="utf-8", newline="") as f:
        return {int(r["code"]): r for r in csv.DictReader(f, delimiter="\t")}


ROWS = rows()
# NVIDIA's immediate buckets that name one action; the others (WORKFLOW_*, CONTACT_SUPPORT,
# UPDATE_SWFW, CHECK_UVM, none) depend on the line or on a person, and are judged by the
# table's own severity and action only.
BUCKETS = {
    "RESTART_APP": (NONE, "restart_app"),
    "IGNORE": (NONE, "none"),
    "RESET_GPU": (None, "reset_gpu"),
    "RESTART_BM": (None, "reboot"),
    "RESTART_VM": (None, "reboot"),
    "CHECK_MECHANICALS": (None, "check_host"),
}


def table(row: dict[str, str]) -> tuple[str, str]:
    """The table's severity and action in gpuagent's terms: an application Xid (warning,
    restart_app) and an informational one (info) are counted without a problem."""
    severity, action = row["severity"], row["action"]
    if severity == "info" or (severity == WARNING and action == "restart_app"):
        return NONE, action
    return severity, action


def test_the_table_is_the_shared_reference_and_has_every_code() -> None:
    assert len(ROWS) == 112
    assert min(ROWS) == 8 and max(ROWS) == 172


def test_every_code_of_the_table_is_in_the_catalog_and_no_other() -> None:
    assert sorted(CATALOG) == sorted(ROWS)


@pytest.mark.parametrize("code", sorted(ROWS))
def test_each_code_follows_the_table_or_says_why(code: int) -> None:
    info, row = CATALOG[code], ROWS[code]
    assert info.name and info.advice and "\n" not in info.advice
    assert info.action in ACTIONS and info.severity in (NONE, WARNING, CRITICAL)
    departs = (info.severity, info.action) != table(row)
    bucket = BUCKETS.get(row["nvidia_immediate"])
    if bucket is not None:
        severity, action = bucket
        departs = departs or info.action != action or severity not in (None, info.severity)
    assert bool(info.why) == departs, (code, info, table(row), row["nvidia_immediate"])


def test_the_application_and_ignore_codes_of_the_issue() -> None:
    # Issue 17: restart the app, counted, the GPU stays ok.
    app = [11, 25, 39, 40, 41, 60, 70, 71, 72, 75, 76, 77, 80, 82, 83, 84, 85, 86, 88, 89]
    app += [*range(96, 106), *range(126, 136), 139]
    for code in app:
        assert (CATALOG[code].severity, CATALOG[code].action) == (NONE, "restart_app"), code
    for code in (37, 38, 44, 66, 67, 93, 106, 107, 141, 152, 153, 160, 161):
        assert (CATALOG[code].severity, CATALOG[code].action) == (NONE, "none"), code
    assert (CATALOG[110].severity, CATALOG[110].action) == (CRITICAL, "reset_gpu")
    assert (CATALOG[151].severity, CATALOG[151].action) == (CRITICAL, "reboot")
    assert (CATALOG[156].severity, CATALOG[156].action) == (WARNING, "reset_gpu")
    # NVIDIA: CHECK_MECHANICALS, the board's seating and power; not an RMA.
    assert (CATALOG[54].severity, CATALOG[54].action) == (CRITICAL, "check_host")
    # Stricter than NVIDIA's RESET_GPU, and the entry says why.
    assert CATALOG[64].action == "drain_and_rma" and "RMA criterion" in CATALOG[64].why


def test_a_nonfatal_145_is_the_job_s_to_restart() -> None:
    # NVIDIA/nccl#2241 (a B200): the poster's Xid 145 line, its slot redacted as "...".
    (line,) = [m for m in xidcorpus.messages("xid-145-137-b200-user-redacted-pci") if ": 145," in m]
    assert line == "NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)"
    counter = XidCounter()
    counter.add(1.0, line.replace("PCI:...", "PCI:0000:1b:00"))
    (finding,) = counter.findings([])["0000:1b:00.0"]
    assert (finding.severity, finding.action) == (WARNING, "restart_app")
    fatal = assess(Xid("0000:1b:00", 145, "RLW_RXPIPE Fatal XC0 i0 Link 11"))
    assert (fatal.severity, fatal.action) == (CRITICAL, "reset_gpu")
    nonfatal = assess(Xid("0000:1b:00", 146, "TLW Nonfatal XC0 i0 Link 2"))
    assert (nonfatal.severity, nonfatal.action) == (WARNING, "none")


@pytest.mark.parametrize(
    ("site", "severity", "action"),
    [
        (None, CRITICAL, "reset_gpu"),
        (Override(), CRITICAL, "reset_gpu"),
        (Override(severity="none"), NONE, "reset_gpu"),
        (Override(severity="warning"), WARNING, "reset_gpu"),
        (Override(action="reboot"), CRITICAL, "reboot"),
        (Override("critical", "drain_and_rma"), CRITICAL, "drain_and_rma"),
    ],
)
def test_override_sets_what_the_site_says(
    site: Override | None, severity: str, action: str
) -> None:
    info = override(lookup(48), site)
    assert (info.severity, info.action, info.name) == (severity, action, lookup(48).name)
    assert (info == lookup(48)) == (site is None or site == Override())


def test_a_site_table_counts_94_without_a_problem_and_makes_13_critical() -> None:
    # Issue 17's two examples: 94 = { severity = "none" }, 13 = { severity = "critical",
    # action = "reset_gpu" }; the lines are the corpus's (driver 550 and 535).
    table = {94: Override(severity="none"), 13: Override("critical", "reset_gpu")}
    uncorrectable = "Contained: SM (0x1). RST: Yes, D-RST: No"
    assert assess(Xid("0000:52:00", 94, uncorrectable)).severity == CRITICAL
    assert assess(Xid("0000:52:00", 94, uncorrectable), table).severity == NONE
    text = xidcorpus.messages("xid-13-driver535-a800-pid-unknown")[0].split("): 13, ", 1)[1]
    info = assess(Xid("0000:43:00", 13, text), table)
    assert (info.severity, info.action) == (CRITICAL, "reset_gpu")
    assert "[xid] table" in info.advice
    assert assess(Xid("0000:43:00", 13, text)).severity == NONE
    assert assess(Xid("0000:43:00", 31, text), table) == lookup(31)


def count(info: XidInfo, last: float) -> XidCount:
    return XidCount(63, 1, 100.0, last, info, "Row Remapper: New row marked for remapping")


def test_a_warning_ends_after_the_hold_without_a_recurrence() -> None:
    # xid-48-63-94-driver550-dbe-rowremap: Xid 63 "Row Remapper: New row (…) marked for
    # remapping, reset gpu to activate." is a warning.
    c = count(lookup(63), last=1000.0)
    assert isinstance(finding(c), Finding)  # no hold given: until the next boot
    # The hold says how it ends, and what its end line says (issue 39).
    held = finding(c, hold=3600.0)
    assert held is not None and held.lapse == "no record for 3600 s (xid_warning_hold)"
    assert finding(c, now=1000.0 + 3599.9, hold=3600.0) == held
    assert finding(c, now=1000.0 + 3600.0, hold=3600.0) is None
    c = replace(c, last=5000.0)  # it came back
    assert finding(c, now=4600.0 + 3600.0, hold=3600.0) == finding(c, hold=3600.0)
    assert finding(c, now=1e9) == finding(c)


def test_a_critical_xid_holds_whatever_the_hold() -> None:
    c = count(lookup(48), last=1000.0)
    assert finding(c, now=1e9, hold=1.0) == finding(c) is not None
    assert finding(count(lookup(13), last=1000.0), now=1000.0, hold=3600.0) is None
