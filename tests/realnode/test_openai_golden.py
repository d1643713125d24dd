"""The golden OpenAI grader cases scored by work pods on the real node, as the golden file says.

The cases of tests/fixtures/openai_golden.json (the same tasks tests/e2e/test_openai_golden.py
runs locally, imported as OpenAI exported them), each task a model under test asked
``golden case <id>`` (its items in a ConfigMap): a cluster cannot read the local run's
precomputed files, so
tests/support/golden_provider.py, outside the cluster, answers each case's sample (text, tool
calls) and its judge answer. Every unit is a gVisor pod generating, grading and reporting
through the proxy sidecar; ``status.results`` must hold each case's expected score and pass.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.realnode import RealNode
from tests.e2e.test_openai_golden import (
    CASES,
    GOLDEN_FILE,
    expected_results,
    generated,
    task_id,
)
from tests.realnode.support import OUTSIDE_IP, diagnose, outside_host, provider_calls, wait_finished

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1500)]


def _one_per_grader_type() -> list[dict[str, Any]]:
    """The first case of each grader type, and of the one metric that calls a model
    (``cosine``: an embeddings call): what takes a different path through a work pod. The
    metrics' own arithmetic is the same code on every path, each case checked locally by
    tests/e2e/test_openai_golden.py."""
    first: dict[tuple[str, bool], dict[str, Any]] = {}
    for case in CASES:
        grader = case["grader"]
        first.setdefault((grader["type"], grader.get("evaluation_metric") == "cosine"), case)
    return list(first.values())


EACH_RUN = _one_per_grader_type()

PROVIDER = str(Path(__file__).parents[1] / "support" / "golden_provider.py")
PORT = 8443
KEY = "sk-realnode-golden-0123456789"


@pytest.mark.parametrize(
    "cases",
    [
        pytest.param(EACH_RUN, id="one-per-grader-type"),
        # every case: 71 work pods, about 6 minutes
        pytest.param(CASES, id="every-case", marks=pytest.mark.nightly),
    ],
)
def test_work_pods_score_golden_cases_as_expected(
    evalkube_on_node: RealNode, node_namespace: str, tmp_path: Path, cases: list[dict[str, Any]]
) -> None:
    node, ns = evalkube_on_node, node_namespace
    suite, run = generated(tmp_path)
    suite = copy.deepcopy(suite)
    wanted = {task_id(case) for case in cases}
    suite["spec"]["tasks"] = [t for t in suite["spec"]["tasks"] if t["id"] in wanted]
    # the items go in a ConfigMap, as a cluster keeps datasets: the API server drops null
    # values from an EvalSuite's inline rows (`{"answer": null}` would lose `answer`)
    rows = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "golden-rows", "namespace": ns}, "data": {}}  # fmt: skip
    for task in suite["spec"]["tasks"]:
        rows["data"][task["id"]] = "".join(json.dumps(r) + "\n" for r in task["dataset"]["rows"])
        task["dataset"] = {"configMapRef": {"name": "golden-rows", "key": task["id"]}}
    suite["metadata"] = {"name": "openai-golden", "namespace": ns}
    run["metadata"] = {"name": "golden", "namespace": ns}
    run["spec"]["suiteRef"] = {"name": "openai-golden"}
    run["spec"]["providers"]["openai"] = {
        "baseURL": f"http://{OUTSIDE_IP}:{PORT}/v1",
        "credentialsSecretRef": {"name": "provider", "key": "api-key"},
    }
    with outside_host(node, [PROVIDER, str(GOLDEN_FILE), OUTSIDE_IP, str(PORT)]) as netns:
        node.kubectl(
            "create", "secret", "generic", "provider", "-n", ns, f"--from-literal=api-key={KEY}"
        )  # fmt: skip
        node.apply(rows)
        node.apply(suite)
        node.apply(run)
        status = wait_finished(node, ns, "golden", timeout=1200)["status"]
        calls = provider_calls(netns, PORT)
        failed = "" if status["phase"] == "Succeeded" else diagnose(node, ns)
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1) + failed
    assert {r["task"] for r in status["results"]} == wanted
    assert expected_results(status["results"], cases) == []
    judged = sum(c["grader"]["type"] in ("score_model", "label_model") for c in cases)
    cosine = sum(c["grader"].get("evaluation_metric") == "cosine" for c in cases)
    assert len(calls) == len(cases) + judged + cosine  # a candidate per case, a call per judge
    assert {c["authorization"] for c in calls} == {f"Bearer {KEY}"}
    pods = node.kubectl_json("get", "pods", "-n", ns)["items"]
    assert pods
    assert {p["spec"]["runtimeClassName"] for p in pods} == {"gvisor"}
