"""The failure policy on the real control plane (see ``evalkube.controller.run_decisions``).

A unit whose Pod fails (retries through ``backoffLimit``, here 0) and a unit whose Pod
completes without its runner reporting anything both become failed units; the aggregate
unit of a task whose shard failed is never run; the other units go on; the run ends
``Failed`` with a condition that names every failed unit and why, results of what did
complete, and a Warning Event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    _free_port,
    _jobs,
    _play_unit,
    annotate_pods,
    finished,
    install_crds,
    run_manifest,
    running_operator,
    suite,
)

from evalkube.controller import names

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def job_condition(cp: ControlPlane, namespace: str, job: str, kind: str) -> dict[str, Any] | None:
    status = cp.kubectl_json("get", "job", job, "-n", namespace).get("status") or {}
    for condition in status.get("conditions") or []:
        if condition["type"] == kind and condition["status"] == "True":
            return dict(condition)
    return None


def test_failed_and_silent_units_fail_the_run_as_documented(
    control_plane: ControlPlane, cluster_namespace: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    install_crds(cp)
    # qa: 25 rows in shards of 10 (3 units); sentiment: 6 rows (1 shard) + its aggregate unit
    cp.apply(suite(ns))
    with running_operator(cp, tmp_path / "results.db", _free_port(), job_backoff_limit="0") as url:
        cp.apply(run_manifest(ns, shard_size=10))
        jobs = cp.wait_for(lambda: len(j := _jobs(cp, ns)) == 4 and j, timeout=30, what="4 Jobs")
        assert jobs
        assert all(j["spec"]["backoffLimit"] == 0 for j in jobs.values())
        ok, crashing, silent = (
            "qa.precomputed.00000",
            "qa.precomputed.00001",
            ("sentiment.precomputed.00000"),
        )
        _play_unit(cp, ns, jobs[ok], url, tmp_path)
        _play_unit(cp, ns, jobs["qa.precomputed.00002"], url, tmp_path)
        # the Pod's runner exits 1: with backoffLimit 0 the Job fails at once
        annotate_pods(cp, ns, names.job_name("nightly", crashing), "fail")
        # the Pod exits 0 but its runner never reported a sample nor the unit
        annotate_pods(cp, ns, names.job_name("nightly", silent), "true")
        status = cp.wait_for(lambda: finished(cp, ns), timeout=90, what="EvalRun finished")
        assert status is not None
        # the operator saw the failures while the other units ran; nothing was retried (a
        # finished run gets no pass: the pass that wrote Failed created its last Jobs first)
        assert sorted(_jobs(cp, ns)) == sorted(jobs)

    assert status["phase"] == "Failed", status
    failed_job = job_condition(cp, ns, names.job_name("nightly", crashing), "Failed")
    assert failed_job is not None
    assert failed_job["reason"] == "BackoffLimitExceeded"
    assert job_condition(cp, ns, names.job_name("nightly", silent), "Complete") is not None
    # the aggregate unit of sentiment never got a Job
    assert "sentiment.precomputed.batch" not in _jobs(cp, ns)

    assert status["units"] == {
        "total": 5,
        "succeeded": 2,
        "running": 0,
        "failed": 3,
        "pending": 0,
        "queued": 0,
    }
    conditions = {c["type"]: c for c in status["conditions"]}
    for kind in ("Succeeded", "Ready"):
        assert conditions[kind]["status"] == "False"
        assert conditions[kind]["reason"] == "UnitsFailed"
        assert conditions[kind]["observedGeneration"] == 1
    message = conditions["Succeeded"]["message"]
    assert f"unit {crashing}: BackoffLimitExceeded" in message, message
    assert f"unit {silent}: the unit's Job completed but its runner never reported" in message
    assert (
        "unit sentiment.precomputed.batch: not run: shard units of this task and model failed"
        in message
    )
    assert ok not in message
    assert status["completedAt"]

    # results hold what completed: qa's two good shards (rows 0-9 and 20-24)
    results = {r["task"]: r for r in status["results"]}
    assert set(results) == {"qa"}
    assert results["qa"]["counts"] == {"samples": 15, "valid": 15, "invalid": 0, "errored": 0}
    assert results["qa"]["metrics"] == {"exact_match": pytest.approx(12 / 15)}

    # a Warning Event on the EvalRun says so
    def warning() -> dict[str, Any] | None:
        events = cp.kubectl_json(
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            "involvedObject.kind=EvalRun,involvedObject.name=nightly,type=Warning",
        )["items"]
        return next((e for e in events if e["reason"] == "RunFailed"), None)

    event = cp.wait_for(warning, timeout=30, what="RunFailed Warning Event")
    assert event is not None
    assert crashing in event["message"]
    assert silent in event["message"]
    normal = cp.kubectl_json(
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        "involvedObject.name=nightly,type=Normal",
    )["items"]
    assert {"Snapshot", "UnitStarted"} <= {e["reason"] for e in normal}
