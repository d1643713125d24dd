"""Datasets and outputs where teams keep them, read by real gVisor work pods on the real node:
objects in an S3 store outside the cluster (SeaweedFS, reached through the egress gateway with
the run's grant), a PersistentVolumeClaim, and a pinned https:// URL.

- 200,000 rows of Parquet and 200,000 zstd JSONL outputs in S3, 20 units: the run scores as
  ``evalkube run`` over the same objects, and a runner killed mid-shard loses and duplicates
  nothing (its Job retries; the retry skips what was recorded).
- The grader of the same run finds neither the store's credentials nor a way to the store.
- An object changed after the run pinned it fails its units, naming it.
- A pvc:// dataset is read from a claim; an https:// dataset with a wrong sha256 is refused
  before any unit, naming it and its sha256; with the right one it is read.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard

from evalkube.controller import names
from evalkube.engine.plan import SEQ_STRIDE
from tests.cluster.realnode import RealNode
from tests.realnode.support import (
    OUTSIDE_IP,
    diagnose,
    eval_run,
    outside_host,
    s3_secret_and_storage,
    stored_samples,
    wait_finished,
)
from tests.support.https_server import make_certificate
from tests.support.s3_server import S3Server

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
EVALKUBE = str(Path(sys.executable).parent / "evalkube")
ROWS = 200_000
SLOW_SHARD = 10  # its rows take 2 ms each: a window to kill its runner in
EXACT = (
    "import time\n"
    "def grade(sample, item):\n"
    "    if item.get('slow'):\n"
    "        time.sleep(0.002)\n"
    "    return float(sample['output_text'] == item['a'])\n"
)
PROBE = """
import os, socket

def grade(sample, item):
    found = [k for k in os.environ if k.startswith("AWS_")]
    try:
        socket.create_connection((item["host"], int(item["port"])), timeout=3).close()
        found.append("store reachable")
    except OSError:
        pass
    for path in ("/var/run/evalkube/pvc", "/var/run/secrets/evalkube/egress/grant"):
        if os.path.exists(path):
            found.append(path)
    return {"scores": {"escaped": float(bool(found))}, "judge": {"found": found}}
