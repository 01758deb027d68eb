"""Prometheus's text exposition format (0.0.4), the one node_exporter's textfile collector reads.

The agent writes it itself instead of through prometheus_client: importing that library loads
its HTTP server, ``urllib.request`` and ``ssl`` (8.9 MiB on Debian 12, 9.6 on Debian 13) into a
daemon whose whole budget is 25 MiB, to write one file (docs/performance.md, section 4).  The
format is small and fixed; the tests read every rendering back with prometheus_client's own
parser and compare it with what that library renders for the same series.

Lines, per family: ``# HELP name text`` (backslash and newline escaped), ``# TYPE name kind``,
then one ``name{label="value",...} number`` per sample, label names in sorted order (as
prometheus_client writes them), label values with backslash, double quote and newline escaped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Literal

__all__ = ["Family", "Kind", "number", "render"]

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

Kind = Literal["gauge", "counter"]


class Family:
    """One metric: ``name`` as exposed (a counter's ends in ``_total``), its kind and help,
    the label names every sample has, and the samples in the order they were added.

    Raises ``ValueError`` for a name the format does not allow (a mistake in the agent).
    """

    def __init__(
        self,
        name: str,
        kind: Kind,
        help_text: str,
        labels: Sequence[str] = (),
    ) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"not a metric name: {name!r}")
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"a counter's name ends in _total: {name!r}")
        for label in labels:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"not a label name: {label!r}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"a label twice in {name}: {labels!r}")
        self.name = name
        self.kind = kind
        self.help_text = help_text
        self.labels = tuple(labels)
        self.samples: list[tuple[tuple[str, ...], float]] = []
        # Where each sorted label name's value sits in a sample's values.
        self._order = sorted(range(len(self.labels)), key=self.labels.__getitem__)

    def add(self, values: Sequence[str], value: float) -> None:
        """One sample: a value for each label name, in the order the family names them.

        Raises ``ValueError`` if the count of values is not the count of label names.
        """
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name} has labels {self.labels!r}, not values {values!r}")
        self.samples.append((tuple(values), value))

    def lines(self) -> Iterable[str]:
        """The family's text, a line at a time (each ending in a newline)."""
        yield f"# HELP {self.name} {_escape_help(self.help_text)}\n"
        yield f"# TYPE {self.name} {self.kind}\n"
        for values, value in self.samples:
            if self.labels:
                pairs = ",".join(
                    f'{self.labels[i]}="{_escape_label(values[i])}"' for i in self._order
                )
                yield f"{self.name}{{{pairs}}} {number(value)}\n"
            else:
                yield f"{self.name} {number(value)}\n"


def render(families: Iterable[Family]) -> str:
    """The exposition text of ``families``, in order (a family without samples included)."""
    return "".join(line for family in families for line in family.lines())


def number(value: float) -> str:
    """A sample value as the format spells it: ``+Inf``, ``-Inf``, ``NaN`` or Python's
    shortest round-trip form (``0.5``, ``1e+16``), which Prometheus parses back exactly."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
