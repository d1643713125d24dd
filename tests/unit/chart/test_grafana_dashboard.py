"""The chart's Grafana dashboard (dashboards/evalkube.json, templates/grafana-dashboard.yaml):
a valid dashboard (schemaVersion, unique panel ids, defined variables), shipped in a ConfigMap
labelled for Grafana's sidecar, whose every query selects only metrics evalkube exports, parses
(``promtool check rules``) and returns data on series with the real names (``promtool test
rules``: an ``absent(<query>)`` alert per query must not fire).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.promql import exported_series, metric_names
from tests.unit.chart.conftest import CHART, helm_template

DASHBOARD = CHART / "dashboards" / "evalkube.json"
#: What Grafana substitutes into the queries ("All" of a variable is its allValue, ".*").
GRAFANA_VARS = {"$__rate_interval": "5m", "$namespace": ".*", "$suite": ".*", "$job": ".*"}


def series(name: str, values: str, job: str = "ev-evalkube", **labels: str) -> tuple[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in {"job": job, **labels}.items())
    return f"{name}{{{text}}}", values


RUN = {"namespace": "team-a", "suite": "qa"}
SCORE = {**RUN, "task": "qa", "model": "gpt", "metric": "exact_match"}
#: Series as the operator, the egress gateway and a proxy export them (real names and labels).
INPUT_SERIES = [
    series("evalkube_score", "0.8x500", **SCORE),
    series("evalkube_gate_passed", "1x500", **RUN, run="nightly-42"),
    series("evalkube_score_baseline_delta", "-0.01x500", **SCORE),
    series("evalkube_runs", "3x500", phase="Succeeded"),
    series("evalkube_samples_total", "0+10x500", **RUN, status="valid"),
    series("evalkube_samples_total", "0+1x500", **RUN, status="errored"),
    series("evalkube_model_calls_total", "0+4x500", **RUN, purpose="judge"),
    series("evalkube_model_budget_refusals_total", "0+2x500", **RUN, scope="execution"),
    series("evalkube_unit_duration_seconds_bucket", "0+1x500", kind="shard", le="30"),
    series("evalkube_unit_duration_seconds_bucket", "0+2x500", kind="shard", le="+Inf"),
    series("evalkube_jobs_created_total", "0+1x500"),
    series("evalkube_status_patches_total", "0+3x500"),
    series("up", "1x500", instance="10.0.0.5:8081"),
    series("evalkube_egress_requests_total", "0+5x500", "egress", kind="connect", outcome="ok"),
    series("evalkube_egress_open_tunnels", "2x500", "egress"),
    series(
        "evalkube_proxy_model_calls_total",
        "0+2x500",
        "proxy",
        purpose="judge",
        provider="openai",
        outcome="ok",
    ),
    series("evalkube_proxy_budget_rejections_total", "0+1x500", "proxy", scope="unit"),
]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def substituted(expr: str) -> str:
    for name, value in GRAFANA_VARS.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def run_promtool(promtool: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_dashboard_is_valid() -> None:
    dash = dashboard()
    assert isinstance(dash["schemaVersion"], int)
    assert dash["schemaVersion"] >= 36
    assert dash["uid"]
    assert dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    variables = {v["name"] for v in dash["templating"]["list"]}
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, f"{panel['title']} uses undefined {used - variables}"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
    # what docs/metrics.md says the dashboard shows
    titles = {p["title"] for p in dash["panels"]}
    assert {
        "Scores over time",
        "Gate results",
        "Runs by phase",
        "Samples by status",
        "Model calls by purpose",
        "Work-unit duration",
        "Operator up",
        "Egress gateway requests by outcome",
        "Proxy model calls by outcome",
    } <= titles


def test_every_metric_a_query_selects_is_exported() -> None:
    exported = exported_series()
    found = queries()
    assert len(found) >= 15
    variable_queries = []
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        assert var["definition"] == var["query"]["query"], var["name"]
        selector = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["query"]["query"])
        assert selector, f"variable {var['name']}: label_values(<selector>, <label>) expected"
        variable_queries.append((f"variable {var['name']}", selector.group(1)))
    for title, expr in found + variable_queries:
        names = metric_names(expr)
        assert names, (title, expr)
        assert names <= exported, f"{title}: {names - exported} not exported ({expr})"


def test_every_query_parses_and_returns_data_on_the_real_series(
    promtool: Path, tmp_path: Path
) -> None:
    found = queries()
    rules = [
        {"alert": f"Panel{i}NoData", "expr": f"absent({substituted(expr)})"}
        for i, (_, expr) in enumerate(found)
    ]
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    checked = run_promtool(promtool, tmp_path, "check", "rules", "rules.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in INPUT_SERIES],
                "alert_rule_test": [
                    {"eval_time": "420m", "alertname": r["alert"], "exp_alerts": []} for r in rules
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    tested = run_promtool(promtool, tmp_path, "test", "rules", "test.yaml")
    output = tested.stdout + tested.stderr
    no_data = sorted(set(re.findall(r'alertname="Panel(\d+)NoData"', output)), key=int)
    titles = [found[int(n)] for n in no_data]
    assert tested.returncode == 0, f"queries without data: {titles}\n{output}"


def test_configmap_for_the_grafana_sidecar(helm: Path) -> None:
    assert "ev-evalkube-dashboard" not in {
        d["metadata"]["name"] for d in helm_template(helm) if d["kind"] == "ConfigMap"
    }
    (cm,) = helm_template(
        helm,
        "grafanaDashboard.enabled=true",
        "grafanaDashboard.namespace=monitoring",
        "grafanaDashboard.annotations.grafana_folder=evalkube",
        show_only="templates/grafana-dashboard.yaml",
    )
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "evalkube"}
    assert json.loads(cm["data"]["evalkube.json"]) == dashboard()
