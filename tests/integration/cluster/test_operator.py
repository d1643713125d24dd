"""The operator end to end on the real control plane (etcd, kube-apiserver, controllers, kwok).

The operator runs in-process with kopf's KopfRunner, its HTTP server on loopback. kwok holds
each work-unit Pod at Running; the test plays the kubelet: it runs the unit's runner command
itself (same snapshot, same ingest token, a real local sandbox), then lets the Pod complete.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.plugin import COMPLETE_ANNOTATION, HOLD_ANNOTATION, ControlPlane

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
EVALKUBE = str(Path(sys.executable).parent / "evalkube")

EXACT = (ROOT / "examples/recipes/graders/exact_match.py").read_text()
MACRO_F1 = (ROOT / "examples/recipes/graders/macro_f1.py").read_text()
SENTIMENT = [
    {"text": "Great support experience.", "label": "positive", "output": "positive"},
    {"text": "Terrible wait times.", "label": "negative", "output": "negative"},
    {"text": "It was fine.", "label": "neutral", "output": "positive"},
    {"text": "Loved it!", "label": "positive", "output": "positive"},
    {"text": "Never again.", "label": "negative", "output": "neutral"},
    {"text": "Okay I guess.", "label": "neutral", "output": "neutral"},
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def suite(namespace: str) -> dict[str, Any]:
    qa_rows = [{"q": f"{i}?", "a": str(i), "out": str(i) if i % 5 else "wrong"} for i in range(25)]
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "qa", "namespace": namespace},
        "spec": {
            "tasks": [
                {
                    "id": "qa",
                    "dataset": {"rows": qa_rows},
                    "prompt": "{{ item.q }}",
                    "target": "{{ item.a }}",
                    "outputs": {"column": "out"},
                    "grader": {"type": "python", "source": EXACT, "metricId": "exact_match"},
                },
                {
                    "id": "sentiment",
                    "dataset": {"rows": SENTIMENT},
                    "prompt": "{{ item.text }}",
                    "target": "{{ item.label }}",
                    "outputs": {"column": "output"},
                    "grader": {"type": "python", "contract": "batch", "source": MACRO_F1},
                    "metrics": ["macro_f1"],
                },
            ]
        },
    }


def run(namespace: str, name: str = "nightly") -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"], "shardSize": 10},
    }


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The operator (KopfRunner) with its store and HTTP server on loopback."""
    from kopf.testing import KopfRunner

    control_plane.apply(
        [json.loads(json.dumps(doc)) for doc in _crds()]
        + [
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "gvisor"},
                "handler": "runsc",
            }
        ]
    )
    control_plane.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/evalruns.evalkube.io",
        "crd/evalsuites.evalkube.io",
    )
    port = _free_port()
    store = tmp_path_factory.mktemp("operator") / "results.db"
    env = {
        "KUBECONFIG": str(control_plane.kubeconfig),
        "EVALKUBE_STORE_URL": f"sqlite:///{store}",
        "EVALKUBE_LISTEN": f"127.0.0.1:{port}",
        "EVALKUBE_INGEST_URL": f"http://127.0.0.1:{port}",
        "EVALKUBE_POD_ANNOTATIONS": json.dumps({HOLD_ANNOTATION: "true"}),
        "EVALKUBE_RECONCILE_INTERVAL": "0.5",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with KopfRunner(
            ["run", "--standalone", "-A", "-m", "evalkube.controller.handlers"]
        ) as runner:
            _wait_http(port)
            yield {"url": f"http://127.0.0.1:{port}", "store": str(store)}
        assert runner.exit_code == 0, runner.output
        assert runner.exception is None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _crds() -> list[dict[str, Any]]:
    import yaml

    return [
        yaml.safe_load((ROOT / "crds" / f).read_text())
        for f in ("evalsuites.evalkube.io.yaml", "evalruns.evalkube.io.yaml")
    ]


def _wait_http(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("operator HTTP server did not start")


def _jobs(cp: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    items = cp.kubectl_json("get", "jobs", "-n", namespace)["items"]
    return {j["metadata"]["annotations"]["evalkube.io/unit-id"]: j for j in items}


def _play_unit(
    cp: ControlPlane, namespace: str, job: dict[str, Any], ingest: str, tmp: Path
) -> None:
    """Do what the Pod would: run the runner command with the Pod's inputs, then complete."""
    runner = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "runner")
    args = runner["command"]
    unit = args[args.index("--unit") + 1]
    secret_ref = runner["env"][0]["valueFrom"]["secretKeyRef"]
    secret = cp.kubectl_json("get", "secret", secret_ref["name"], "-n", namespace)
    import base64

    token = base64.b64decode(secret["data"][secret_ref["key"]]).decode()
    snapshot_cm = next(
        v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "snapshot"
    )
    data = cp.kubectl_json("get", "configmap", snapshot_cm["configMap"]["name"], "-n", namespace)[
        "data"
    ]
    snapshot = tmp / "snapshot.json"
    snapshot.write_text(data["snapshot.json"])
    done = subprocess.run(
        [
            EVALKUBE,
            "unit",
            "--snapshot",
            str(snapshot),
            "--unit",
            unit,
            "--ingest-url",
            ingest,
            "--sandbox",
            "auto",
        ],
        env={**os.environ, "EVALKUBE_INGEST_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    pods = cp.kubectl_json(
        "get", "pods", "-n", namespace, "-l", f"job-name={job['metadata']['name']}"
    )["items"]
    assert pods, f"no pod for {job['metadata']['name']}"
    for pod in pods:
        cp.kubectl(
            "annotate",
            "pod",
            pod["metadata"]["name"],
            "-n",
            namespace,
            f"{COMPLETE_ANNOTATION}=true",
            "--overwrite",
        )


def test_run_reaches_succeeded_with_exact_scores(
    control_plane: ControlPlane, cluster_namespace: str, operator: dict[str, str], tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    cp.apply(suite(ns))
    started = time.monotonic()
    cp.apply(run(ns))
    # four shard units at once (qa: 10+10+5 rows, sentiment: 6); the aggregate waits
    jobs = cp.wait_for(
        lambda: (j := _jobs(cp, ns)) and len(j) == 4 and j, timeout=30, what="4 unit Jobs"
    )
    assert time.monotonic() - started < 30
    assert sorted(jobs) == [
        "qa.precomputed.00000",
        "qa.precomputed.00001",
        "qa.precomputed.00002",
        "sentiment.precomputed.00000",
    ]
    owned = [
        cp.kubectl_json("get", "networkpolicy", "nightly-egress", "-n", ns),
        cp.kubectl_json("get", "secret", "nightly-ingest", "-n", ns),
        cp.kubectl_json("get", "configmap", "nightly-snapshot", "-n", ns),
        *jobs.values(),
    ]
    for obj in owned:
        assert obj["metadata"]["ownerReferences"][0]["kind"] == "EvalRun"
    # the Pods were admitted under Pod Security "restricted"
    cp.wait_for(
        lambda: len(cp.kubectl_json("get", "pods", "-n", ns)["items"]) == 4,
        timeout=30,
        what="4 pods admitted",
    )
    for _unit_id, job in sorted(jobs.items()):
        _play_unit(cp, ns, job, operator["url"], tmp_path)
    aggregate = cp.wait_for(
        lambda: _jobs(cp, ns).get("sentiment.precomputed.batch"),
        timeout=60,
        what="aggregate unit Job",
    )
    _play_unit(cp, ns, aggregate, operator["url"], tmp_path)

    def finished() -> dict[str, Any] | None:
        status = cp.kubectl_json("get", "evalrun", "nightly", "-n", ns).get("status", {})
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    status = cp.wait_for(finished, timeout=90, what="EvalRun finished")
    assert status["phase"] == "Succeeded", status
    results = {r["task"]: r for r in status["results"]}
    assert results["qa"]["metrics"] == {"exact_match": pytest.approx(0.8)}
    assert results["qa"]["counts"] == {"samples": 25, "valid": 25, "invalid": 0, "errored": 0}
    assert results["sentiment"]["metrics"]["macro_f1"] == pytest.approx(0.655556, abs=1e-6)
    assert results["sentiment"]["metrics"]["correct"] == pytest.approx(4 / 6)
    assert "debug_label_count" not in results["sentiment"]["metrics"]
    assert status["units"] == {"total": 5, "succeeded": 5, "running": 0, "failed": 0, "pending": 0}
    ready = {c["type"]: c for c in status["conditions"]}
    assert ready["Succeeded"]["status"] == "True"
    assert ready["Succeeded"]["observedGeneration"] == 1
    # the samples API serves the debugging view
    import httpx

    page = httpx.get(
        f"{operator['url']}/api/v1/namespaces/{ns}/evalruns/nightly/samples",
        params={"task": "qa", "limit": 3},
    ).json()
    assert len(page["samples"]) == 3
    assert page["next_cursor"]
    # ... and `evalkube samples --api` reads it
    shown = subprocess.run(
        [
            EVALKUBE,
            "samples",
            "nightly",
            "--api",
            operator["url"],
            "-n",
            ns,
            "--task",
            "qa",
            "--status",
            "valid",
            "--limit",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    views = json.loads(shown.stdout)
    assert [v["task_id"] for v in views] == ["qa", "qa"]
    assert all(v["scores"] for v in views)
    # deleting the run removes what it owns (garbage collector, via ownerReferences)
    cp.kubectl("delete", "evalrun", "nightly", "-n", ns)
    cp.wait_for(
        lambda: (
            not cp.kubectl_json(
                "get",
                "jobs,networkpolicies,configmaps,secrets",
                "-n",
                ns,
                "-l",
                "evalkube.io/run=nightly",
            )["items"]
        ),
        timeout=60,
        what="owned objects garbage-collected",
    )


def test_wrong_token_is_rejected(operator: dict[str, str], cluster_namespace: str) -> None:
    import httpx

    response = httpx.post(
        f"{operator['url']}/api/v1/namespaces/{cluster_namespace}/evalruns/nope/samples",
        json={"samples": []},
        headers={"Authorization": "Bearer forged"},
    )
    assert response.status_code == 404
