"""An operator restart in the middle of a run on the real node: the operator pod is deleted
while work-unit pods run, the Deployment starts a new one on the same store, and the run
finishes with every unit's Job created once, every sample recorded once, and exact scores."""

from __future__ import annotations

import json
import time

import pytest

from tests.cluster.realnode import RealNode
from tests.integration.cluster.operator_support import suite
from tests.realnode.support import OPERATOR_NS, RELEASE, eval_run, wait_finished

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1200)]


def test_operator_pod_deleted_mid_run_loses_and_duplicates_nothing(
    evalkube_on_node: RealNode, node_namespace: str
) -> None:
    node = evalkube_on_node
    node.apply(suite(node_namespace))
    node.apply(eval_run(node_namespace, "restart", "qa", shardSize=5))
    selector = f"app.kubernetes.io/name=evalkube,app.kubernetes.io/instance={RELEASE}"
    (old,) = node.kubectl_json("get", "pods", "-n", OPERATOR_NS, "-l", selector)["items"]

    def some_jobs_running() -> dict[str, str]:
        jobs = node.kubectl_json("get", "jobs", "-n", node_namespace)["items"]
        return {j["metadata"]["name"]: j["metadata"]["uid"] for j in jobs}

    before = node.wait_for(some_jobs_running, timeout=300, what="the first work-unit Jobs")
    node.kubectl("delete", "pod", "-n", OPERATOR_NS, old["metadata"]["name"], "--wait=false")
    deadline = time.monotonic() + 180
    while True:
        pods = node.kubectl_json("get", "pods", "-n", OPERATOR_NS, "-l", selector)["items"]
        if any(p["metadata"]["uid"] != old["metadata"]["uid"] for p in pods):
            break
        assert time.monotonic() < deadline, "no new operator pod"
        time.sleep(1)
    status = wait_finished(node, node_namespace, "restart", timeout=900)["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    results = {r["task"]: r for r in status["results"]}
    assert results["qa"]["metrics"] == {"exact_match": pytest.approx(0.8)}
    assert results["qa"]["counts"] == {"samples": 25, "valid": 25, "invalid": 0, "errored": 0}
    assert results["sentiment"]["metrics"]["macro_f1"] == pytest.approx(0.655556, abs=1e-6)
    assert results["sentiment"]["counts"]["samples"] == 6
    units = status["units"]
    assert units["succeeded"] == units["total"], units
    assert units["failed"] == 0, units
    jobs = node.kubectl_json("get", "jobs", "-n", node_namespace)["items"]
    assert len(jobs) == units["total"]  # one Job per unit: none created twice
    for job in jobs:  # Jobs created before the restart were kept, not re-created
        name = job["metadata"]["name"]
        if name in before:
            assert job["metadata"]["uid"] == before[name], f"{name} was re-created"
