"""Control-plane and node faults under a running EvalRun on the real node: the API server and
etcd down, a runner killed mid-shard, the kubelet and containerd restarted. Each run must end
as a fault-free run does: ``Succeeded`` with its reason, the same sample ids each stored
once, the same scores, no model call, no Job created twice (a Pod retried only where the
fault killed it), and nothing of the run left once it is deleted (docs/operator.md, "What
survives what")."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from evalkube.controller import names
from evalkube.reporting.console import EXIT_RUNTIME
from evalkube.store import ResultStore, default_url
from tests.cluster.realnode import RealNode
from tests.realnode.faults import (
    BIG_FAST,
    BIG_SLOW,
    BIG_SUITE,
    SLOW_SUITE,
    assert_exact_outcome,
    assert_nothing_left,
    big_shard_suite,
    components_down,
    done_unit_infos,
    jobs_by_name,
    kill_container,
    running_runner,
    slow_suite,
)
from tests.realnode.support import eval_run

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1200)]

#: How long the API server and etcd stay down: longer than the node lease (40 s) and than
#: the runner pods' grading, shorter than the runners' ingest retry window (300 s).
OUTAGE_SECONDS = 50


def _assert_jobs_created_once(
    jobs: dict[str, dict], before: dict[str, dict], units_total: int, retried: int = 0
) -> None:
    assert len(jobs) == units_total, sorted(jobs)  # one Job per unit: none created twice
    for name, job in before.items():
        assert jobs[name]["metadata"]["uid"] == job["metadata"]["uid"], f"{name} was re-created"
    failed = {n: j["status"].get("failed", 0) for n, j in jobs.items() if j["status"].get("failed")}
    assert sum(failed.values()) == retried, f"Pods failed and retried: {failed}"


@pytest.mark.nightly  # about 200 s: the 50 s outage, then about 2 minutes back
def test_api_server_and_etcd_down_mid_run(evalkube_on_node: RealNode, node_namespace: str) -> None:
    node, ns = evalkube_on_node, node_namespace
    node.apply(slow_suite(ns))
    node.apply(eval_run(ns, "apidown", "qa", shardSize=SLOW_SUITE.shard_size))
    running_runner(node, ns, "apidown")
    before = jobs_by_name(node, ns, "apidown")
    with components_down(node, "kube-apiserver", "etcd"):
        time.sleep(OUTAGE_SECONDS)
    # a fault-free run takes about 70 s; the API's way back (its Service endpoints, watches
    # and passes that back off while it was gone) about 2 minutes
    run = assert_exact_outcome(node, ns, "apidown", SLOW_SUITE, timeout=360)
    jobs = jobs_by_name(node, ns, "apidown")
    _assert_jobs_created_once(jobs, before, run["status"]["units"]["total"])
    assert_nothing_left(node, ns, run)


def _evict(node: RealNode, pod: dict[str, Any]) -> dict[str, Any]:
    """Evict ``pod`` through the Eviction API, as a node drain or the kubelet's pressure
    eviction does (the Pod gets ``DisruptionTarget``, its containers SIGTERM); the runner
    container's last state, as a watch saw the Pod until it was deleted."""
    meta = pod["metadata"]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
    }
    watch = subprocess.Popen(
        node.in_netns(
            str(node.bin / "kubectl"), f"--kubeconfig={node.kubeconfig}", "get", "pod",
            meta["name"], "-n", meta["namespace"], "--watch", "--output-watch-events", "-o",
            "json",
        ),
        stdout=subprocess.PIPE, text=True, env=node.env,
    )  # fmt: skip
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction"
    runner: dict[str, Any] = {}
    try:
        node.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(eviction))
        decoder, text = json.JSONDecoder(), ""
        assert watch.stdout is not None
        for line in watch.stdout:
            text += line
            try:
                event, end = decoder.raw_decode(text.strip())
            except ValueError:
                continue
            text = text.strip()[end:]
            statuses = event["object"]["status"].get("containerStatuses", [])
            runner = next((c for c in statuses if c["name"] == "runner"), runner)
            if event["type"] == "DELETED":
                break
    finally:
        watch.kill()
        watch.wait()
        if watch.stdout is not None:
            watch.stdout.close()
    return runner


@pytest.mark.parametrize(
    ("fault", "counted"),
    [
        # SIGKILL through containerd, as an OOM kill or a crash: a failure the Job counts
        ("sigkill", 1),
        # the Eviction API: the Job's podFailurePolicy ignores a DisruptionTarget Pod
        ("evicted", 0),
    ],
)
def test_runner_killed_mid_shard_is_retried_without_loss_or_duplicate(
    evalkube_on_node: RealNode, node_namespace: str, fault: str, counted: int
) -> None:
    node, ns = evalkube_on_node, node_namespace
    node.apply(big_shard_suite(ns))
    node.apply(eval_run(ns, "killed", "big", shardSize=BIG_SUITE.shard_size))
    running_runner(node, ns, "killed")
    obj = node.kubectl_json("get", "evalrun", "killed", "-n", ns)
    run_id = names.run_id(ns, "killed", obj["metadata"]["uid"])
    url = default_url(str(node.workdir / "pv" / "store" / "results.db"))

    def first_chunk_stored() -> bool:
        store = ResultStore.open(url)
        try:
            return sum(store.sample_counts(run_id).values()) >= BIG_FAST
        finally:
            store.close()

    node.wait_for(first_chunk_stored, timeout=240, what="the shard's first chunk stored")
    pod = running_runner(node, ns, "killed", timeout=5)  # still grading the slow tail
    before = jobs_by_name(node, ns, "killed")
    if fault == "sigkill":
        kill_container(node, pod, "runner")
    else:
        # the runner (its container's PID 1) handles SIGTERM: it stops at once, keeping the
        # answers that arrived, rather than grade on until the grace period's SIGKILL (137)
        runner = _evict(node, pod)
        assert runner["state"]["terminated"]["exitCode"] == EXIT_RUNTIME, runner
    run = assert_exact_outcome(node, ns, "killed", BIG_SUITE)
    jobs = jobs_by_name(node, ns, "killed")
    _assert_jobs_created_once(jobs, before, run["status"]["units"]["total"], retried=counted)
    (info,) = done_unit_infos(node, run).values()
    # the retried Pod graded only what the killed one had not stored
    assert info["skipped"] == BIG_FAST, info
    assert info["samples"] == BIG_SLOW, info
    assert_nothing_left(node, ns, run)


@pytest.mark.nightly  # flaky as the node's first fault: 2 Pods failed once
def test_kubelet_and_containerd_restarted_under_running_pods(
    evalkube_on_node: RealNode, node_namespace: str
) -> None:
    node, ns = evalkube_on_node, node_namespace
    node.apply(slow_suite(ns))
    node.apply(eval_run(ns, "restarts", "qa", shardSize=SLOW_SUITE.shard_size))
    running_runner(node, ns, "restarts")
    before = jobs_by_name(node, ns, "restarts")
    node.restart("kubelet")
    running_runner(node, ns, "restarts")
    node.restart("containerd")
    run = assert_exact_outcome(node, ns, "restarts", SLOW_SUITE)
    jobs = jobs_by_name(node, ns, "restarts")
    _assert_jobs_created_once(jobs, before, run["status"]["units"]["total"])
    assert_nothing_left(node, ns, run)
