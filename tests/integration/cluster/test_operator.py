"""The operator end to end on the real control plane (etcd, kube-apiserver, controllers, kwok).

The operator runs in-process with kopf's KopfRunner, its HTTP server on loopback. kwok holds
each work-unit Pod at Running; the test plays the kubelet: it runs the unit's runner command
itself (same snapshot, same ingest token, a real local sandbox), then lets the Pod complete.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    EVALKUBE,
    EXACT,
    READ,
    _free_port,
    _jobs,
    _play_unit,
    install_crds,
    run,
    running_operator,
    suite,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture(scope="module", params=["cluster-wide", "namespaced"])
def operator(
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """The operator (KopfRunner) with its store and HTTP servers on loopback, as the chart's
    ServiceAccount: every namespace (ClusterRoles), or ``watchNamespaces`` (Roles in four
    namespaces made here, handed out to the tests by ``cluster_namespace``)."""
    install_crds(control_plane)
    store = tmp_path_factory.mktemp("operator") / "results.db"
    watch: list[str] = []
    if request.param == "namespaced":
        watch = [f"evk-w{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
        for ns in watch:
            control_plane.kubectl("create", "namespace", ns)
    # ipv6 "refuse": the sysctl of "disable" (the default, tests/realnode) is not one Pod
    # Security "restricted" allows, and these tests run their Pods under it
    with running_operator(control_plane, store, _free_port(), watch=watch, ipv6="refuse") as url:
        yield {"url": url, "store": str(store), "free": list(watch), "watch": watch}
    for ns in watch:
        control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def cluster_namespace(control_plane: ControlPlane, operator: dict[str, Any]) -> Iterator[str]:
    """A fresh namespace the operator watches."""
    if operator["watch"]:
        yield operator["free"].pop()
        return
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_run_reaches_succeeded_with_exact_scores(
    control_plane: ControlPlane, cluster_namespace: str, operator: dict[str, Any], tmp_path: Path
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
    for unit_id, job in jobs.items():  # as admitted by the apiserver
        pod = job["spec"]["template"]["spec"]
        proxy, grader = pod["initContainers"]  # native sidecars; the runner is the main one
        assert [proxy["name"], grader["name"]] == ["proxy", "grader"]
        assert [c["name"] for c in pod["containers"]] == ["runner"]
        flags = dict(zip(proxy["command"][2::2], proxy["command"][3::2], strict=False))
        assert (flags["--unit-id"], flags["--max-calls"]) == (unit_id, "0")  # zero until set
        # these graders have no model access: the bridge's socket is not even mounted
        assert "bridge" not in {m["name"] for m in grader["volumeMounts"]}
        assert "sysctls" not in (pod.get("securityContext") or {})
        runner = pod["containers"][0]["command"]
        assert runner[runner.index("--ipv6") + 1] == "refuse"
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
    assert status["units"] == {
        "total": 5,
        "succeeded": 5,
        "running": 0,
        "failed": 0,
        "pending": 0,
        "queued": 0,
    }
    ready = {c["type"]: c for c in status["conditions"]}
    assert ready["Succeeded"]["status"] == "True"
    assert ready["Succeeded"]["observedGeneration"] == 1
    # the samples API serves the debugging view
    import httpx

    samples_url = f"{operator['url'].api}/api/v1/namespaces/{ns}/evalruns/nightly/samples"
    assert httpx.get(samples_url).status_code == 401  # never without a token
    ingest_port = httpx.get(
        f"{operator['url']}/api/v1/namespaces/{ns}/evalruns/nightly/samples", headers=READ
    )
    assert ingest_port.status_code == 405  # the ingest port (work pods') serves no samples view
    page = httpx.get(samples_url, params={"task": "qa", "limit": 3}, headers=READ).json()
    assert len(page["samples"]) == 3
    assert page["next_cursor"]
    # ... and `evalkube samples --api` reads it
    shown = subprocess.run(
        [
            EVALKUBE,
            "samples",
            "nightly",
            "--api",
            operator["url"].api,
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


def test_editing_a_grader_file_updates_the_suite_version_and_ready(
    control_plane: ControlPlane, cluster_namespace: str, operator: dict[str, Any]
) -> None:
    """The suite reads its grader from a ConfigMap; editing that ConfigMap (not the suite)
    re-checks the suite: a new version, then Ready False naming the file when it breaks."""
    cp, ns = control_plane, cluster_namespace

    def graders(source: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "graders", "namespace": ns},
            "data": {"exact.py": source},
        }

    def ready() -> tuple[str, str, str | None]:
        status = cp.kubectl_json("get", "evalsuite", "qa", "-n", ns).get("status") or {}
        cond = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        return cond.get("status", ""), cond.get("message", ""), status.get("suiteVersion")

    cp.apply(graders(EXACT))
    manifest = suite(ns)
    manifest["spec"]["tasks"][0]["grader"] = {
        "type": "python",
        "file": "graders/exact.py",
        "metricId": "exact_match",
    }
    cp.apply(manifest)
    first = cp.wait_for(lambda: (r := ready())[0] == "True" and r, timeout=30, what="Ready")
    cp.apply(graders(EXACT + "\n# stricter, one day\n"))
    second = cp.wait_for(
        lambda: (r := ready())[0] == "True" and r[2] != first[2] and r,
        timeout=30,
        what="a new suite version",
    )
    assert str(second[2]).startswith("sha256:")
    cp.apply(graders("def not_grade(sample, item):\n    return 1.0\n"))
    broken = cp.wait_for(lambda: (r := ready())[0] == "False" and r, timeout=30, what="Invalid")
    assert "spec.tasks[0].grader" in broken[1], broken
    assert "does not define `grade(...)`" in broken[1], broken
    assert broken[2] is None  # an invalid suite has no version


def test_wrong_token_is_rejected(operator: dict[str, Any], cluster_namespace: str) -> None:
    import httpx

    response = httpx.post(
        f"{operator['url']}/api/v1/namespaces/{cluster_namespace}/evalruns/nope/samples",
        json={"samples": []},
        headers={"Authorization": "Bearer forged"},
    )
    # 401 whether or not the run exists: the port is no oracle for names
    assert response.status_code == 401


def test_namespaced_operator_leaves_other_namespaces_alone(
    control_plane: ControlPlane, operator: dict[str, Any], cluster_namespace: str
) -> None:
    """watchNamespaces: kopf is scoped to the listed namespaces (and its RBAC stops there): a
    run elsewhere gets no status, while one in a watched namespace is picked up."""
    if not operator["watch"]:
        pytest.skip("cluster-wide: every namespace is watched")
    cp = control_plane
    outside = f"evk-out-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", outside)
    try:
        for ns in (outside, cluster_namespace):
            cp.apply(suite(ns))
            cp.apply(run(ns))
        cp.wait_for(
            lambda: (cp.kubectl_json("get", "evalrun", "nightly", "-n", cluster_namespace)
                     .get("status", {}).get("phase")),
            timeout=30,
            what="the watched namespace's run picked up",
        )  # fmt: skip
        watched_suite = cp.kubectl_json("get", "evalsuite", "qa", "-n", cluster_namespace)
        assert watched_suite.get("status")
        for kind in ("evalrun/nightly", "evalsuite/qa"):
            assert not cp.kubectl_json("get", kind, "-n", outside).get("status")
        assert not cp.kubectl_json("get", "jobs", "-n", outside)["items"]
    finally:
        # no run left behind for the next module's cluster-wide operator to trip over
        for ns in (outside, cluster_namespace):
            cp.kubectl("delete", "evalrun", "--all", "-n", ns, "--wait=true", check=False)
        cp.kubectl("delete", "namespace", outside, "--wait=false", check=False)
