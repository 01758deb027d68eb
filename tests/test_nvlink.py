"""gpuagent.sources.nvlink.nvlink: every nvlink capture of the corpus parsed, and the NVLink rules.

The captures are data/corpus/nvlink (byte-exact copies of ../shared/corpus/nvlink) and the two
nvlink answers in data/corpus/errors.  No public capture has a non-zero error counter: the
rising counters below are the capture's own lines with other numbers in them
(replay.nvlink_answer), and the same for an inactive link on an H200.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.nvlink.nvlink import (
    GpuState,
    Link,
    Parsed,
    Watch,
    findings_by_slot,
    parse_counters,
    parse_status,
    slots_by_key,
)
from gpuagent.views import Finding
from tests import replay
from tests.replay import CORPUS

H100_UUID = "GPU-00000000-0000-0000-0000-000000000000"
H200 = "nvlink-status-h200-driver590.48.01-18-links.txt"
COUNTERS = "nvlink-errorcounters-h100-80gb-hbm3-driverUNKNOWN-placeholder-uuid-TRIMMED.txt"
SLOTS = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]


def up(n: int, speed: float) -> list[Link]:
    return [Link(i, True, f"{speed:g} GB/s", speed) for i in range(n)]


def speeds(n: int, text: str) -> list[Link]:
    return [Link(i, True, text, float(text.split(maxsplit=1)[0])) for i in range(n)]


# Each capture: the command it answers, then per GPU (index, uuid, state, links up, links
# not up), and the lines that cannot be read.
Expect = tuple[str, list[tuple[int, str, GpuState, int | None, list[int]]], list[str]]
CAPTURES: dict[str, Expect] = {
    "nvlink-status-a100-sxm4-40gb-driver535.161.08-i0-tab-indent.txt": (
        "status",
        [(0, "GPU-fde0a018-ad1a-bbec-ccf6-50a9f64bd178", GpuState.LINKS, 12, [])],
        [],
    ),
    "nvlink-status-a100-sxm4-80gb-driverUNKNOWN-single-gpu-tab-indent.txt": (
        "status",
        [(7, "GPU-c7e253b0-c227-6f10-e860-7482c85e7ce8", GpuState.LINKS, 12, [])],
        [],
    ),
    "nvlink-status-a100-sxm4-80gb-x8-driverUNKNOWN-space-indent.txt": (
        "status",
        [
            (0, "GPU-5269b708-678a-b1a8-60f0-c90406537486", GpuState.LINKS, 12, []),
            (1, "GPU-a7605225-d684-1f65-4ad4-ee2ab39338b4", GpuState.LINKS, 12, []),
            (2, "GPU-483e6bb6-bb11-8916-e22f-d1d69abbafaa", GpuState.LINKS, 12, []),
            (3, "GPU-6e4fbadc-10d9-a63a-8988-9a0d320ff1a0", GpuState.LINKS, 12, []),
            (4, "GPU-82ef2c67-965f-a411-1413-f5e1d756bcdb", GpuState.LINKS, 12, []),
            (5, "GPU-375df896-019b-a009-42e5-ce9ed21bd8cc", GpuState.LINKS, 12, []),
            (6, "GPU-68d0f80e-e2f6-7717-ce0c-ea5f17b6a180", GpuState.LINKS, 12, []),
            (7, "*", GpuState.LINKS, 12, []),
        ],
        [],
    ),
    # "GPU-xxx": redacted by the poster, so the GPU is known by its index.
    "nvlink-status-b200-driverUNKNOWN-all-links-inactive-uuid-redacted.txt": (
        "status",
        [(2, "", GpuState.ALL_INACTIVE, 0, [])],
        [],
    ),
    # The poster ended the block with "...": one line that cannot be read, the rest is.
    "nvlink-status-gb200-driverUNKNOWN-53GBs-TRIMMED.txt": (
        "status",
        [
            (0, "GPU-d1b93026-6d5b-03bd-3a71-f85b47a61bde", GpuState.LINKS, 18, []),
            (1, "GPU-39ac7bce-e3d6-b426-008e-fa47897c72d5", GpuState.LINKS, 2, []),
        ],
        ["..."],
    ),
    "nvlink-status-h100-80gb-hbm3-driver590.48.01-18-links.txt": (
        "status",
        [(0, H100_UUID, GpuState.LINKS, 18, [])],
        [],
    ),
    H200: ("status", [(0, H100_UUID, GpuState.LINKS, 18, [])], []),
    "nvlink-status-l40s-driver595.80-device-does-not-support-nvlink.txt": (
        "status",
        [(0, H100_UUID, GpuState.NO_NVLINK, None, [])],
        [],
    ),
    "nvlink-status-rtx4080super-driver595.71.05-device-does-not-support-nvlink.txt": (
        "status",
        [(0, H100_UUID, GpuState.NO_NVLINK, None, [])],
        [],
    ),
    # "...." and "UUID: ..." by the poster; links 3 and 5 print <inactive>.
    "nvlink-status-v100-sxm2-32gb-driverUNKNOWN-inactive-links-EDITED.txt": (
        "status",
        [(3, "", GpuState.LINKS, 4, [3, 5])],
        ["...."],
    ),
    # links 2-16 replaced by "[...]" by the author.
    COUNTERS: (
        "counters",
        [(0, "GPU-abcdefab-cdef-abdc-abcd-abababababab", GpuState.LINKS, None, [])],
        ["[...]"],
    ),
    # nvlink -info is not a link list: every line below a header is unreadable as --status.
    "nvlink-info-gb200-driverUNKNOWN-nvle-firmware-versions-TRIMMED.txt": (
        "status",
        [
            (0, "GPU-d1b93026-6d5b-03bd-3a71-f85b47a61bde", GpuState.LINKS, None, []),
            (1, "GPU-39ac7bce-e3d6-b426-008e-fa47897c72d5", GpuState.LINKS, None, []),
        ],
        ["NVLE: disabled", "Firmware Version:", "MSE: 14:4:0", "NETIR: 36:2014:1862"],
    ),
    # nvidia-smi -q is another format altogether: nothing is guessed from it.
    "query-q-fabric-section-mnnvl-driverUNKNOWN-health-unhealthy-grep-C3.txt": (
        "status",
        [],
        ["Fabric", "State                             : Completed"],
    ),
    "query-q-h100-80gb-hbm3-driver590.48.01-fabric-completed-clique0.txt": (
        "status",
        [],
        ["==============NVSMI LOG=============="],
    ),
    "query-q-h100-80gb-hbm3-x8-driver535.161.08-gpu0-fabric-state-status-only-TRIMMED.txt": (
        "status",
        [],
        ["==============NVSMI LOG=============="],
    ),
    "query-q-l40s-driver595.80-fabric-na-partition-assigned.txt": (
        "status",
        [],
        ["==============NVSMI LOG=============="],
    ),
}
ERRORS: dict[str, Expect] = {
    "nvlink-all-links-inactive-exit0.txt": (
        "status",
        [(0, H100_UUID, GpuState.ALL_INACTIVE, 0, [])],
        [],
    ),
    # Unknown, not "no NVLink": an H100 in MIG mode has its links.
    "nvlink-not-supported-in-MIG-mode-exit0.txt": (
        "status",
        [(0, H100_UUID, GpuState.MIG, None, [])],
        [],
    ),
}


def read(sub: str, name: str) -> str:
    with open(os.path.join(CORPUS, sub, name), encoding="utf-8", newline="") as f:
        return f.read()


def test_every_nvlink_capture_is_covered() -> None:
    names = {n for n in os.listdir(os.path.join(CORPUS, "nvlink")) if not n.endswith(".source.txt")}
    assert names == set(CAPTURES)
    errors = {n for n in os.listdir(os.path.join(CORPUS, "errors")) if n.startswith("nvlink-")}
    assert {n for n in errors if not n.endswith(".source.txt")} == set(ERRORS)


def test_the_copies_are_byte_exact() -> None:
    shared = os.path.join(os.path.dirname(CORPUS), "..", "..", "..", "shared", "corpus", "nvlink")
    if not os.path.isdir(shared):
        pytest.skip("../shared/corpus is not there")
    for name in os.listdir(shared):
        with (
            open(os.path.join(shared, name), "rb") as a,
            open(os.path.join(CORPUS, "nvlink", name), "rb") as b,
        ):
            assert a.read() == b.read(), name


@pytest.mark.parametrize(
    ("sub", "name"), [("nvlink", n) for n in sorted(CAPTURES)] + [("errors", n) for n in ERRORS]
)
def test_capture(sub: str, name: str) -> None:
    command, gpus, unreadable = {**CAPTURES, **ERRORS}[name]
    text = read(sub, name)
    parsed = parse_counters(text) if command == "counters" else parse_status(text)
    got = [
        (g.index, g.uuid, g.state, g.active, [link.number for link in g.links if not link.up])
        for g in parsed.gpus
    ]
    want = [(i, got[n][1] if u == "*" else u, s, a, d) for n, (i, u, s, a, d) in enumerate(gpus)]
    assert got == want
    assert list(parsed.unreadable[: len(unreadable)]) == unreadable
    if not name.startswith(("query-q", "nvlink-info")):
        assert len(parsed.unreadable) == len(unreadable)
    # Whatever the answer, the rules take it without complaint.
    watch = Watch(600, 0, 16)
    watch.status(parsed)
    watch.counters(0.0, parsed)
    assert all(f.kind == "nvlink_down" for fs in watch.findings().values() for f in fs)


def test_link_values_and_speeds() -> None:
    a100 = parse_status(
        read("nvlink", "nvlink-status-a100-sxm4-80gb-x8-driverUNKNOWN-space-indent.txt")
    )
    assert a100.gpus[0].links == speeds(12, "25 GB/s")
    gb200 = parse_status(read("nvlink", "nvlink-status-gb200-driverUNKNOWN-53GBs-TRIMMED.txt"))
    assert gb200.gpus[0].links == speeds(18, "53.125 GB/s")
    assert gb200.gpus[0].name == "NVIDIA GB200"
    v100 = parse_status(
        read("nvlink", "nvlink-status-v100-sxm2-32gb-driverUNKNOWN-inactive-links-EDITED.txt")
    )
    assert v100.gpus[0].links[3] == Link(3, False, "<inactive>")
    assert v100.gpus[0].links[0] == Link(0, True, "25.781 GB/s", 25.781)
    assert v100.gpus[0].key == "index:3"


def test_counters_of_the_capture() -> None:
    parsed = parse_counters(read("nvlink", COUNTERS))
    counts = {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}
    assert parsed.gpus[0].counters == {0: counts, 1: counts, 17: counts}
    assert parsed.has_links is False  # a counters answer has no link states


@pytest.mark.parametrize(
    ("text", "no_nvlink"),
    [
        ("", True),  # drivers before 595 print nothing for a GPU without NVLink
        ("\n", True),
        (
            read("nvlink", "nvlink-status-l40s-driver595.80-device-does-not-support-nvlink.txt"),
            True,
        ),
        (read("errors", "nvlink-not-supported-in-MIG-mode-exit0.txt"), False),
        (read("errors", "nvlink-all-links-inactive-exit0.txt"), False),
        (read("nvlink", H200), False),
        ("garbage\n", False),  # not understood is not "no NVLink"
    ],
)
def test_no_nvlink(text: str, no_nvlink: bool) -> None:
    assert parse_status(text).no_nvlink is no_nvlink


@pytest.mark.parametrize(
    "line",
    [
        "GPU 0: NVIDIA GB300",  # a header without a UUID (a documentation example)
        "GPU 12: NVIDIA H100 80GB HBM3 (UUID: GPU-12345678-1234-1234-1234-123456789abc)",
    ],
)
def test_headers(line: str) -> None:
    parsed = parse_status(line + "\n\t Link 0: 26.562 GB/s\n")
    assert parsed.unreadable == ()
    assert parsed.gpus[0].active == 1


@pytest.mark.parametrize(
    "line",
    [
        "\t Link 0: Replay Errors: many",  # not a count
        "\t Link 0: 26.562 GB/s",  # a --status line in a --errorcounters answer
        "\t Link 0: Replay Errors: 123456789012345678901",  # too many digits
    ],
)
def test_counter_lines_that_cannot_be_read(line: str) -> None:
    parsed = parse_counters(f"GPU 0: X (UUID: {H100_UUID})\n{line}\n")
    assert parsed.unreadable == (line.strip(),)


def test_counters_na_and_new_names_are_kept() -> None:
    text = (
        f"GPU 0: NVIDIA GB200 (UUID: {H100_UUID})\n\t Link 0: Replay Errors: N/A\n"
        "\t Link 0: Link Recovery Successful Events: 3\n"
    )
    parsed = parse_counters(text)
    assert parsed.gpus[0].counters == {
        0: {"Replay Errors": None, "Link Recovery Successful Events": 3}
    }


def test_a_whole_gpu_line_after_links_and_lines_before_any_header() -> None:
    text = (
        "\t Link 0: 25 GB/s\nGPU 0: X (UUID: GPU-1)\n\t Link 0: 25 GB/s\n"
        "Device does not have or support Nvlink\n"
    )
    parsed = parse_status(text)
    assert parsed.unreadable == ("Link 0: 25 GB/s", "Device does not have or support Nvlink")
    assert parsed.gpus[0].state is GpuState.LINKS


# --- the rules, on H200 hosts made from the capture (one block per slot) -----------------


def status(overrides: dict[str, Any] | None = None, slots: list[str] = SLOTS) -> Parsed:
    return parse_status(replay.nvlink_answer(read("nvlink", H200), slots, overrides))


def counters(overrides: dict[str, Any] | None = None) -> Parsed:
    return parse_counters(
        replay.nvlink_answer(read("nvlink", COUNTERS), SLOTS, overrides, counters=True)
    )


def uuid(slot: str) -> str:
    return replay.gpu_uuid(slot)


def kinds(watch: Watch) -> dict[str, list[tuple[str, str, str, str]]]:
    return {
        k: [(f.kind, f.severity, f.action, f.message) for f in fs]
        for k, fs in watch.findings().items()
    }


def test_a_healthy_host_has_no_problem() -> None:
    w = Watch(600, 0, 16)
    w.status(status())
    w.counters(0, counters())
    assert w.findings() == {}


def test_a_link_that_was_up_in_this_boot_and_is_not() -> None:
    w = Watch(600, 0, 16)
    w.status(status())
    w.status(status({SLOTS[1]: {"3": "<inactive>", "7": "<inactive>"}}))
    assert kinds(w) == {
        uuid(SLOTS[1]): [
            (
                "nvlink_down",
                CRITICAL,
                "reset_gpu",
                "links 3, 7 down, up earlier in this boot; 16 links up where another "
                "NVIDIA H200 on this host has 18",
            )
        ]
    }
    w.status(status())  # back up: the problem ends
    assert w.findings() == {}


def test_fewer_links_than_the_others_of_its_model_from_the_first_read() -> None:
    w = Watch(600, 0, 16)
    w.status(status({SLOTS[2]: {"17": "<inactive>"}}))
    assert kinds(w) == {
        uuid(SLOTS[2]): [
            (
                "nvlink_down",
                CRITICAL,
                "reset_gpu",
                "17 links up where another NVIDIA H200 on this host has 18",
            )
        ]
    }


def test_a_gpu_whose_links_are_all_inactive_among_others_that_are_up() -> None:
    # As on the B200 node of leptonai/gpud#1085: one GPU says "all links are inActive".
    line = read("nvlink", "nvlink-status-b200-driverUNKNOWN-all-links-inactive-uuid-redacted.txt")
    w = Watch(600, 0, 16)
    w.status(status({SLOTS[0]: line.splitlines()[1]}))
    assert [f.message for f in w.findings()[uuid(SLOTS[0])]] == [
        "0 links up where another NVIDIA H200 on this host has 18"
    ]


def test_all_inactive_after_being_up() -> None:
    w = Watch(600, 0, 16)
    w.status(status(slots=SLOTS[:1]))
    inactive = read("errors", "nvlink-all-links-inactive-exit0.txt").splitlines()[1]
    w.status(status({SLOTS[0]: inactive}, slots=SLOTS[:1]))
    message = w.findings()[uuid(SLOTS[0])][0].message
    assert message.startswith("links 0, 1, 2, ")
    assert message.endswith(", 17 down, up earlier in this boot")


def test_a_lone_gpu_with_inactive_links_from_the_start_is_not_judged() -> None:
    # The V100 of Azure/azhpc-diagnostics#73 alone: nothing to compare it with, no history.
    w = Watch(600, 0, 16)
    w.status(
        parse_status(
            read("nvlink", "nvlink-status-v100-sxm2-32gb-driverUNKNOWN-inactive-links-EDITED.txt")
        )
    )
    assert w.findings() == {}


def test_a_gpu_in_mig_mode_is_unknown() -> None:
    mig = read("errors", "nvlink-not-supported-in-MIG-mode-exit0.txt").splitlines()[1]
    w = Watch(600, 0, 16)
    w.status(status())
    w.status(status({SLOTS[3]: mig}))
    assert w.findings() == {}
    # Its links seen up earlier are not forgotten: out of MIG mode with a link down, it is.
    w.status(status({SLOTS[3]: {"5": "<inactive>"}}))
    assert "link 5 down, up earlier in this boot" in w.findings()[uuid(SLOTS[3])][0].message


def test_other_models_are_not_peers() -> None:
    text = replay.nvlink_answer(read("nvlink", H200), SLOTS[:1]) + replay.nvlink_answer(
        read("nvlink", "nvlink-status-a100-sxm4-80gb-driverUNKNOWN-single-gpu-tab-indent.txt"),
        SLOTS[1:2],
    ).replace("GPU 0:", "GPU 1:")
    w = Watch(600, 0, 16)
    w.status(parse_status(text))
    assert w.findings() == {}  # 12 A100 links are not fewer than 18 H200 ones


def test_a_gpu_gone_from_the_answer_has_no_nvlink_problem() -> None:
    w = Watch(600, 0, 16)
    w.status(status())
    w.status(status(slots=SLOTS[:3]))
    assert w.findings() == {}


def rec(
    link: int, value: int, counter: str = "Recovery Errors", slot: str = SLOTS[0]
) -> dict[str, Any]:
    return {slot: {str(link): {counter: str(value)}}}


def test_a_lifetime_count_at_start_is_not_a_rise() -> None:
    w = Watch(600, 0, 16)
    w.counters(0, counters(rec(14, 505)))
    assert w.findings() == {}


def test_a_recovery_counter_that_rises() -> None:
    # marin-community/marin#9086: GPU 0 link 14 held 505 recovery events and kept rising.
    w = Watch(600, 0, 16)
    w.counters(0, counters(rec(14, 505)))
    w.counters(60, counters(rec(14, 542)))
    assert kinds(w) == {
        uuid(SLOTS[0]): [
            (
                "nvlink_errors",
                WARNING,
                "reset_gpu",
                "NVLink error counters rising: link 14 recovery 505 \u2192 542",
            )
        ]
    }
    # Ten minutes without a rise: the window has moved past it, the problem ends.
    for t in range(120, 700, 60):
        w.counters(t, counters(rec(14, 542)))
    assert w.findings() == {}


def test_one_problem_per_gpu_names_each_rising_link() -> None:
    w = Watch(600, 0, 16)
    base = {
        SLOTS[1]: {
            "2": {"Recovery Errors": "1", "Replay Errors": "100"},
            "9": {"Replay Errors": "0"},
        }
    }
    w.counters(0, counters(base))
    w.counters(
        60,
        counters(
            {
                SLOTS[1]: {
                    "2": {"Recovery Errors": "2", "Replay Errors": "117"},
                    "9": {"Replay Errors": "40"},
                }
            }
        ),
    )
    found = w.findings()
    assert list(found) == [uuid(SLOTS[1])]
    assert [f.message for f in found[uuid(SLOTS[1])]] == [
        "NVLink error counters rising: link 2 replay 100 \u2192 117; link 2 recovery 1 \u2192 2; "
        "link 9 replay 0 \u2192 40"
    ]


@pytest.mark.parametrize(("rise", "problem"), [(16, False), (17, True)])
def test_the_replay_budget(rise: int, problem: bool) -> None:
    w = Watch(600, 0, 16)
    w.counters(0, counters(rec(0, 10, "Replay Errors")))
    w.counters(60, counters(rec(0, 10 + rise, "Replay Errors")))
    assert bool(w.findings()) is problem


@pytest.mark.parametrize(("budget", "problem"), [(0, True), (2, True), (3, False)])
def test_the_recovery_budget(budget: int, problem: bool) -> None:
    w = Watch(600, budget, 16)
    w.counters(0, counters(rec(0, 0)))
    w.counters(60, counters(rec(0, 3)))
    assert bool(w.findings()) is problem


def test_crc_errors_are_not_judged() -> None:
    w = Watch(600, 0, 0)
    w.counters(0, counters(rec(0, 0, "CRC Errors")))
    w.counters(60, counters(rec(0, 1000, "CRC Errors")))
    assert w.findings() == {}


def test_the_window_is_measured_from_the_newest_count_at_least_that_old() -> None:
    w = Watch(300, 0, 16)
    w.counters(0, counters(rec(0, 0)))
    w.counters(100, counters(rec(0, 1)))  # 0 -> 1 within 300 s
    assert w.findings()
    w.counters(300, counters(rec(0, 1)))  # measured from t=0 (0): still a rise
    assert w.findings()
    w.counters(400, counters(rec(0, 1)))  # from t=100 (1): no rise
    assert w.findings() == {}
    w.counters(500, counters(rec(0, 2)))
    assert "link 0 recovery 1 \u2192 2" in w.findings()[uuid(SLOTS[0])][0].message


def test_a_counter_reset_is_a_new_baseline() -> None:
    w = Watch(600, 0, 16)
    w.counters(0, counters(rec(0, 50)))
    w.counters(60, counters(rec(0, 0)))  # nvidia-smi nvlink -r, a driver reload
    assert w.findings() == {}
    w.counters(120, counters(rec(0, 1)))
    assert "link 0 recovery 0 \u2192 1" in w.findings()[uuid(SLOTS[0])][0].message


def test_slots_by_key_and_findings_by_slot() -> None:
    rows: list[dict[str, Any]] = [
        {"index": 0, "uuid": "GPU-a", "pci.bus_id": "00000000:18:00.0"},
        {"index": 1, "uuid": None, "pci.bus_id": "00000000:2A:00.0"},
        {"index": 2, "uuid": "GPU-c", "pci.bus_id": None},
    ]
    slots = slots_by_key(rows)
    assert slots == {"GPU-a": "0000:18:00.0", "index:0": "0000:18:00.0", "index:1": "0000:2a:00.0"}
    f = Finding("nvlink_down", CRITICAL, "reset_gpu", "x")
    assert findings_by_slot({"GPU-a": [f], "index:1": [f], "GPU-z": [f]}, slots) == {
        "0000:18:00.0": [f],
        "0000:2a:00.0": [f],
        "GPU-z": [f],
    }
