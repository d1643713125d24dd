"""The chart's PrometheusRule (templates/prometheusrule.yaml): rendered by helm, checked with
``promtool check rules`` and unit-tested with ``promtool test rules`` on input series that carry
the operator's real metric names (fixtures/prometheus_rules_test.yaml); every metric a rule
selects is one evalkube exports (OperatorMetrics, the proxies) or Prometheus's ``up``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.promql import exported_series, metric_names
from tests.unit.chart.conftest import HelmFailed, helm_template

FIXTURE = Path(__file__).parent / "fixtures" / "prometheus_rules_test.yaml"
ALL_ON = ("prometheusRule.enabled=true", "prometheusRule.budgetExhausted.enabled=true")


def rule_groups(helm: Path, *sets: str) -> dict[str, Any]:
    (rule,) = helm_template(helm, *sets, show_only="templates/prometheusrule.yaml")
    assert rule["kind"] == "PrometheusRule"
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "team"
    return dict(rule["spec"])


def promtool_run(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_rules_pass_promtool_check_and_unit_tests(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    spec = rule_groups(helm, *ALL_ON)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    shutil.copy(FIXTURE, tmp_path / "test.yaml")
    checked = promtool_run(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout, checked.stdout
    tested = promtool_run(promtool, "test", "rules", "test.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_metric_a_rule_selects_is_exported(helm: Path) -> None:
    exported = exported_series()
    rules = [r for g in rule_groups(helm, *ALL_ON)["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == {
        "EvalkubeGateFailed",
        "EvalkubeScoreRegressed",
        "EvalkubeRunsFailing",
        "EvalkubeSamplesErroring",
        "EvalkubeModelBudgetExhausted",
        "EvalkubeOperatorDown",
    }
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names, rule
        assert names <= exported, f"{rule['alert']} selects {names - exported}, not exported"


def test_rule_values_reach_the_expressions(helm: Path) -> None:
    spec = rule_groups(
        helm,
        "prometheusRule.enabled=true",
        "prometheusRule.scoreRegression.maxDrop=0.2",
        "prometheusRule.runsFailing.enabled=false",
        "prometheusRule.operatorDown.job=evalkube-metrics",
        "prometheusRule.alertLabels.team=ml",
    )
    rules = {r["alert"]: r for g in spec["groups"] for r in g["rules"]}
    assert "EvalkubeRunsFailing" not in rules
    assert "evalkube_model_budget_refusals_total" in rules["EvalkubeModelBudgetExhausted"]["expr"]
    assert rules["EvalkubeScoreRegressed"]["expr"] == "evalkube_score_baseline_delta < -0.2"
    assert 'job="evalkube-metrics"' in rules["EvalkubeOperatorDown"]["expr"]
    assert all(r["labels"]["team"] == "ml" for r in rules.values())


def test_off_by_default_and_bad_values_fail_at_render(helm: Path) -> None:
    kinds = {d["kind"] for d in helm_template(helm)}
    assert "PrometheusRule" not in kinds
    with pytest.raises(HelmFailed, match=r"prometheusRule.scoreRegression.maxDrop must be >= 0"):
        helm_template(
            helm, "prometheusRule.enabled=true", "prometheusRule.scoreRegression.maxDrop=-0.1"
        )
    with pytest.raises(HelmFailed, match=r"prometheusRule.samplesErroring.maxRatio must be in"):
        helm_template(
            helm, "prometheusRule.enabled=true", "prometheusRule.samplesErroring.maxRatio=0"
        )


def test_servicemonitors_keep_the_namespace_label_and_scrape_the_egress_gateway(
    helm: Path,
) -> None:
    """Without honorLabels, Prometheus renames the metrics' ``namespace`` (the EvalRun's) to
    ``exported_namespace`` and the rules' and dashboard's selectors match nothing. The egress
    gateway's metrics port is scraped too (the dashboard's egress panels)."""
    monitors = helm_template(
        helm, "metrics.serviceMonitor.enabled=true", show_only="templates/servicemonitor.yaml"
    )
    by_name = {m["metadata"]["name"]: m for m in monitors}
    assert set(by_name) == {"ev-evalkube", "ev-evalkube-egress"}
    operator = by_name["ev-evalkube"]["spec"]
    assert operator["endpoints"][0]["honorLabels"] is True
    assert operator["selector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    egress = by_name["ev-evalkube-egress"]["spec"]
    assert egress["endpoints"][0]["port"] == "metrics"
    assert egress["selector"]["matchLabels"]["app.kubernetes.io/component"] == "egress-gateway"
    (service,) = [
        s
        for s in helm_template(helm)
        if s["kind"] == "Service"
        and s["metadata"]["labels"].get("app.kubernetes.io/component") == "egress-gateway"
    ]
    assert "metrics" in {p["name"] for p in service["spec"]["ports"]}
    assert egress["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    off = helm_template(
        helm,
        "metrics.serviceMonitor.enabled=true",
        "egress.enabled=false",
        show_only="templates/servicemonitor.yaml",
    )
    assert [m["metadata"]["name"] for m in off] == ["ev-evalkube"]
