"""Built-in model graders (score_model, label_model, cosine) in a cluster run.

On the real control plane (etcd, kube-apiserver, kwok) the operator accepts the suite and
creates Jobs whose runner mounts the bridge socket and whose grader does not; each unit is then
played as its pod would run it: the proxy sidecar (``evalkube proxy`` with the Job's own flags,
Python and Go engines) and the runner (``evalkube unit`` with ``--bridge``), against a fake
provider that is a real HTTP server on loopback (tests/integration/engine/test_model_graders.py).
The EvalRun's status must show the judges' scores and exactly the calls the provider saw.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.ctrlplane import wait_for
from tests.cluster.plugin import COMPLETE_ANNOTATION, ControlPlane
from tests.conftest import require
from tests.integration.cluster.operator_support import (
    EVALKUBE,
    _free_port,
    _jobs,
    finished,
    install_crds,
    running_operator,
)
from tests.integration.engine.test_model_graders import KEY, ROWS, SUITE, FakeJudge

from evalkube.controller import manifests
from evalkube.proxy.native import native_binary

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def _suite(namespace: str) -> dict[str, Any]:
    """The engine test's suite as a CRD spells it (camelCase sampling params)."""
    suite = copy.deepcopy(SUITE)
    suite["metadata"] = {"name": "judges", "namespace": namespace}
    sampling = suite["spec"]["tasks"][0]["graders"][0]["samplingParams"]
    sampling["maxCompletionsTokens"] = sampling.pop("max_completions_tokens")
    return suite


