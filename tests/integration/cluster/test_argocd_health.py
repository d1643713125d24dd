"""The chart's Argo CD health checks (charts/evalkube/argocd/*.lua) on objects the operator
itself wrote on the real control plane, run by a real Lua interpreter: a suite that is Ready
and one that is Invalid, a run while Running and after it Succeeded, a run that ended
Failed, and gated runs whose gate passed and failed. Unit-level cases (gates passed, failed,
evaluating) are in tests/unit/chart/test_argocd_health.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    OperatorUrl,
    _jobs,
    _play_unit,
    annotate_pods,
    finished,
    module_operator,
    run_manifest,
    suite,
)
from tests.support.argocd import health

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


operator = module_operator(job_backoff_limit="0")


def live(cp: ControlPlane, kind: str, namespace: str, name: str) -> dict[str, Any]:
    return cp.kubectl_json("get", kind.lower(), name, "-n", namespace)


def test_suites_and_a_succeeded_run_as_the_operator_wrote_them(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(suite(ns))
    ready = cp.wait_for(
        lambda: (s := live(cp, "EvalSuite", ns, "qa")).get("status", {}).get("phase") and s,
        timeout=30,
        what="suite checked",
    )
    assert ready["status"]["phase"] == "Ready", ready["status"]
    assert health("EvalSuite", ready) == {
        "status": "Healthy",
        "message": f"Ready: {ready['status']['conditions'][0]['message']}",
    }
    broken = suite(ns)
    broken["metadata"]["name"] = "broken"
    broken["spec"]["tasks"][0]["grader"]["source"] = "def grade(:\n"
    cp.apply(broken)
    invalid = cp.wait_for(
        lambda: (s := live(cp, "EvalSuite", ns, "broken")).get("status", {}).get("phase") and s,
        timeout=30,
        what="broken suite checked",
    )
    assert invalid["status"]["phase"] == "Invalid", invalid["status"]
    got = health("EvalSuite", invalid)
    assert got["status"] == "Degraded"
    assert got["message"].startswith("Invalid: ")
    assert "qa" in got["message"]

    # qa: 25 rows in one shard; sentiment: one shard and its aggregate unit
    cp.apply(run_manifest(ns, shard_size=25))
    jobs = cp.wait_for(lambda: len(j := _jobs(cp, ns)) == 2 and j, timeout=30, what="2 Jobs")
    assert jobs
    running = cp.wait_for(
        lambda: (
            (r := live(cp, "EvalRun", ns, "nightly")).get("status", {}).get("phase") == "Running"
            and r
        ),
        timeout=30,
        what="run Running",
    )
    assert health("EvalRun", running)["status"] == "Progressing"
    assert health("EvalRun", running)["message"].startswith("Running: 0 of 3 units")
    for job in jobs.values():
        _play_unit(cp, ns, job, operator, tmp_path)
    aggregate = cp.wait_for(
        lambda: _jobs(cp, ns).get("sentiment.precomputed.batch"), timeout=60, what="aggregate"
    )
    _play_unit(cp, ns, aggregate, operator, tmp_path)
    status = cp.wait_for(lambda: finished(cp, ns), timeout=90, what="EvalRun finished")
    assert status is not None
    assert status["phase"] == "Succeeded", status
    done = live(cp, "EvalRun", ns, "nightly")
    got = health("EvalRun", done)
    assert got["status"] == "Healthy", got
    # no gate on this run: the message is the run's summary, as the operator wrote it
    assert got["message"] == done["status"]["summary"]


def test_a_failed_run_as_the_operator_wrote_it_is_degraded(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(suite(ns))
    cp.apply(run_manifest(ns, shard_size=25))
    jobs = cp.wait_for(lambda: len(j := _jobs(cp, ns)) == 2 and j, timeout=30, what="2 Jobs")
    assert jobs
    for job in jobs.values():  # every runner exits 1; backoffLimit 0 fails each Job at once
        annotate_pods(cp, ns, job["metadata"]["name"], "fail")
    status = cp.wait_for(lambda: finished(cp, ns), timeout=90, what="EvalRun finished")
    assert status is not None
    assert status["phase"] == "Failed", status
    got = health("EvalRun", live(cp, "EvalRun", ns, "nightly"))
    assert got["status"] == "Degraded", got
    assert got["message"].startswith("Failed: ")
    for unit in jobs:
        assert f"unit {unit}: BackoffLimitExceeded" in got["message"], got


def play_run(cp: ControlPlane, ns: str, url: OperatorUrl, tmp: Path) -> dict[str, Any]:
    """Play every unit Job of the namespace's run as it appears; the finished status."""
    played: set[str] = set()

    def step() -> dict[str, Any] | None:
        for unit, job in _jobs(cp, ns).items():
            if unit not in played:
                played.add(unit)
                _play_unit(cp, ns, job, url, tmp)
        return finished(cp, ns)

    status = cp.wait_for(step, timeout=120, what="EvalRun finished")
    assert status is not None
    return status


@pytest.mark.parametrize(
    ("minimum", "health_status", "message"),
    [(0.5, "Healthy", "Gate passed"), (0.9, "Degraded", "Gate failed: ")],
    ids=["gate-passed", "gate-failed"],
)
def test_a_gated_run_as_the_operator_wrote_it(
    control_plane: ControlPlane,
    cluster_namespace: str,
    operator: OperatorUrl,
    tmp_path: Path,
    minimum: float,
    health_status: str,
    message: str,
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(suite(ns))
    gated = run_manifest(ns, shard_size=25)
    # qa scores exact_match 0.8 (20 of 25)
    gated["spec"]["gate"] = {
        "thresholds": [{"metric": "exact_match", "task": "qa", "min": minimum}]
    }
    cp.apply(gated)
    status = play_run(cp, ns, operator, tmp_path)
    assert status["phase"] == "Succeeded", status
    got = health("EvalRun", live(cp, "EvalRun", ns, "nightly"))
    assert got["status"] == health_status, got
    assert got["message"].startswith(message), got
    if health_status == "Degraded":
        assert "exact_match" in got["message"], got
