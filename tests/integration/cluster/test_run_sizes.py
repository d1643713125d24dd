"""Run sizes on the real control plane: the operator's EVALKUBE_SHARD_SIZE applies
to an EvalRun without ``shardSize`` (the CRD no longer defaults it) and is pinned into the
run's snapshot, which the Pods plan from; and a snapshot larger than a ConfigMap holds fails
the run with the reason at once instead of a pass failing every minute with no status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    _free_port,
    _jobs,
    finished,
    install_crds,
    running_operator,
    suite,
)

from evalkube import limits
from evalkube.controller import names
from evalkube.engine.snapshot import parse_snapshot
from evalkube.models.snapshot import RunSnapshot

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_a_run_without_shard_size_is_planned_with_the_operators_setting(
    control_plane: ControlPlane, cluster_namespace: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    install_crds(cp)
    cp.apply(suite(ns))  # qa: 25 rows; sentiment: 6 rows and its grade_batch unit
    run = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": "nightly", "namespace": ns},
        "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"]},
    }
    with running_operator(
        cp, tmp_path / "results.db", _free_port(), shard_size="4", parallelism="20"
    ):
        cp.apply(run)
        expected = [f"qa.precomputed.{n:05d}" for n in range(7)] + [
            "sentiment.precomputed.00000",
            "sentiment.precomputed.00001",
        ]
        jobs = cp.wait_for(
            lambda: sorted(j := _jobs(cp, ns)) == expected and j, timeout=60, what="9 Jobs"
        )
        assert "shardSize" not in cp.kubectl_json("get", "evalrun", "nightly", "-n", ns)["spec"]
        data = cp.kubectl_json("get", "configmap", names.snapshot_name("nightly"), "-n", ns)
        snapshot = RunSnapshot.model_validate_json(data["data"]["snapshot.json"])
        assert snapshot.run_spec.shard_size == 4
        # what each Pod plans from its snapshot: the operator's units, one for one
        pod_plan = [u.unit_id for u in parse_snapshot(snapshot).units()]
        assert pod_plan == [*expected[:7], *expected[7:], "sentiment.precomputed.batch"]
        job = jobs["qa.precomputed.00006"]  # the last qa shard: row 24 only
        assert job["spec"]["activeDeadlineSeconds"] == 1 * 120 + 300
        assert jobs["qa.precomputed.00000"]["spec"]["activeDeadlineSeconds"] == 4 * 120 + 300
        rules = job["spec"]["podFailurePolicy"]["rules"]  # accepted by the API server
        assert [rule["action"] for rule in rules] == ["FailJob", "Ignore"]


def test_a_snapshot_larger_than_a_config_map_fails_the_run_with_the_reason(
    control_plane: ControlPlane, cluster_namespace: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    install_crds(cp)
    big = suite(ns)
    rows = [{"q": f"{i}?", "a": str(i), "out": str(i), "pad": "x" * 2_000} for i in range(600)]
    big["spec"]["tasks"][0]["dataset"]["rows"] = rows  # ~1.2 MB: the suite fits, no snapshot
    cp.kubectl("create", "-f", "-", input=json.dumps(big))  # no last-applied annotation (256 kB)
    run = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": "nightly", "namespace": ns},
        "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"], "shardSize": 100},
    }
    with running_operator(cp, tmp_path / "results.db", _free_port()):
        cp.apply(run)
        status = cp.wait_for(lambda: finished(cp, ns), timeout=60, what="the run to finish")
    assert status["phase"] == "Failed"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["reason"] == "SnapshotTooLarge"
    message = conditions["Succeeded"]["message"]
    assert f"more than a ConfigMap holds ({limits.SNAPSHOT_CONFIGMAP_BYTES:,} bytes)" in message
    assert "task 'qa' inline dataset.rows" in message
    assert "dataset.configMapRef" in message
    assert _jobs(cp, ns) == {}
    missing = cp.kubectl("get", "configmap", names.snapshot_name("nightly"), "-n", ns, check=False)
    assert missing.returncode != 0
    events = cp.kubectl_json(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=nightly,type=Warning"
    )["items"]
    assert any(e["reason"] == "SnapshotTooLarge" for e in events)
