"""What a run with uri sources gives its pods: the prepare Job, and a unit's runner (never its
grader) reaching the store with its credentials, the gateway with the run's grant, the claims."""

from __future__ import annotations

from typing import Any

import pytest

from evalkube.controller import egress_grants, manifests, names
from evalkube.controller.run_reconciler import source_mounts
from evalkube.controller.settings import OperatorSettings
from evalkube.models import EvalSuiteSpec, validate_spec
from tests.unit.controller.test_manifests import SHARD, container, job, owner, pod_spec, run_spec

GATEWAY = OperatorSettings(
    egress_via_gateway=True,
    egress_gateway_url="http://10.96.0.12:3128",
    ingest_url="http://10.96.0.11:8080",
    policy_canary_url="http://10.96.0.13:9090/healthz",
)
STORAGE = {
    "s3": {
        "endpointURL": "http://seaweedfs.storage.svc:8333",
        "accessKeyIDSecretRef": {"name": "s3", "key": "id"},
        "secretAccessKeySecretRef": {"name": "s3", "key": "secret"},
    }
}
SOURCES = manifests.SourceMounts(claims=("datasets",), remote=True)


def suite(*datasets: dict[str, Any]) -> EvalSuiteSpec:
    tasks = [
        {
            "id": f"t{i}",
            "dataset": d,
            "grader": {"type": "python", "source": "def grade(s, i): return 1"},
        }
        for i, d in enumerate(datasets)
    ]
    return validate_spec(EvalSuiteSpec, {"tasks": tasks}, prefix="spec")


def env_names(c: dict[str, Any]) -> set[str]:
    return {e["name"] for e in c["env"]}


def mounts(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in c["volumeMounts"]}


def test_only_the_runner_gets_the_store_credentials_the_claims_and_the_grant() -> None:
    j = job(SHARD, GATEWAY, run_spec(storage=STORAGE), sources=SOURCES, task_id="qa")
    runner, grader, proxy = (container(j, n) for n in ("runner", "grader", "proxy"))
    keys = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in runner["env"] if "valueFrom" in e}
    assert keys["AWS_ACCESS_KEY_ID"] == {"name": "s3", "key": "id"}
    assert keys["AWS_SECRET_ACCESS_KEY"] == {"name": "s3", "key": "secret"}
    assert mounts(runner)["source-pvc-0"] == {
        "name": "source-pvc-0", "mountPath": "/var/run/evalkube/pvc/datasets", "readOnly": True,
    }  # fmt: skip
    [claim] = [v for v in pod_spec(j)["volumes"] if v["name"] == "source-pvc-0"]
    assert claim["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    assert mounts(runner)["egress-grant"]["readOnly"] is True
    command = runner["command"]
    assert command[command.index("--egress-proxy") + 1] == GATEWAY.egress_gateway_url
    assert command[command.index("--task") + 1] == "qa"
    # the grader has none of it; the proxy keeps only its own grant mount
    assert grader["env"] == []
    assert not {"source-pvc-0", "egress-grant"} & set(mounts(grader))
    assert "source-pvc-0" not in mounts(proxy)
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & (
        env_names(proxy) | env_names(grader)
    )
    # one grant volume, mounted by the proxy and the runner
    assert [v["name"] for v in pod_spec(j)["volumes"]].count("egress-grant") == 1


def test_a_unit_without_sources_is_unchanged() -> None:
    assert job(SHARD, GATEWAY) == job(SHARD, GATEWAY, sources=manifests.SourceMounts())


def test_the_prepare_job_is_one_trusted_container_under_the_runs_policy() -> None:
    spec = run_spec(storage=STORAGE)
    j = manifests.prepare_job(owner(), spec=spec, settings=GATEWAY, sources=SOURCES)
    assert j["metadata"]["name"] == names.prepare_job_name(owner()["metadata"]["name"])
    assert j["metadata"]["annotations"][names.ANNOTATION_UNIT_ID] == "@prepare"
    pod = pod_spec(j)
    assert [c["name"] for c in pod["containers"]] == ["runner"]
    assert "initContainers" not in pod
    assert pod["automountServiceAccountToken"] is False
    # the NetworkPolicy selects it as it selects work-unit pods
    policy = manifests.network_policy(owner(), spec, GATEWAY)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= j["spec"]["template"]["metadata"]["labels"].items()
    runner = pod["containers"][0]
    assert runner["command"][:2] == ["evalkube", "prepare"]
    assert "--policy-canary" in runner["command"]
    assert {"EVALKUBE_INGEST_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= env_names(
        runner
    )
    assert runner["securityContext"]["readOnlyRootFilesystem"] is True
    assert j["spec"]["activeDeadlineSeconds"] > 0


def test_source_mounts_of_tasks() -> None:
    spec = suite(
        {"uri": "pvc://datasets/mmlu.parquet"},
        {"uri": "pvc://other/x.jsonl"},
        {"rows": [{"a": 1}]},
    )
    assert source_mounts(spec.tasks) == manifests.SourceMounts(("datasets", "other"), False)
    assert not source_mounts(spec.tasks[2:])
    remote = suite({"uri": "s3://bucket/x.parquet"})
    assert source_mounts(remote.tasks) == manifests.SourceMounts((), True)


def test_the_grant_admits_the_store_and_https_hosts() -> None:
    spec = run_spec(storage=STORAGE)
    tasks = suite(
        {"uri": "s3://bucket/x.parquet"},
        {"uri": "https://Data.Example.org/x.jsonl", "sha256": "a" * 64},
    )
    hosts = egress_grants.grant_hosts(spec, tasks)
    assert {"seaweedfs.storage.svc:8333", "data.example.org:443", "api.openai.com:443"} <= set(
        hosts
    )
    aws = egress_grants.grant_hosts(run_spec(storage={"s3": {"region": "eu-west-1"}}), tasks)
    assert {"s3.eu-west-1.amazonaws.com:443", "bucket.s3.eu-west-1.amazonaws.com:443"} <= set(aws)


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ({"uri": "https://h/x.jsonl"}, "needs `sha256`"),
        ({"uri": "http://h/x.jsonl"}, "plain http:// is not accepted"),
        ({"rows": [], "sha256": "a" * 64}, "describe a `uri`"),
    ],
)
def test_uri_fields_are_checked_where_the_suite_is_loaded(
    dataset: dict[str, Any], message: str
) -> None:
    from evalkube.models import SpecError

    with pytest.raises(SpecError, match=message):
        suite(dataset)


def test_a_ca_bundle_is_mounted_into_the_runner_only() -> None:
    storage = {**STORAGE, "caBundleConfigMapRef": {"name": "corp-ca", "key": "ca.crt"}}
    j = job(SHARD, GATEWAY, run_spec(storage=storage), sources=SOURCES, task_id="qa")
    runner = container(j, "runner")
    assert mounts(runner)["source-ca"]["readOnly"] is True
    command = runner["command"]
    assert command[command.index("--ca-bundle") + 1] == f"{manifests.CA_BUNDLE_DIR}/ca.pem"
    [volume] = [v for v in pod_spec(j)["volumes"] if v["name"] == "source-ca"]
    assert volume["configMap"] == {
        "name": "corp-ca",
        "items": [{"key": "ca.crt", "path": "ca.pem"}],
    }
    assert "source-ca" not in mounts(container(j, "grader"))
