"""``evalkube submit`` against the real node, as a user on a laptop with the cluster's
kubeconfig and the object store's keys: the local files of a suite are uploaded to SeaweedFS
(outside the cluster), the EvalSuite and EvalRun applied, and the scores the pods produce are
printed as ``evalkube run`` prints them; a 100 MB local dataset goes the same way, and a failed
gate exits 1. The model-backed example goes with its provider key where a user keeps it, in
the environment: submit makes it a Secret the run owns, and its judge and embedding calls reach
a fake provider outside the cluster with that key."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.ctrlplane import wait_for
from tests.cluster.realnode import RealNode
from tests.integration.cluster.test_submit import table
from tests.realnode.support import (
    OUTSIDE_IP,
    diagnose,
    provider_calls,
    s3_secret_and_storage,
    served_in,
)
from tests.support.s3_server import S3Server

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "recipes" / "suite.yaml"
MODEL_BACKED = ROOT / "examples" / "model-backed"
PROVIDER = str(Path(__file__).with_name("fake_provider.py"))
PORT = 8443
KEY = "sk-realnode-submit-0123456789"
EVALKUBE = str(Path(sys.executable).parent / "evalkube")
EXACT = "def grade(sample, item):\n    return float(sample['output_text'] == item['a'])\n"


def submit(
    node: RealNode, s3: S3Server, cwd: Path, *args: str, timeout: float = 1200, **env: str
) -> subprocess.CompletedProcess[str]:
    """``evalkube submit`` from the node's network (where its API server and the outside host
    are reachable), with the store's keys in the environment as a user has them."""
    keys = {k: v for k, v in s3.env.items() if k != "AWS_ENDPOINT_URL"}
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{node.netns}", EVALKUBE, "submit", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **keys, "KUBECONFIG": str(node.kubeconfig), "COLUMNS": "160", **env},
    )  # fmt: skip


def run_file(path: Path, name: str, storage: dict[str, Any], **spec: Any) -> Path:
    doc = {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalRun", "metadata": {"name": name},
           "spec": {"models": ["precomputed"], "storage": storage, **spec}}  # fmt: skip
    path.write_text(yaml.safe_dump(doc))
    return path


def local_run(suite: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EVALKUBE, "run", str(suite), *extra, "--db", str(cwd / "local.db")],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_submit_runs_the_examples_and_a_100_mb_dataset_on_the_node(
    evalkube_on_node: RealNode, node_namespace: str, store_outside: S3Server, tmp_path: Path
) -> None:
    node, ns, s3 = evalkube_on_node, node_namespace, store_outside
    bucket = f"submit-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    storage = s3_secret_and_storage(node, ns, s3)

    # the examples, as they are on disk
    recipes_run = run_file(tmp_path / "recipes-run.yaml", "recipes", storage)
    done = submit(node, s3, tmp_path, str(RECIPES), str(recipes_run), "-n", ns,
                  "--store", f"s3://{bucket}/team")  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:] + done.stdout[-3000:] + diagnose(node, ns)
    local = local_run(RECIPES, tmp_path)
    assert local.returncode == 0, local.stderr
    assert table(done.stdout) == table(local.stdout), done.stdout + local.stdout

    # 100 MB of local JSONL (50,000 rows of 2 KB), with a gate the scores fail
    folder = tmp_path / "big"
    (folder / "data").mkdir(parents=True)
    with (folder / "data" / "rows.jsonl").open("w") as out:
        for i in range(50_000):
            row = {
                "id": f"r{i}",
                "a": str(i % 9),
                "out": str(i % 9) if i % 5 else "-",
                "pad": "p" * 2_000,
            }
            out.write(json.dumps(row) + "\n")
    size = (folder / "data" / "rows.jsonl").stat().st_size
    assert size > 100_000_000
    suite = {
        "apiVersion": "evalkube.io/v1alpha1", "kind": "EvalSuite", "metadata": {"name": "big"},
        "spec": {"tasks": [{
            "id": "qa", "dataset": {"path": "data/rows.jsonl", "idField": "id"},
            "outputs": {"column": "out"},
            "grader": {"type": "python", "metricId": "exact_match", "source": EXACT},
        }]},
    }  # fmt: skip
    (folder / "suite.yaml").write_text(yaml.safe_dump(suite))
    gate = {"thresholds": [{"task": "qa", "metric": "exact_match", "min": 0.9}]}
    big_run = run_file(folder / "run.yaml", "big", storage, shardSize=10_000, gate=gate)
    started = time.monotonic()
    done = submit(node, s3, folder, str(folder / "suite.yaml"), str(big_run), "-n", ns,
                  "--store", f"s3://{bucket}/team")  # fmt: skip
    seconds = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-5000:] + done.stdout[-3000:] + diagnose(node, ns)
    assert "gate FAILED" in done.stdout
    status = node.kubectl_json("get", "evalrun", "big", "-n", ns)["status"]
    [result] = status["results"]
    assert result["metrics"]["exact_match"] == pytest.approx(0.8)
    assert result["counts"]["samples"] == 50_000
    assert status["units"]["total"] == 5
    [task] = node.kubectl_json("get", "evalsuite", "big", "-n", ns)["spec"]["tasks"]
    assert task["dataset"]["uri"].startswith(f"s3://{bucket}/team/big/")
    figure = f"{size:,} bytes of JSONL submitted and graded on the node in {seconds:.0f} s"
    print(f"[submit] {figure}", file=sys.__stderr__)


