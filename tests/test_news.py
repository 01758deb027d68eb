"""debian/NEWS (NEWS.Debian, what apt-listchanges shows on upgrade) keeps up with the alerting
rules and the metric names.

Operators use the rules in place (/usr/share/gpuagent) and graph the metrics by name, so an
upgrade that changes either must tell them. The top NEWS entry ends with the fingerprint of
the rules file and the metric names as of that entry: change one, and this test fails until
the NEWS says what changed and carries the new fingerprint.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re

from gpuagent import version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEWS = os.path.join(REPO, "debian", "NEWS")
RULES = os.path.join(REPO, "packaging", "prometheus", "gpuagent-alerts.yml")
METRIC = re.compile(r'"(gpuagent_[a-z0-9_]+)"')
FINGERPRINT = re.compile(r"^  Fingerprint of the rules and metric names: ([0-9a-f]{12})\.$", re.M)


def metric_names() -> list[str]:
    """Every metric name the agent's code spells out."""
    names: set[str] = set()
    for path in glob.glob(os.path.join(REPO, "gpuagent", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            names.update(METRIC.findall(f.read()))
    return sorted(names)


def fingerprint() -> str:
    h = hashlib.sha256()
    with open(RULES, "rb") as f:
        h.update(f.read())
    h.update(b"\0" + "\n".join(metric_names()).encode())
    return h.hexdigest()[:12]


def top_entry() -> str:
    with open(NEWS, encoding="utf-8") as f:
        text = f.read()
    return text.split("\n -- ", 1)[0]


def test_the_news_knows_the_current_rules_and_metrics() -> None:
    assert len(metric_names()) >= 30
    m = FINGERPRINT.search(top_entry())
    assert m is not None, "the top entry of debian/NEWS has no fingerprint line"
    assert m.group(1) == fingerprint(), (
        "packaging/prometheus/gpuagent-alerts.yml or a metric name changed: say what changed "
        "in debian/NEWS (the top entry while its release is not out, else a new one) and "
        f"end it with: Fingerprint of the rules and metric names: {fingerprint()}."
    )


def test_the_top_news_entry_is_a_release_of_the_changelog() -> None:
    with open(os.path.join(REPO, "debian", "changelog"), encoding="utf-8") as f:
        releases = re.findall(r"^gpuagent \(([^)]+)\)", f.read(), re.M)
    news = version.release_of(top_entry())
    assert news in releases
    assert "+git" not in str(news)
