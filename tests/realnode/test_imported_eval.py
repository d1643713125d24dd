"""An imported OpenAI eval end to end on the real node, scored as `evalkube run` scores it.

The importer tests' export (tests/fixtures/openai_eval_export.json: string_check, python and
fuzzy_match criteria), plus ``score_model`` and ``meteor`` criteria (the latter reads WordNet
from the evalkube image), goes through ``evalkube import
openai``; the EvalSuite and EvalRun it writes run on the real node (gVisor pods, the proxy
sidecar) and, unchanged but for the provider's address and key, in ``evalkube run``, both
against tests/realnode/fake_provider.py (a real HTTP server: outside the cluster for the pods,
on loopback for the local run). Same answers, so the same scores. The run's ``spec.gate`` has
a threshold that passes and one that fails: the operator must write ``Passed=False`` naming
the failed one, and ``status.gate`` with both. The calls the status counts must be the calls
the provider saw.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.ctrlplane import wait_for
from tests.cluster.realnode import RealNode
from tests.realnode.support import (
    OUTSIDE_IP,
    diagnose,
    outside_host,
    provider_calls,
    wait_finished,
)
from tests.support.ports import accepts

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EVALKUBE = str(Path(sys.executable).parent / "evalkube")
EXPORT = ROOT / "tests" / "fixtures" / "openai_eval_export.json"
FAKE = str(Path(__file__).with_name("fake_provider.py"))
PORT = 8443
KEY = "sk-realnode-import-0123456789"
SCORED = {
    "type": "score_model",
    "name": "judged",
    "model": "gpt-4.1-mini",
    "input": [
        {"role": "system", "content": "Score the answer from 0 to 10."},
        {"role": "user", "content": "Q: {{ item.question }} A: {{ sample.output_text }}"},
    ],
    "range": [0, 10],
    "pass_threshold": 5,
}
#: meteor needs WordNet on the grading machine: the evalkube image's, and the host's locally.
METEOR = {
    "type": "text_similarity",
    "name": "meteor",
    "input": "{{ sample.output_text }}",
    "reference": "with one {{ item.question }}",  # words of the prompt the fake repeats
    "evaluation_metric": "meteor",
    "pass_threshold": 0.1,
}


def _imported(tmp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    export = json.loads(EXPORT.read_text())
    export["eval"]["testing_criteria"].extend([SCORED, METEOR])
    source = tmp / "export.json"
    source.write_text(json.dumps(export))
    done = subprocess.run(
        [EVALKUBE, "import", "openai", str(source), "--out", str(tmp)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    suite = yaml.safe_load((tmp / "suite.yaml").read_text())
    run = yaml.safe_load((tmp / "run.yaml").read_text())
    return suite, run


def _local_scores(tmp: Path, suite: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """``evalkube run`` of the same import against the same fake provider on loopback."""
    port = PORT + 1
    local = copy.deepcopy(run)
    local["spec"]["providers"]["openai"]["baseURL"] = f"http://127.0.0.1:{port}/v1"
    (tmp / "local-run.yaml").write_text(yaml.safe_dump(local))
    server = subprocess.Popen([sys.executable, FAKE, "127.0.0.1", str(port)])
    try:
        wait_for(lambda: accepts(port), timeout=30, what="the local fake provider")
        out = tmp / "results.json"
        done = subprocess.run(
            [EVALKUBE, "run", str(tmp / "suite.yaml"), str(tmp / "local-run.yaml"),
             "--sandbox", "process", "--db", f"sqlite:///{tmp / 'local.db'}",
             "--output", str(out), "--quiet"],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "OPENAI_API_KEY": KEY},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
    finally:
        server.kill()
        server.wait(timeout=10)
    (result,) = json.loads(out.read_text())["results"]
    scores: dict[str, Any] = result
    return scores


def test_an_imported_eval_scores_the_same_on_the_node_and_its_gate_is_written(
    evalkube_on_node: RealNode, node_namespace: str, tmp_path: Path
) -> None:
    node, ns = evalkube_on_node, node_namespace
    suite, run = _imported(tmp_path)
    local = _local_scores(tmp_path, suite, run)
    (task,) = suite["spec"]["tasks"]
    assert set(local["metrics"]) >= {
        "Contains_the_answer", "Short_enough", "fuzzy", "judged", "meteor",
    }  # fmt: skip
    assert 0 < local["metrics"]["meteor"] < 1
    # the fake judge gives 8 unless the item is "Say blue" (2): 2 of 3 pass
    assert local["metrics"]["judged"] == pytest.approx(6.0)
    assert local["criteria"]["judged"] == {"passed": 2, "failed": 1}

    suite["metadata"] = {"name": suite["metadata"]["name"], "namespace": ns}
    run["metadata"] = {"name": "imported", "namespace": ns}
    run["spec"]["suiteRef"] = {"name": suite["metadata"]["name"]}
    run["spec"]["providers"]["openai"] = {
        "baseURL": f"http://{OUTSIDE_IP}:{PORT}/v1",
        "credentialsSecretRef": {"name": "provider", "key": "api-key"},
    }
    run["spec"]["gate"] = {
        "thresholds": [
            {"task": task["id"], "metric": "Contains_the_answer", "min": 0.5},  # 2/3: passes
            {"task": task["id"], "metric": "judged", "min": 9},  # 6: fails
        ]
    }
    with outside_host(node, [FAKE, OUTSIDE_IP, str(PORT)]) as netns:
        node.kubectl(
            "create", "secret", "generic", "provider", "-n", ns, f"--from-literal=api-key={KEY}"
        )  # fmt: skip
        node.apply(suite)
        node.apply(run)
        status = wait_finished(node, ns, "imported")["status"]
        calls = provider_calls(netns, PORT)
        failed = "" if status["phase"] == "Succeeded" else diagnose(node, ns)
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1) + failed
    (result,) = status["results"]
    assert result["counts"] == local["counts"]
    for metric, value in local["metrics"].items():
        assert result["metrics"][metric] == pytest.approx(value, abs=1e-6), metric
    assert result["criteria"] == local["criteria"]
    # one candidate per item shared by the five criteria, one judge call per item
    assert result["modelCalls"] == local["model_calls"] == {"candidate": 3, "judge": 3}, result
    assert len(calls) == 6
    assert {c["authorization"] for c in calls} == {f"Bearer {KEY}"}
    # the gate, written on the node
    passed = next(c for c in status["conditions"] if c["type"] == "Passed")
    assert (passed["status"], passed["reason"]) == ("False", "GateFailed"), passed
    assert "judged" in passed["message"]
    assert "Contains_the_answer" not in passed["message"]
    gate = status["gate"]
    assert gate["passed"] is False
    outcome = {c["metric"]: c["passed"] for c in gate["checks"] if c["kind"] == "min"}
    assert outcome == {"Contains_the_answer": True, "judged": False}, gate
