"""The gate on the real control plane: the operator evaluates an EvalRun's thresholds and its
baseline when the run succeeds, writes the ``Passed`` condition and ``status.gate``, an event,
and ``evalkube_gate_passed``.

Units are played as in test_operator.py: the test runs each unit's runner command itself
(kwok holds the Pods), then lets the Pod complete.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    READ_TOKEN,
    OperatorUrl,
    module_operator,
    play_to_the_end,
    run,
    suite,
)
from typer.testing import CliRunner

from evalkube.cli import app

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


operator = module_operator()


def gated(ns: str, name: str, gate: dict[str, Any]) -> dict[str, Any]:
    manifest = run(ns, name)
    manifest["spec"]["gate"] = gate
    return manifest


def passed_condition(status: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in status["conditions"] if c["type"] == "Passed")
    return found


def gate_metric(url: OperatorUrl, ns: str, run_name: str) -> float | None:
    text = httpx.get(f"{url.api}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "evalkube_gate_passed" and (labels["namespace"], labels["run"]) == (
                ns,
                run_name,
            ):
                return float(sample.value)
    return None


def test_a_gate_passes_or_fails_the_run_with_each_check_named(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(suite(ns))
    # qa scores 0.8 (every fifth answer wrong); the first run has no earlier one to compare with
    cp.apply(
        gated(
            ns,
            "first",
            {
                "thresholds": [{"task": "qa", "metric": "exact_match", "min": 0.75}],
                "maxErrorRate": 0,
                "baseline": {"lastSucceeded": True},
            },
        )
    )
    first = play_to_the_end(cp, ns, "first", operator, tmp_path)
    assert first["phase"] == "Succeeded", first
    condition = passed_condition(first)
    assert (condition["status"], condition["reason"]) == ("True", "GatePassed"), condition
    assert first["gate"]["passed"] is True
    kinds = sorted({c["kind"] for c in first["gate"]["checks"]})
    assert kinds == ["baseline", "errors", "min"], first["gate"]
    assert gate_metric(operator, ns, "first") == 1.0

    # the same suite against a stricter threshold, compared with the first run
    cp.apply(
        gated(
            ns,
            "second",
            {
                "thresholds": [
                    {"task": "qa", "metric": "exact_match", "min": 0.9},
                    {"metric": "no_such_metric", "min": 0.1},
                ],
                "baseline": {"lastSucceeded": True, "maxRegression": 0.0},
            },
        )
    )
    second = play_to_the_end(cp, ns, "second", operator, tmp_path)
    assert second["phase"] == "Succeeded", second  # the units did their job; the gate did not
    condition = passed_condition(second)
    assert (condition["status"], condition["reason"]) == ("False", "GateFailed"), condition
    assert "min qa/precomputed exact_match: 0.8000 < 0.9" in condition["message"]
    assert "no_such_metric" in condition["message"]
    gate = second["gate"]
    assert gate["passed"] is False
    assert gate["baseline"].startswith(f"{ns}.first.")
    # identical scores: no drop, every baseline check passes
    baseline_checks = [c for c in gate["checks"] if c["kind"] == "baseline"]
    assert {(c["task"], c["metric"]) for c in baseline_checks} == {
        ("qa", "exact_match"),
        ("sentiment", "correct"),
    }
    assert all(c["passed"] and c["value"] == 0 for c in baseline_checks), baseline_checks
    assert gate_metric(operator, ns, "second") == 0.0
    assert gate_metric(operator, ns, "first") is None  # one series per suite: the latest run
    events = cp.kubectl_json("get", "events", "-n", ns)["items"]
    assert any(
        e["reason"] == "GateFailed" and e["involvedObject"]["name"] == "second" for e in events
    )


def test_compare_api_pairs_two_evalruns_through_the_operator(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    """``evalkube compare --api`` pairs two EvalRuns' samples as the operator stored them: the
    same suite played twice gives every metric a zero change over every row; the read token
    is needed, and an unknown run is named."""
    cp, ns = control_plane, cluster_namespace
    cp.apply(suite(ns))
    for name in ("monday", "tuesday"):
        cp.apply(run(ns, name))
        assert play_to_the_end(cp, ns, name, operator, tmp_path)["phase"] == "Succeeded"
    command = ["compare", "--api", operator.api, "-n", ns, "monday", "tuesday", "--json"]
    answer = CliRunner().invoke(app, command, env={"EVALKUBE_API_TOKEN": READ_TOKEN})
    assert answer.exit_code == 0, answer.output
    metrics = json.loads(answer.stdout)["metrics"]
    assert {(m["task"], m["metric"]) for m in metrics} == {
        ("qa", "exact_match"),
        ("sentiment", "correct"),
    }
    qa = next(m for m in metrics if m["task"] == "qa")
    assert (qa["shared"], qa["baselineMean"], qa["mean"]) == (25, 0.8, 0.8), qa
    assert all(m["ciLow"] == m["ciHigh"] == 0 for m in metrics), metrics

    no_token = CliRunner().invoke(app, command, env={"EVALKUBE_API_TOKEN": ""})
    assert no_token.exit_code == 2, no_token.output
    assert "needs a token" in no_token.output
    unknown = CliRunner().invoke(
        app, [*command[:5], "monday", "nope"], env={"EVALKUBE_API_TOKEN": READ_TOKEN}
    )
    assert unknown.exit_code == 2, unknown.output
    assert f"EvalRun {ns}/nope is not known" in unknown.output
