"""The text exposition writer against prometheus_client, which the agent no longer imports but
which stays the reference: its parser reads every rendering back, and what it renders for the
same series must parse to the same families."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable

import pytest
from prometheus_client import CollectorRegistry, generate_latest, parser
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuagent import metrics
from gpuagent.exposition import Family, number, render
from tests.test_metrics import snapshot

# prometheus-client 0.16 (Debian 12) leaves the parser unannotated and 0.21 (Debian 13)
# annotates it: a typed name for it is strict-clean under both, where an ignore is not.
metric_families: Callable[[str], Iterable[Metric]] = parser.text_string_to_metric_families

# Label values and help texts that need escaping, or look as if they did.
TRICKY = [
    "",
    "plain",
    'say "hi"',
    "back\\slash",
    "new\nline",
    "\\n is not a newline",
    '\\"',
    "tab\there",
    "{}=,",
    "NVIDIA H200 NVL",
    "Grafik-Prozessor ü, 图形处理器",
    "trailing backslash\\",
]
VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-9, 97.5, 150323855360.0, 2.0**53, 1e16, 1e300]


class _Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def library_text(families: Iterable[Family]) -> str:
    """What prometheus_client renders for the same series (its names drop a counter's _total)."""
    out = []
    for f in families:
        m = Metric(
            f.name.removesuffix("_total") if f.kind == "counter" else f.name, f.help_text, f.kind
        )
        for values, value in f.samples:
            m.add_sample(f.name, dict(zip(f.labels, values, strict=True)), value)
        out.append(m)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(out))
    return generate_latest(registry).decode()


def parsed(text: str) -> list[Metric]:
    return list(metric_families(text))


def test_a_gauge_without_labels() -> None:
    f = Family("up_ratio", "gauge", "Up.")
    f.add((), 0.5)
    assert render([f]) == "# HELP up_ratio Up.\n# TYPE up_ratio gauge\nup_ratio 0.5\n"
    assert render([f]) == library_text([f])


def test_label_names_are_written_sorted_and_values_follow_them() -> None:
    f = Family("gpu_info", "gauge", "Info.", ["uuid", "pci_slot", "name"])
    f.add(["GPU-1", "0000:3b:00.0", "H200"], 1.0)
    line = render([f]).splitlines()[-1]
    assert line == 'gpu_info{name="H200",pci_slot="0000:3b:00.0",uuid="GPU-1"} 1.0'
    assert render([f]) == library_text([f])


def test_a_counter_is_named_with_its_total() -> None:
    f = Family("spawns_total", "counter", "Spawns.")
    f.add((), 3.0)
    assert render([f]) == (
        "# HELP spawns_total Spawns.\n# TYPE spawns_total counter\nspawns_total 3.0\n"
    )
    assert render([f]) == library_text([f])


@pytest.mark.parametrize("text", TRICKY)
def test_help_text_is_escaped(text: str) -> None:
    f = Family("x", "gauge", text)
    f.add((), 1.0)
    assert render([f]) == library_text([f])
    (back,) = parsed(render([f]))
    assert back.documentation == text


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(TRICKY, 2)))
def test_label_values_are_escaped(a: str, b: str) -> None:
    f = Family("x", "gauge", "X.", ["b", "a"])
    f.add([b, a], 1.0)
    assert render([f]) == library_text([f])
    (back,) = parsed(render([f]))
    assert back.samples[0].labels == {"a": a, "b": b}


@pytest.mark.parametrize("value", VALUES + [-v for v in VALUES] + [math.inf, -math.inf])
def test_values_read_back_exactly(value: float) -> None:
    f = Family("x", "gauge", "X.")
    f.add((), value)
    (back,) = parsed(render([f]))
    assert back.samples[0].value == value
    assert parsed(render([f])) == parsed(library_text([f]))


def test_not_a_number() -> None:
    assert number(math.nan) == "NaN"
    f = Family("x", "gauge", "X.")
    f.add((), math.nan)
    (back,) = parsed(render([f]))
    assert math.isnan(back.samples[0].value)


def test_infinities_and_integers_are_spelled_as_prometheus_writes_them() -> None:
    assert (number(math.inf), number(-math.inf)) == ("+Inf", "-Inf")
    assert number(3) == "3.0"


def test_a_family_without_samples_keeps_its_help_and_type() -> None:
    assert render([Family("x", "gauge", "X.", ["a"])]) == "# HELP x X.\n# TYPE x gauge\n"


@pytest.mark.parametrize(
    ("name", "kind", "labels"),
    [
        ("0starts_with_a_digit", "gauge", []),
        ("has-dash", "gauge", []),
        ("", "gauge", []),
        ("spawns", "counter", []),
        ("x", "gauge", ["pci-slot"]),
        ("x", "gauge", ["__reserved"]),
        ("x", "gauge", ["a", "a"]),
    ],
)
def test_names_the_format_does_not_allow(name: str, kind: str, labels: list[str]) -> None:
    with pytest.raises(ValueError, match=r"name|label|_total"):
        Family(name, kind, "X.", labels)  # type: ignore[arg-type]


def test_a_sample_needs_a_value_for_each_label() -> None:
    f = Family("x", "gauge", "X.", ["a", "b"])
    with pytest.raises(ValueError, match="labels"):
        f.add(["only one"], 1.0)


def test_the_agents_series_parse_as_the_library_renders_them() -> None:
    gpus = [
        {
            "pci_slot": "0000:3b:00.0",
            "uuid": "GPU-1",
            "stale": False,
            "health": "critical",
            "fields": {
                "uuid": "GPU-1",
                "name": 'a "quoted" \\ name',
                "driver_version": "590.48.01",
                "temperature.gpu": 45,
                "memory.total": 143771,
                "clocks.sm": 1980,
                "pstate": "P0",
                "mig.mode.current": "Enabled",
            },
            "problems": [{"kind": "xid", "severity": "critical", "action": "reset_gpu"}],
            "xids": [
                {
                    "xid": 79,
                    "count": 2,
                    "name": "fell off the bus",
                    "severity": "critical",
                    "action": "reboot",
                },
            ],
        }
    ]
    snap = snapshot(gpus, state="ok", duration=0.25, last_success_at=1.7e9)
    snap["host_problems"] = [{"kind": "gpu_count", "severity": "warning", "action": "inspect"}]
    snap["sxids"] = [{"pci_slot": "0000:05:00.0", "sxid": 12028, "count": 1}]
    families = metrics.families(snap)
    assert {f.kind for f in families} == {"gauge", "counter"}
    assert parsed(metrics.render(snap)) == parsed(library_text(families))
