"""examples/recipes as EvalSuite + EvalRun on a real node: every work unit a real gVisor pod.

The run must reach ``Succeeded`` with exactly the metrics and counts that ``evalkube run``
prints for the same files on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.realnode import RealNode
from tests.realnode.support import eval_run, local_suite_to_cluster, wait_finished

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "recipes" / "suite.yaml"
EVALKUBE = Path(sys.executable).parent / "evalkube"


def local_results(tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [str(EVALKUBE), "run", str(RECIPES), "--output", str(out),
         "--db", f"sqlite:///{tmp_path / 'local.db'}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    return {r["task"]: (r["metrics"], r["counts"]) for r in results}


def test_recipes_run_on_the_node_with_the_scores_of_evalkube_run(
    evalkube_on_node: RealNode, node_namespace: str, tmp_path: Path
) -> None:
    node = evalkube_on_node
    node.apply(local_suite_to_cluster(RECIPES, node_namespace, "recipes"))
    node.apply(eval_run(node_namespace, "recipes", "recipes"))
    run = wait_finished(node, node_namespace, "recipes")
    status = run["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    on_node = {r["task"]: (r["metrics"], r["counts"]) for r in status["results"]}
    assert on_node == local_results(tmp_path)
    # every unit ran as a pod on the real node, under the gvisor RuntimeClass
    pods = node.kubectl_json("get", "pods", "-n", node_namespace)["items"]
    assert pods, "no work-unit pod was created"
    for pod in pods:
        assert pod["spec"]["runtimeClassName"] == "gvisor"
        assert pod["spec"]["nodeName"] == "realnode-0"
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
