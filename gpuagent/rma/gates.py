"""NVIDIA's RMA gates on what the driver says of a board's memory (pure).

Each gate cites the NVIDIA document that sets it; none is gpuagent's own figure.  A gate the
board's driver does not report (``N/A``, or no such key) is ``met`` None: not known, never
"not met".

- ``row_remap_failure`` (Ampere and later): NVIDIA's "RMA Policy Thresholds for
  Row-Remapping" (:data:`ROW_REMAP_POLICY`) makes a row-remapping failure the RMA condition:
  a row remap needed on a bank that already holds :data:`BANK_REMAPS` (8) uncorrectable-error
  remaps, or a remap past the :data:`MAX_REMAPS` (512) the frame buffer supports ("Supports up
  to 512 remapping for the frame buffer", the guide's row-remapping table).  The driver's
  ``Remapping Failure Occurred`` flag says it happened; it is met there, or where the counts
  reach 512.  Per-bank counts are not printed by nvidia-smi: the histogram's ``None`` bucket
  is the banks with no spare row left (NVML's ``nvmlRowRemapperHistogramValues_t``), where the
  next uncorrectable error cannot be remapped.
- ``sram_threshold`` (Hopper and later drivers): the same guide's "RMA Policy Thresholds for
  SRAM Failure Modes" (:data:`SRAM_POLICY`) sets the uncorrectable SRAM error counts that are
  RMA criteria, and the driver's ``SRAM Threshold Exceeded`` flag says they were passed (NVML's
  ``nvmlEccSramErrorStatus_v1_t.bThresholdExceeded``: "if the error threshold of field diag is
  exceeded", :data:`SRAM_FLAG`).
- ``retired_pages`` (before Ampere: dynamic page retirement): NVIDIA's "Dynamic Page
  Retirement" (:data:`PAGE_RETIREMENT`) and the memory guide's table ("a maximum of 64
  retirements for the frame buffer"): at :data:`gpuagent.sources.probe.pages.LIMIT` (64)
  pages no further page can be retired, which the agent's ``retired_pages_limit`` also says.
  A GPU that remaps rows prints ``N/A`` there: the gate does not apply.

What follows a gate is NVIDIA's to decide: :data:`NEXT_STEP`, from its RMA process
(:data:`RMA_PROCESS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.rma.smiq import HISTOGRAM, Board
from gpuagent.sources.probe.pages import LIMIT as PAGES_LIMIT

__all__ = [
    "BANK_REMAPS",
    "MAX_REMAPS",
    "NEXT_STEP",
    "PAGE_RETIREMENT",
    "RMA_PROCESS",
    "ROW_REMAP_POLICY",
    "SRAM_FLAG",
    "SRAM_POLICY",
    "Gate",
    "judge",
]

# NVIDIA GPU Memory Error Management, "RMA Policy Thresholds for Row-Remapping".
ROW_REMAP_POLICY = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html"
# The same guide, "RMA Policy Thresholds for SRAM Failure Modes".
SRAM_POLICY = ROW_REMAP_POLICY
SRAM_FLAG = "https://docs.nvidia.com/deploy/nvml-api/api/structnvmlEccSramErrorStatus__v1__t.html"
PAGE_RETIREMENT = "https://docs.nvidia.com/deploy/dynamic-page-retirement/index.html"
# NVIDIA's RMA process: the Field Diagnostic is "a required piece of the RMA process".
RMA_PROCESS = "https://docs.nvidia.com/deploy/rma-process/index.html"
BANK_REMAPS = 8
MAX_REMAPS = 512
NEXT_STEP = (
    "Run NVIDIA's Field Diagnostic on this board and keep its log with an nvidia-bug-report.sh "
    "report taken soon after the failure; NVIDIA's RMA process asks for both, and NVIDIA (or "
    "the system's vendor) decides whether the board is eligible for an RMA."
)


@dataclass(frozen=True)
class Gate:
    """One gate: ``gate`` its name; ``met`` True, False, or None where the driver does not
    report it; ``reading`` what the driver said; ``rule`` NVIDIA's gate in words; ``source``
    the NVIDIA document that sets it (a URL)."""

    gate: str
    met: bool | None
    reading: str
    rule: str
    source: str


def judge(board: Board) -> tuple[Gate, ...]:
    """The gates of what ``-q`` said of ``board``, in a fixed order."""
    return (_row_remap(board), _sram(board), _pages(board))


def _row_remap(b: Board) -> Gate:
    rule = (
        f"a row remap failed (needed on a bank already holding {BANK_REMAPS} uncorrectable-error "
        f"remaps), or {MAX_REMAPS} rows remapped in all"
    )
    if b.remap_failure is None and b.remaps_correctable is None:
        return Gate("row_remap_failure", None, "not reported", rule, ROW_REMAP_POLICY)
    total = (b.remaps_correctable or 0) + (b.remaps_uncorrectable or 0)
    said = [
        f"remapping failure {_yes(b.remap_failure)}",
        f"{total} of {MAX_REMAPS} rows remapped ({b.remaps_correctable} correctable, "
        f"{b.remaps_uncorrectable} uncorrectable)",
    ]
    if b.remap_pending:
        said.append("a remap pending until the GPU is reset")
    if b.banks:
        said.append(
            "banks by spare rows left: "
            + ", ".join(f"{k.lower()} {b.banks[k]}" for k in HISTOGRAM if k in b.banks)
        )
    met = bool(b.remap_failure) or total >= MAX_REMAPS
    return Gate("row_remap_failure", met, "; ".join(said), rule, ROW_REMAP_POLICY)


def _sram(b: Board) -> Gate:
    rule = "the driver's SRAM Threshold Exceeded flag (NVIDIA's SRAM RMA thresholds passed)"
    flag = b.sram_threshold_exceeded
    reading = "not reported" if flag is None else f"SRAM threshold exceeded {_yes(flag)}"
    return Gate("sram_threshold", flag, reading, rule, SRAM_POLICY)


def _pages(b: Board) -> Gate:
    rule = f"{PAGES_LIMIT} pages retired (single-bit and double-bit), the most a GPU can retire"
    if b.pages_sbe is None or b.pages_dbe is None:
        reading = "not reported (a GPU that remaps rows retires no pages)"
        return Gate("retired_pages", None, reading, rule, PAGE_RETIREMENT)
    total = b.pages_sbe + b.pages_dbe
    reading = (
        f"{total} of {PAGES_LIMIT} pages retired ({b.pages_sbe} single-bit, {b.pages_dbe} "
        "double-bit)" + ("; a page pending until the GPU is reset" if b.pages_pending else "")
    )
    return Gate("retired_pages", total >= PAGES_LIMIT, reading, rule, PAGE_RETIREMENT)


def _yes(flag: bool | None) -> str:
    return "not reported" if flag is None else ("Yes" if flag else "No")