def _wait_socket(path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None, f"the proxy exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"no socket at {path}"
        time.sleep(0.05)


def _play_with_sidecar(
    cp: ControlPlane, ns: str, job: dict[str, Any], ingest: str, tmp: Path, engine: str
) -> None:
    """Run the Job's proxy sidecar (its flags, sockets moved under ``tmp``) and its runner."""
    pod = job["spec"]["template"]["spec"]
    proxy = next(c for c in pod["initContainers"] if c["name"] == "proxy")
    runner = next(c for c in pod["containers"] if c["name"] == "runner")
    snapshot_cm = next(v for v in pod["volumes"] if v["name"] == "snapshot")["configMap"]["name"]
    data = cp.kubectl_json("get", "configmap", snapshot_cm, "-n", ns)["data"]
    (tmp / "snapshot.json").write_text(data["snapshot.json"])
    (tmp / "key").write_text(KEY)
    moved = {
        f"{manifests.SNAPSHOT_DIR}/snapshot.json": str(tmp / "snapshot.json"),
        f"unix:{manifests.BRIDGE_SOCKET}": f"unix:{tmp / 'bridge.sock'}",
        f"unix:{manifests.CONTROL_SOCKET}": f"unix:{tmp / 'control.sock'}",
    }
    command = [moved.get(arg, arg) for arg in proxy["command"]]
    command[command.index("--engine") + 1] = engine
    key_env = {e["name"]: str(tmp / "key") for e in proxy["env"] if "value" in e}
    with (tmp / "proxy.log").open("wb") as log:
        sidecar = subprocess.Popen(
            [EVALKUBE, *command[1:]], env={**os.environ, **key_env}, stdout=log, stderr=log
        )
    try:
        _wait_socket(tmp / "bridge.sock", sidecar)
        _wait_socket(tmp / "control.sock", sidecar)
        args = runner["command"]
        secret_ref = runner["env"][0]["valueFrom"]["secretKeyRef"]
        secret = cp.kubectl_json("get", "secret", secret_ref["name"], "-n", ns)
        token = base64.b64decode(secret["data"][secret_ref["key"]]).decode()
        done = subprocess.run(
            [
                EVALKUBE, "unit",
                "--snapshot", str(tmp / "snapshot.json"),
                "--unit", args[args.index("--unit") + 1],
                "--ingest-url", ingest,
                "--sandbox", "auto",
                "--bridge", f"unix:{tmp / 'bridge.sock'}",
                "--bridge-control", f"unix:{tmp / 'control.sock'}",
            ],
            env={**os.environ, "EVALKUBE_INGEST_TOKEN": token},
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
    finally:
        sidecar.terminate()
        sidecar.wait(timeout=30)
    for p in cp.kubectl_json("get", "pods", "-n", ns, "-l", f"job-name={job['metadata']['name']}")[
        "items"
    ]:
        cp.kubectl(
            "annotate", "pod", p["metadata"]["name"], "-n", ns,
            f"{COMPLETE_ANNOTATION}=true", "--overwrite",
        )  # fmt: skip


@pytest.mark.parametrize("engine", ["python", "native"])
def test_model_built_ins_run_through_the_pod_bridge_and_are_counted(
    control_plane: ControlPlane, cluster_namespace: str, tmp_path: Path, engine: str
) -> None:
    if engine == "native" and native_binary() is None:
        require("no evalkube-proxy binary: export EVALKUBE_PROXY_BIN=$(bash .ci/proxy.sh)")
    cp, ns = control_plane, cluster_namespace
    install_crds(cp)
    cp.kubectl(
        "create", "secret", "generic", "judge", "-n", ns, f"--from-literal=api-key={KEY}"
    )  # fmt: skip
    with (
        FakeJudge() as judge,
        running_operator(cp, tmp_path / "results.db", _free_port()) as ingest,
    ):
        cp.apply(_suite(ns))
        cp.apply(
            {
                "apiVersion": "evalkube.io/v1alpha1",
                "kind": "EvalRun",
                "metadata": {"name": "judged", "namespace": ns},
                "spec": {
                    "suiteRef": {"name": "judges"},
                    "models": ["precomputed"],
                    "judgeModel": "openai:judge-1",
                    "embeddingModel": "openai:embed-3",
                    "providers": {
                        "openai": {
                            "baseURL": judge.base_url,
                            "credentialsSecretRef": {"name": "judge", "key": "api-key"},
                        }
                    },
                },
            }
        )
        jobs: dict[str, dict[str, Any]] = wait_for(
            lambda: (j := _jobs(cp, ns)) and len(j) == 2 and j, timeout=60, what="2 unit Jobs",
            on_timeout=lambda: json.dumps(
                [cp.kubectl_json("get", k, "-n", ns)["items"] for k in ("evalsuites", "evalruns")]
            ),
        )  # fmt: skip
        for unit_id, job in sorted(jobs.items()):
            pod = job["spec"]["template"]["spec"]
            mounts = {
                c["name"]: {m["name"] for m in c["volumeMounts"]}
                for c in pod["initContainers"] + pod["containers"]
            }
            # the trusted runner makes the built-ins' calls; the sandboxed grader gets nothing
            assert "bridge" in mounts["runner"], unit_id
            assert "bridge" not in mounts["grader"], unit_id
            work = tmp_path / unit_id
            work.mkdir()
            _play_with_sidecar(cp, ns, job, ingest, work, engine)
        status = cp.wait_for(lambda: finished(cp, ns, "judged"), timeout=60, what="finished")
        seen = list(judge.received)
    assert status["phase"] == "Succeeded", status
    results = {r["task"]: r for r in status["results"]}
    judged, similar = results["judged"], results["similar"]
    assert judged["counts"] == {"samples": 3, "valid": 3, "invalid": 0, "errored": 0}
    # Paris 8 / correct, Rome 2 / incorrect, weird 42: clamped into range [0, 10] (OpenAI's
    # score_model), so 10
    assert judged["metrics"]["quality"] == pytest.approx(20 / 3)
    assert judged["metrics"]["verdict"] == pytest.approx(1 / 3)
    # the fake embeds a text as [len(text), 1.0]
    cosines = [
        (len(r["out"]) * len(r["answer"]) + 1.0)
        / (math.hypot(len(r["out"]), 1.0) * math.hypot(len(r["answer"]), 1.0))
        for r in ROWS
    ]
    assert similar["metrics"]["score"] == pytest.approx(sum(cosines) / len(ROWS))
    responses = [c for c in seen if c.path == "/v1/responses"]
    embeddings = [c for c in seen if c.path == "/v1/embeddings"]
    assert judged["modelCalls"] == {"judge": len(responses)} == {"judge": 2 * len(ROWS)}
    assert similar["modelCalls"] == {"embedding": len(embeddings)} == {"embedding": len(ROWS)}
    assert {c.headers["Authorization"] for c in seen} == {f"Bearer {KEY}"}
