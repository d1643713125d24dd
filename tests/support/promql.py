"""What the chart's alert rules and dashboard may query: the series evalkube exports, and the
metric names a PromQL expression selects.

Exported names come from the code itself: the operator's and the Python proxy's registries
(``OperatorMetrics``, ``ProxyMetrics``) and the Go sources of the native proxy and the egress
gateway (their ``Name:`` fields), plus ``up`` (Prometheus's own, per scrape target).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[2]
GO_SOURCES = [
    ROOT / "operator/evalkube-proxy/metrics.go",
    ROOT / "operator/evalkube-proxy/gateway.go",
]
#: Series Prometheus adds itself for every scrape target.
PROMETHEUS_OWN = {"up"}

FUNCTIONS_AND_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "inf", "nan",
}  # fmt: skip


def _series(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count", "created")}
        else:
            names.add(family.name)
    return names


def operator_series() -> set[str]:
    from evalkube.controller.metrics import OperatorMetrics

    return _series(OperatorMetrics().registry)


def proxy_series() -> set[str]:
    """The proxies' series: the Python proxy's registry and the Go sources' names."""
    from evalkube.proxy.metrics import ProxyMetrics

    names = _series(ProxyMetrics(CollectorRegistry()).registry)
    for source in GO_SOURCES:
        for name in re.findall(r'Name:\s*"(evalkube_[a-z_]+)"', source.read_text()):
            if name.endswith("_total"):
                names |= {name, name.removesuffix("_total") + "_created"}
            elif "duration_seconds" in name:
                names |= {f"{name}_{s}" for s in ("bucket", "sum", "count")}
            else:
                names.add(name)
    return names


def exported_series() -> set[str]:
    return operator_series() | proxy_series() | PROMETHEUS_OWN


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (syntax is promtool's to check; this only finds
    the names): identifiers that are not functions, keywords, label names or durations."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges, subqueries
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text
    )  # grouping labels
    text = re.sub(r"\boffset\s+-?\w+", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", text):
        if match.group(2) or match.group(1).lower() in FUNCTIONS_AND_KEYWORDS:
            continue
        names.add(match.group(1))
    return names


def promtool_bin() -> Path | None:
    """``$EVALKUBE_PROMTOOL_BIN`` (set by .ci/test.sh from .ci/promtool.sh)."""
    explicit = os.environ.get("EVALKUBE_PROMTOOL_BIN")
    return Path(explicit) if explicit else None
