"""Kueue on the real control plane: a run with ``spec.queueName`` creates its work-unit Jobs
suspended and labelled for Kueue, reports ``Queued`` while they wait, and completes once they
are unsuspended, as Kueue does when it admits a Job (the test does it itself: no Kueue here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    OperatorUrl,
    _play_unit,
    finished,
    module_operator,
    run,
    run_status,
    suite,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


operator = module_operator()


def run_jobs(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.kubectl_json(
        "get", "jobs", "-n", ns, "-l", f"evalkube.io/run={name}"
    )["items"]
    return items


def ready(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})


def suspended_condition(job: dict[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions)


def test_queued_jobs_wait_suspended_until_admitted_then_the_run_completes(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(suite(ns))
    manifest = run(ns, "queued")
    manifest["spec"]["queueName"] = "team-a"
    cp.apply(manifest)

    def queued() -> dict[str, Any] | None:
        status = run_status(cp, ns, "queued")
        units = status.get("units") or {}
        jobs = run_jobs(cp, ns, "queued")
        if ready(status).get("reason") != "Queued" or not jobs or units.get("queued") != len(jobs):
            return None
        return status

    status = cp.wait_for(queued, timeout=60, what="the run reporting Queued")
    assert status["phase"] == "Running"
    assert ready(status)["status"] == "False"
    assert "waiting for Kueue to admit them from LocalQueue 'team-a'" in ready(status)["message"]
    # the Job controller has seen each Job suspended, and made no Pod for it
    jobs = cp.wait_for(
        lambda: (js := run_jobs(cp, ns, "queued")) and all(map(suspended_condition, js)) and js,
        timeout=60,
        what="the Job controller marking the Jobs Suspended",
    )
    for job in jobs:
        assert job["metadata"]["labels"][QUEUE_LABEL] == "team-a"
        assert job["spec"]["suspend"] is True
    pods = cp.kubectl_json("get", "pods", "-n", ns, "-l", "evalkube.io/run=queued")["items"]
    assert pods == []

    # admit every Job as Kueue would (later ones, the grade_batch unit, appear suspended too)
    admitted: set[str] = set()
    played: set[str] = set()

    def step() -> dict[str, Any] | None:
        for job in run_jobs(cp, ns, "queued"):
            name = job["metadata"]["name"]
            if name not in admitted:
                assert job["spec"]["suspend"] is True, name
                assert job["metadata"]["labels"][QUEUE_LABEL] == "team-a", name
                cp.kubectl("patch", "job", name, "-n", ns, "--type=merge", "-p",
                           '{"spec": {"suspend": false}}')  # fmt: skip
                admitted.add(name)
            elif name not in played:
                played.add(name)
                _play_unit(cp, ns, job, operator, tmp_path)
        return finished(cp, ns, "queued")

    done: dict[str, Any] = cp.wait_for(step, timeout=180, what="the admitted run finished")
    assert done["phase"] == "Succeeded", done
    assert done["units"]["queued"] == 0
    assert done["units"]["succeeded"] == done["units"]["total"] == len(admitted)
    assert ready(done)["reason"] == "Completed"
