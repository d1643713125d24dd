"""The operator, installed by the chart on the real node, logs a finished EvalRun to a real
MLflow tracking server (``mlflow server``, SQLite backend, local artifacts) on a host outside
the cluster: the run is read back through the MLflow client from that host with its params,
every metric of the EvalRun's status, and its artifacts (the HTML report included: the image
runs ``evalkube operator``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from evalkube.controller import names
from tests.cluster.realnode import RealNode
from tests.conftest import require
from tests.realnode.support import OUTSIDE_IP, eval_run, outside_host, wait_finished
from tests.support.mlflow_server import mlflow_bin

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(900)]

PORT = 5005
EXACT = "def grade(sample, item):\n    return float(sample['output_text'] == item['target'])\n"
#: ``python -c EXEC PROGRAM ARGS...``: become PROGRAM (outside_host runs the test's Python),
#: without MLflow's telemetry and background job runner (as tests/support/mlflow_server.py)
EXEC = (
    "import os, sys; os.environ.update(MLFLOW_DISABLE_TELEMETRY='true', "
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION='false'); os.execv(sys.argv[1], sys.argv[1:])"
)
#: Read the MLflow run of an evalkube run id back through the MLflow client; print it as JSON.
READ_BACK = """
import json, os, sys
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
from mlflow import MlflowClient
client = MlflowClient(tracking_uri=sys.argv[1])
experiment = client.get_experiment_by_name(sys.argv[2])
(run,) = client.search_runs(
    [experiment.experiment_id], filter_string=f"tags.`evalkube.run_id` = '{sys.argv[3]}'"
)
print(json.dumps({
    "id": run.info.run_id, "status": run.info.status, "params": run.data.params,
    "tags": run.data.tags, "metrics": run.data.metrics,
    "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id)),
}))
"""


def test_the_operator_logs_an_evalrun_to_mlflow_outside_the_cluster(
    evalkube_on_node: RealNode, node_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    node, ns = evalkube_on_node, node_namespace
    bindir = mlflow_bin()
    if bindir is None or not (bindir / "mlflow").exists():
        require("the MLflow tracking server is not installed (bash .ci/mlflow.sh)")
        return
    root = tmp_path_factory.mktemp("mlflow")
    server = [
        "-c", EXEC, str(bindir / "mlflow"), "server", "--host", OUTSIDE_IP,
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination", str(root / "artifacts"),
        "--workers", "1", "--allowed-hosts", "*", "--port", str(PORT),
    ]  # fmt: skip
    url = f"http://{OUTSIDE_IP}:{PORT}"
    with outside_host(node, server, wait=180) as outside:
        rows = [{"id": f"r{i}", "a": str(i), "out": str(i) if i % 4 else "x"} for i in range(8)]
        node.apply(
            {
                "apiVersion": "evalkube.io/v1alpha1",
                "kind": "EvalSuite",
                "metadata": {"name": "tracked", "namespace": ns},
                "spec": {
                    "tasks": [
                        {
                            "id": "qa",
                            "dataset": {"rows": rows, "idField": "id"},
                            "prompt": "{{ item.a }}",
                            "target": "{{ item.a }}",
                            "outputs": {"column": "out"},
                            "grader": {"type": "python", "source": EXACT, "metricId": "exact"},
                        }
                    ]
                },
            }
        )
        node.apply(eval_run(ns, "tracked", "tracked", tracking={"mlflow": {"trackingURI": url}}))
        run = wait_finished(node, ns, "tracked")
        status = run["status"]
        assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
        tracked = _tracked(node, ns)
        assert tracked["status"] == "True", tracked
        done = subprocess.run(
            ["nsenter", f"--net=/run/netns/{outside}", sys.executable, "-c", READ_BACK,
             url, f"evalkube/{ns}/tracked", _evalkube_run_id(node, ns)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    assert found["id"] in tracked["message"]
    assert found["status"] == "FINISHED"
    assert found["params"]["suite_version"] == status["suiteVersion"]
    assert found["params"]["sandbox"] == "pod (gVisor)"
    assert found["tags"]["evalkube.evalrun"] == "tracked"
    (result,) = status["results"]
    assert result["metrics"] == {"exact": 0.75}
    assert found["metrics"] == {
        "qa/precomputed/exact": 0.75,
        "qa/precomputed/count/samples": 8,
        "qa/precomputed/count/valid": 8,
        "qa/precomputed/count/invalid": 0,
        "qa/precomputed/count/errored": 0,
    }
    assert found["artifacts"] == ["report.html", "results.json", "samples.jsonl"]


def _tracked(node: RealNode, ns: str) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while True:
        status = node.kubectl_json("get", "evalrun", "tracked", "-n", ns)["status"]
        found = next(c for c in status["conditions"] if c["type"] == "Tracked")
        if found["status"] != "Unknown" or time.monotonic() > deadline:
            return dict(found)
        time.sleep(2)


def _evalkube_run_id(node: RealNode, ns: str) -> str:
    """The run id the operator stores the EvalRun under (``evalkube.run_id``)."""
    meta = node.kubectl_json("get", "evalrun", "tracked", "-n", ns)["metadata"]
    return str(names.run_id(ns, "tracked", meta["uid"]))