"""


def rows() -> list[dict[str, Any]]:
    return [
        {"id": f"r{i:06d}", "q": f"{i}?", "a": str(i % 97), "slow": i // 10_000 == SLOW_SHARD}
        for i in range(ROWS)
    ]


def outputs() -> bytes:
    lines = (
        json.dumps({"id": f"r{i:06d}", "output_text": str(i % 97) if i % 4 else "x"}) + "\n"
        for i in range(ROWS)
    )
    return zstandard.ZstdCompressor().compress("".join(lines).encode())


def parquet(data: list[dict[str, Any]], group: int = 5_000) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(data), buffer, row_group_size=group)
    return buffer.getvalue()


def suite(namespace: str, name: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"tasks": tasks},
    }


def task(
    task_id: str, dataset: dict[str, Any], outputs_spec: dict[str, Any], source: str = EXACT
) -> dict[str, Any]:
    return {
        "id": task_id,
        "dataset": {**dataset, "idField": "id"},
        "target": "{{ item.a }}",
        "outputs": outputs_spec,
        "grader": {"type": "python", "source": source},
    }


def shard_counts(node: RealNode, run: dict[str, Any], task_id: str) -> Counter[int]:
    """Samples of ``task_id`` stored so far, per shard (read from the operator's SQLite)."""
    meta = run["metadata"]
    run_id = names.run_id(meta["namespace"], meta["name"], meta["uid"])
    db = node.workdir / "pv" / "store" / "results.db"
    if not db.exists():
        return Counter()
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        found = conn.execute(
            "SELECT seq / ?, count(*) FROM evalkube_samples WHERE run_id = ? AND task_id = ? "
            "GROUP BY seq / ?",
            (SEQ_STRIDE, run_id, task_id, SEQ_STRIDE),
        ).fetchall()
    return Counter({int(shard): int(count) for shard, count in found})


def kill_runner_mid_shard(node: RealNode, namespace: str, run_name: str, unit: str) -> str:
    """Force-delete the pod of ``unit`` once some but not all of its samples are stored; the
    pod's name."""
    job = names.job_name(run_name, unit)
    run = node.kubectl_json("get", "evalrun", run_name, "-n", namespace)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        stored = shard_counts(node, run, "qa")[SLOW_SHARD]
        pods = node.kubectl_json("get", "pods", "-n", namespace, "-l", f"job-name={job}")["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        if 0 < stored < 10_000 and running:
            name = running[0]["metadata"]["name"]
            node.kubectl("delete", "pod", name, "-n", namespace, "--grace-period=0", "--force")
            return str(name)
        assert stored < 10_000, "the slow shard finished before its runner could be killed"
        time.sleep(0.3)
    raise AssertionError(
        f"no pod of {unit} with part of its samples stored\n{diagnose(node, namespace)}"
    )


def local_run(
    node: RealNode, s3: S3Server, tmp: Path, tasks: list[dict[str, Any]]
) -> dict[str, Any]:
    """``evalkube run`` of the same tasks on this machine, reaching the same objects (from
    the node's network namespace, which routes to the outside host)."""
    doc = suite("local", "sources", tasks)
    run = {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalRun", "metadata": {"name": "local"},
           "spec": {"models": ["precomputed"], "shardSize": 10_000,
                    "storage": {"s3": {"endpointURL": s3.endpoint_url}}}}  # fmt: skip
    (tmp / "local.yaml").write_text(yaml.safe_dump_all([doc, run]))
    done = subprocess.run(
        ["nsenter", f"--net=/run/netns/{node.netns}", EVALKUBE, "run", str(tmp / "local.yaml"),
         "--sandbox", "process", "--db", str(tmp / "local.db"),
         "--output", str(tmp / "local.json")],
        env={**os.environ, **s3.env}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    return dict(json.loads((tmp / "local.json").read_text()))


def test_s3_objects_of_200k_rows_score_as_evalkube_run_with_a_runner_killed_mid_shard(
    evalkube_on_node: RealNode, node_namespace: str, store_outside: S3Server, tmp_path: Path
) -> None:
    node, ns, s3 = evalkube_on_node, node_namespace, store_outside
    bucket = f"evals-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    s3.put(bucket, "qa/rows.parquet", parquet(rows()))
    s3.put(bucket, "qa/outputs.jsonl.zst", outputs())
    host, port = OUTSIDE_IP, str(s3.port)
    tasks = [
        task("qa", {"uri": f"s3://{bucket}/qa/rows.parquet"},
             {"uri": f"s3://{bucket}/qa/outputs.jsonl.zst"}),
        task("probe", {"rows": [{"id": "p", "a": "1", "host": host, "port": port, "out": "1"}]},
             {"column": "out"}, PROBE),
    ]  # fmt: skip
    storage = s3_secret_and_storage(node, ns, s3)
    node.apply(suite(ns, "sources", tasks))
    node.apply(eval_run(ns, "big", "sources", shardSize=10_000, storage=storage))
    killed = kill_runner_mid_shard(node, ns, "big", f"qa.precomputed.{SLOW_SHARD:05d}")
    run = wait_finished(node, ns, "big", timeout=1200)
    status = run["status"]
    evidence = json.dumps(status, indent=1)[:6000]
    assert status["phase"] == "Succeeded", evidence + diagnose(node, ns)
    results = {r["task"]: r for r in status["results"]}
    assert results["qa"]["counts"] == {"samples": ROWS, "valid": ROWS, "invalid": 0, "errored": 0}
    assert results["qa"]["metrics"]["score"] == pytest.approx(0.75)
    assert status["units"]["total"] == 21, evidence
    assert status["units"]["succeeded"] == 21, evidence
    # the grader found neither the store's credentials, nor the store, nor the runner's mounts
    assert results["probe"]["metrics"] == {"escaped": 0.0}, evidence
    # nothing lost, nothing twice: every row once, the killed shard too
    samples = [s for s in stored_samples(node, run) if s.task_id == "qa"]
    assert len(samples) == ROWS
    assert len({s.sample_id for s in samples}) == ROWS
    assert sorted(s.row_id for s in samples) == [f"r{i:06d}" for i in range(ROWS)]
    job = names.job_name("big", f"qa.precomputed.{SLOW_SHARD:05d}")
    # the unit's done report can reach the operator before the Job controller counts the
    # retried pod's success
    retried = node.wait_for(
        lambda: (
            (s := node.kubectl_json("get", "job", job, "-n", ns)["status"]).get("succeeded") and s
        ),
        timeout=120,
        what=f"Job {job} to record its retried pod's success",
    )
    assert retried.get("failed", 0) >= 1, (killed, retried)
    assert retried.get("succeeded") == 1, retried
    # the same objects through evalkube run on this machine score the same
    local = {r["task"]: r for r in local_run(node, s3, tmp_path, tasks[:1])["results"]}
    assert local["qa"]["metrics"] == results["qa"]["metrics"]
    assert local["qa"]["counts"] == results["qa"]["counts"]


def test_an_object_changed_after_pinning_fails_its_units_naming_it(
    evalkube_on_node: RealNode, node_namespace: str, store_outside: S3Server
) -> None:
    """The run's unit Jobs start suspended (``queueName``, no Kueue here): between the prepare
    pod's pins and the units' reads, the object is overwritten."""
    node, ns, s3 = evalkube_on_node, node_namespace, store_outside
    bucket = f"evals-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    data = [{"id": f"r{i}", "a": str(i)} for i in range(100)]
    s3.put(bucket, "rows.parquet", parquet(data, group=25))
    node.apply(
        suite(ns, "changing", [task("qa", {"uri": f"s3://{bucket}/rows.parquet"}, {"column": "a"})])
    )
    storage = s3_secret_and_storage(node, ns, s3)
    node.apply(eval_run(ns, "changed", "changing", shardSize=50, storage=storage, queueName="held"))

    def suspended_units() -> list[str] | None:
        jobs = node.kubectl_json("get", "jobs", "-n", ns)["items"]
        held = [j["metadata"]["name"] for j in jobs if j["spec"].get("suspend")]
        return held if len(held) == 2 else None

    held = node.wait_for(suspended_units, timeout=300, what="2 suspended unit Jobs")
    s3.put(bucket, "rows.parquet", parquet(data[:10]))
    for name in held:
        node.kubectl(
            "patch", "job", name, "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":false}}'
        )
    status = wait_finished(node, ns, "changed", timeout=600)["status"]
    assert status["phase"] == "Failed", json.dumps(status, indent=1)
    failed = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert f"s3://{bucket}/rows.parquet changed since the run pinned it" in failed["message"], (
        failed
    )
    assert failed["message"].count("changed since the run pinned it") == 2, failed


def test_a_pvc_dataset_and_an_https_dataset_pinned_by_sha256(
    evalkube_on_node: RealNode, node_namespace: str, tmp_path: Path
) -> None:
    node, ns = evalkube_on_node, node_namespace
    # a claim bound to a hostPath volume of the node, holding a JSONL dataset
    folder = node.workdir / "pv" / f"data-{ns}"
    folder.mkdir(parents=True)
    folder.chmod(0o755)
    data = [{"id": f"r{i}", "a": str(i), "out": str(i) if i % 5 else "-"} for i in range(40)]
    text = "".join(json.dumps(r) + "\n" for r in data)
    (folder / "rows.jsonl").write_text(text)
    (folder / "rows.jsonl").chmod(0o644)
    node.apply(
        [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"data-{ns}"},
             "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
                      "storageClassName": "",
                      "hostPath": {"path": str(folder), "type": "Directory"},
                      "claimRef": {"namespace": ns, "name": "datasets"}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "datasets", "namespace": ns},
             "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "",
                      "volumeName": f"data-{ns}", "resources": {"requests": {"storage": "1Gi"}}}},
        ]
    )  # fmt: skip
    node.apply(
        suite(ns, "claimed", [task("qa", {"uri": "pvc://datasets/rows.jsonl"}, {"column": "out"})])
    )
    node.apply(eval_run(ns, "claimed", "claimed", shardSize=15))
    status = wait_finished(node, ns, "claimed", timeout=600)["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1) + diagnose(node, ns)
    [result] = status["results"]
    assert result["metrics"]["score"] == pytest.approx(32 / 40)
    assert status["units"]["total"] == 3

    # the same rows from an https host outside the cluster, trusted through a CA ConfigMap
    www = tmp_path / "www"
    www.mkdir()
    (www / "rows.jsonl").write_text(text)
    cert, key = make_certificate(tmp_path, OUTSIDE_IP)
    node.kubectl("create", "configmap", "corp-ca", "-n", ns, f"--from-file=ca.crt={cert}")
    storage = {"caBundleConfigMapRef": {"name": "corp-ca", "key": "ca.crt"}}
    url = f"https://{OUTSIDE_IP}:8443/rows.jsonl"
    right = hashlib.sha256(text.encode()).hexdigest()
    server = [
        str(Path(__file__).parent / "https_files.py"),
        str(www),
        str(cert),
        str(key),
        OUTSIDE_IP,
        "8443",
    ]
    with outside_host(node, server):
        for name, digest in (("wrong", "0" * 64), ("right", right)):
            node.apply(
                suite(
                    ns,
                    f"web-{name}",
                    [task("qa", {"uri": url, "sha256": digest}, {"column": "out"})],
                )
            )
            node.apply(eval_run(ns, f"web-{name}", f"web-{name}", shardSize=15, storage=storage))
        wrong = wait_finished(node, ns, "web-wrong", timeout=600)["status"]
        right_status = wait_finished(node, ns, "web-right", timeout=600)["status"]
    assert wrong["phase"] == "Failed", json.dumps(wrong, indent=1)
    failed = next(c for c in wrong["conditions"] if c["type"] == "Succeeded")
    assert failed["reason"] == "SourceUnavailable", failed
    assert f"{url} has sha256 {right}, not the {'0' * 64} it is pinned to" in failed["message"]
    assert not [j for j in node.kubectl_json("get", "jobs", "-n", ns)["items"]
                if j["metadata"]["name"].startswith("web-wrong-u")]  # fmt: skip
    assert right_status["phase"] == "Succeeded", json.dumps(right_status, indent=1)
    assert right_status["results"][0]["metrics"]["score"] == pytest.approx(32 / 40)