def test_submit_runs_the_model_backed_example_with_its_key_from_the_environment(
    evalkube_on_node: RealNode, node_namespace: str, store_outside: S3Server, tmp_path: Path
) -> None:
    """examples/model-backed as a user submits it: the run file names its key by environment
    variable (``apiKeyEnv``), pointed at the team's OpenAI-compatible endpoint."""
    node, ns, s3 = evalkube_on_node, node_namespace, store_outside
    folder = tmp_path / "model-backed"
    shutil.copytree(MODEL_BACKED, folder)
    run = yaml.safe_load((folder / "run.yaml").read_text())
    run["spec"]["providers"]["openai"]["baseURL"] = f"http://{OUTSIDE_IP}:{PORT}/v1"
    run["spec"]["judgeModel"] = "openai:judge"
    run["spec"]["embeddingModel"] = "openai:text-embedding-3-small"
    assert run["spec"]["providers"]["openai"]["apiKeyEnv"] == "OPENAI_API_KEY"
    (folder / "run.yaml").write_text(yaml.safe_dump(run))
    with served_in(s3.netns or "", [PROVIDER, OUTSIDE_IP, str(PORT)]):
        unset = submit(node, s3, folder, "suite.yaml", "run.yaml", "-n", ns, OPENAI_API_KEY="")
        assert unset.returncode == 2, unset.stderr + unset.stdout
        assert "providers.openai.apiKeyEnv" in unset.stderr
        done = submit(node, s3, folder, "suite.yaml", "run.yaml", "-n", ns, OPENAI_API_KEY=KEY)
        assert done.returncode == 0, done.stderr[-5000:] + done.stdout[-3000:] + diagnose(node, ns)
        cluster_calls = provider_calls(s3.netns or "", PORT)
        local = subprocess.run(
            ["nsenter", f"--net=/run/netns/{node.netns}", EVALKUBE, "run", "suite.yaml",
             "run.yaml", "--db", str(tmp_path / "local.db")],
            cwd=folder, capture_output=True, text=True, timeout=600,
            env={**os.environ, "OPENAI_API_KEY": KEY, "COLUMNS": "160"},
        )  # fmt: skip
        assert local.returncode == 0, local.stderr + local.stdout
        local_calls = provider_calls(s3.netns or "", PORT)[len(cluster_calls) :]
    assert table(done.stdout) == table(local.stdout), done.stdout + local.stdout
    # every call carried the key from the environment, and the pods called as the laptop did
    assert {c["authorization"] for c in cluster_calls} == {f"Bearer {KEY}"}
    shape = sorted((c["path"], c["model"]) for c in cluster_calls)
    assert shape == sorted((c["path"], c["model"]) for c in local_calls)
    assert ("/v1/responses", "judge") in shape
    assert ("/v1/embeddings", "text-embedding-3-small") in shape
    # the key went in a Secret the run owns, and the run reads it from there
    secret = node.kubectl_json("get", "secret", "model-backed-provider-keys", "-n", ns)
    evalrun = node.kubectl_json("get", "evalrun", "model-backed", "-n", ns)
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [evalrun["metadata"]["uid"]]
    provider = evalrun["spec"]["providers"]["openai"]
    assert provider["credentialsSecretRef"] == {
        "name": "model-backed-provider-keys",
        "key": "openai",
    }
    assert "apiKeyEnv" not in provider
    # deleting the run deletes the key
    node.kubectl("delete", "evalrun", "model-backed", "-n", ns)
    wait_for(
        lambda: (
            node.kubectl(
                "get", "secret", "model-backed-provider-keys", "-n", ns, check=False
            ).returncode
            != 0
        ),
        timeout=120,
        what="the provider keys' Secret collected with its EvalRun",
    )
