"""What the real-node fault tests share: suites whose exact outcome is known, waiting for a
work-unit Pod to be mid-shard, killing a container through containerd, and the checks every
fault test makes (a terminal phase with its reason, every sample stored exactly once with the
scores a fault-free run gives, no Job created twice, nothing left once the run is deleted).

Node components are stopped, frozen and started again by the node's launcher
(:meth:`tests.cluster.realnode.RealNode.control`); :func:`components_down` and
:func:`frozen` put them back whatever the test body does.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from evalkube.controller import names
from evalkube.engine.plan import SEQ_STRIDE, sample_id
from evalkube.store import ResultStore, default_url
from tests.cluster.realnode import RealNode
from tests.integration.cluster.operator_support import EXACT, SENTIMENT, suite
from tests.realnode.support import diagnose, stored_samples, wait_finished

#: A grade() that takes ``SLOW_SECONDS`` per sample (so a shard's Pod stays mid-shard long
#: enough for a fault to land on it) when the row asks for it, then grades as EXACT does.
SLOW_SECONDS = 2.0
SLOW_EXACT = (
    EXACT
    + f"""

import time as _time

_exact = grade


def grade(sample, item):
    if item.get("slow", True):
        _time.sleep({SLOW_SECONDS})
    return _exact(sample, item)
"""
)


@dataclass(frozen=True)
class Expected:
    """What a fault-free run of a suite gives with ``shardSize: shard_size``: per task, its
    row count, its metrics, its sample counts and each row's scores (by position) where they
    are per sample."""

    shard_size: int
    tasks: dict[str, int]
    metrics: dict[str, dict[str, float]]
    counts: dict[str, dict[str, int]]
    scores: dict[str, dict[int, dict[str, float]]]


def slow_suite(namespace: str) -> dict[str, Any]:
    """The suite of test_operator_restart.py (qa: 25 rows, exact match 0.8; sentiment: 6
    rows, a grade_batch macro F1 of 0.655556 and 4 of 6 correct), its qa grader taking 2 s a
    sample, so a 5-row shard's Pod grades for 10 s."""
    doc = suite(namespace)
    doc["spec"]["tasks"][0]["grader"]["source"] = SLOW_EXACT
    return doc


SLOW_SUITE = Expected(
    shard_size=5,
    tasks={"qa": 25, "sentiment": 6},
    metrics={"qa": {"exact_match": 0.8}, "sentiment": {"macro_f1": 0.655556, "correct": 4 / 6}},
    counts={
        "qa": {"samples": 25, "valid": 25, "invalid": 0, "errored": 0},
        "sentiment": {"samples": 6, "valid": 6, "invalid": 0, "errored": 0},
    },
    scores={
        "qa": {i: {"exact_match": 0.0 if i % 5 == 0 else 1.0} for i in range(25)},
        "sentiment": {
            i: {"correct": 1.0 if row["output"] == row["label"] else 0.0}
            for i, row in enumerate(SENTIMENT)
        },
    },
)

#: Rows of the one-shard suite a runner is killed in: the first STORE_CHUNK_SIZE (5,000) are
#: graded at once and posted as one chunk, the tail is slow, so the kill lands after that chunk
#: is stored and before the shard is done.
BIG_FAST, BIG_SLOW = 5_000, 15


def one_task_suite(namespace: str, name: str, task: dict[str, Any]) -> dict[str, Any]:
    """An EvalSuite of one task, as the fault tests apply it."""
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"tasks": [task]},
    }


def exact_match_task(task_id: str, rows: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """A task grading the precomputed column ``out`` against ``a`` (prompt ``q``)."""
    return {
        "id": task_id,
        "dataset": {"rows": rows},
        "prompt": "{{ item.q }}",
        "target": "{{ item.a }}",
        "outputs": {"column": "out"},
        "grader": {"type": "python", "source": source, "metricId": "exact_match"},
    }


def big_shard_suite(namespace: str) -> dict[str, Any]:
    rows = [
        {"q": str(i), "a": str(i), "out": "wrong" if i % 10 == 0 else str(i), "slow": i >= BIG_FAST}
        for i in range(BIG_FAST + BIG_SLOW)
    ]
    return one_task_suite(namespace, "big", exact_match_task("big", rows, SLOW_EXACT))


_BIG_ROWS = BIG_FAST + BIG_SLOW
BIG_SUITE = Expected(
    shard_size=_BIG_ROWS,
    tasks={"big": _BIG_ROWS},
    metrics={"big": {"exact_match": sum(i % 10 != 0 for i in range(_BIG_ROWS)) / _BIG_ROWS}},
    counts={"big": {"samples": _BIG_ROWS, "valid": _BIG_ROWS, "invalid": 0, "errored": 0}},
    scores={"big": {i: {"exact_match": 0.0 if i % 10 == 0 else 1.0} for i in range(_BIG_ROWS)}},
)


# --------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def components_down(node: RealNode, *components: str) -> Iterator[None]:
    """``components`` stopped (SIGTERM) in the order given, started again in reverse order at
    the end whatever happens (a node left half down would fail every later test)."""
    stopped: list[str] = []
    try:
        for component in components:
            node.down(component)
            stopped.append(component)
        yield
    finally:
        for component in reversed(stopped):
            node.up(component)


def runner_pods(node: RealNode, namespace: str, run: str) -> list[dict[str, Any]]:
    return list(
        node.kubectl_json("get", "pods", "-n", namespace, "-l", f"{names.LABEL_RUN}={run}")["items"]
    )


def running_runner(node: RealNode, namespace: str, run: str, timeout: float = 240) -> Any:
    """A work-unit Pod of ``run`` whose runner container is running (it is mid-shard)."""

    def find() -> Any:
        for pod in runner_pods(node, namespace, run):
            for status in pod.get("status", {}).get("containerStatuses", []):
                if status["name"] == "runner" and "running" in status.get("state", {}):
                    return pod
        return None

    return node.wait_for(find, timeout=timeout, what=f"a running runner of {run}", interval=0.5)


def kill_container(node: RealNode, pod: dict[str, Any], container: str) -> None:
    """SIGKILL ``container`` of ``pod`` through containerd (the kernel's OOM kill or a crash
    looks the same to the kubelet: the container exits 137)."""
    (status,) = [s for s in _container_statuses(pod) if s["name"] == container]
    container_id = status["containerID"].removeprefix("containerd://")
    subprocess.run(
        [str(node.node_bin / "ctr"), "-a", str(node.workdir / "containerd" / "containerd.sock"),
         "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", container_id],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def _container_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The statuses of the Pod's containers and init containers (native sidecars are init
    containers)."""
    status = pod.get("status", {})
    return [*status.get("containerStatuses", []), *status.get("initContainerStatuses", [])]


def kill_proxy_holding_a_call(
    node: RealNode, namespace: str, run: str, holding: Callable[[], bool], timeout: float = 240
) -> float:
    """Once ``holding()`` (the provider holds a model call), SIGKILL the ``proxy`` sidecar of
    every running work-unit Pod of ``run``; wait until the kubelet has it running again.
    Returns the seconds from the kill to the restarted sidecar running."""
    node.wait_for(holding, timeout=timeout, what="a model call held by the provider", interval=0.3)
    before: dict[str, int] = {}
    for pod in runner_pods(node, namespace, run):
        (proxy,) = [s for s in _container_statuses(pod) if s["name"] == "proxy"]
        if "running" in proxy.get("state", {}):
            kill_container(node, pod, "proxy")
            before[pod["metadata"]["name"]] = proxy.get("restartCount", 0)
    killed = time.monotonic()
    assert before, f"no work-unit Pod of {run} with a running proxy sidecar"

    def restarted() -> bool:
        for pod in runner_pods(node, namespace, run):
            name = pod["metadata"]["name"]
            if name not in before:
                continue
            phase = pod.get("status", {}).get("phase")
            assert phase in ("Pending", "Running"), (
                f"Pod {name} ended ({phase}) instead of restarting its proxy sidecar: "
                f"{json.dumps(_container_statuses(pod))[:3000]}"
            )
            (proxy,) = [s for s in _container_statuses(pod) if s["name"] == "proxy"]
            if proxy.get("restartCount", 0) <= before[name] or "running" not in proxy["state"]:
                return False
        return True

    deadline = time.monotonic() + 120
    while not restarted():
        assert time.monotonic() < deadline, "the proxy sidecar was not restarted within 120 s"
        time.sleep(0.2)
    return round(time.monotonic() - killed, 1)


def jobs_by_name(node: RealNode, namespace: str, run: str) -> dict[str, dict[str, Any]]:
    items = node.kubectl_json("get", "jobs", "-n", namespace, "-l", f"{names.LABEL_RUN}={run}")
    return {j["metadata"]["name"]: j for j in items["items"]}


# --------------------------------------------------------------------------------------------
# What every fault test asserts
# --------------------------------------------------------------------------------------------


def assert_exact_outcome(
    node: RealNode,
    namespace: str,
    run: str,
    expected: Expected,
    *,
    timeout: float = 600,
) -> dict[str, Any]:
    """The run ends ``Succeeded`` with reason ``Completed``; its status has the fault-free
    run's metrics and counts, every unit succeeded, no model call counted (the suites are
    precomputed: a call paid would be one too many); the store holds exactly the fault-free
    run's sample ids, each once, with its scores. Returns the finished EvalRun."""
    obj = wait_finished(node, namespace, run, timeout=timeout)
    status = obj["status"]
    context = f"{json.dumps(status, indent=1)[:6000]}"
    assert status["phase"] == "Succeeded", f"{context}\n{diagnose(node, namespace)}"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["status"] == "True", context
    assert conditions["Succeeded"]["reason"] == "Completed", context
    units = status["units"]
    assert units["succeeded"] == units["total"], context
    assert units["failed"] == 0, context
    results = {r["task"]: r for r in status["results"]}
    assert set(results) == set(expected.tasks), context
    for task, metrics in expected.metrics.items():
        assert results[task]["metrics"] == {
            k: pytest.approx(v, abs=1e-6) for k, v in metrics.items()
        }, context
        assert results[task]["counts"] == expected.counts[task], context
        assert not any((results[task].get("modelCalls") or {}).values()), context

    run_id = names.run_id(namespace, run, obj["metadata"]["uid"])
    samples = stored_samples(node, obj)
    by_id: dict[str, Any] = {}
    for s in samples:
        assert s.sample_id not in by_id, f"sample {s.sample_id} stored twice"
        by_id[s.sample_id] = s
    size = expected.shard_size
    want = {  # a sample's seq: its shard's SEQ_STRIDE block, then its place in the shard
        sample_id(run_id, task, "precomputed", row // size * SEQ_STRIDE + row % size): (task, row)
        for task, rows in expected.tasks.items()
        for row in range(rows)
    }
    missing = sorted(set(want) - set(by_id))
    extra = sorted(set(by_id) - set(want))
    assert not missing, f"{len(missing)} samples missing: {missing[:5]}"
    assert not extra, f"{len(extra)} samples no fault-free run has: {extra[:5]}"
    for sid, (task, row) in want.items():
        record = by_id[sid]
        assert record.status == "valid", (sid, record.status, record.error)
        if task in expected.scores:
            assert record.scores == expected.scores[task][row], (task, row, record.scores)
    return dict(obj)


def done_unit_infos(node: RealNode, run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What each unit's runner reported with its done report (samples graded, skipped, ...)."""
    meta = run["metadata"]
    store = ResultStore.open(default_url(str(node.workdir / "pv" / "store" / "results.db")))
    try:
        return store.done_unit_infos(names.run_id(meta["namespace"], meta["name"], meta["uid"]))
    finally:
        store.close()


def assert_nothing_left(node: RealNode, namespace: str, run: dict[str, Any]) -> None:
    """Delete the EvalRun and wait until none of its Jobs, Pods, Secrets, ConfigMaps and
    NetworkPolicies is left (the garbage collector's work through owner references)."""
    name, uid = run["metadata"]["name"], run["metadata"]["uid"]
    node.kubectl("delete", "evalrun", name, "-n", namespace, "--wait=true", timeout=120)

    def left() -> list[str]:
        found = []
        for kind in ("jobs", "pods", "secrets", "configmaps", "networkpolicies"):
            for item in node.kubectl_json("get", kind, "-n", namespace)["items"]:
                meta = item["metadata"]
                owned = any(o["uid"] == uid for o in meta.get("ownerReferences", []))
                if owned or (meta.get("labels") or {}).get(names.LABEL_RUN) == name:
                    found.append(f"{kind}/{meta['name']}")
        return found

    deadline = time.monotonic() + 180
    remaining = left()
    while remaining and time.monotonic() < deadline:
        time.sleep(2)
        remaining = left()
    assert not remaining, f"left 180 s after the EvalRun was deleted: {remaining}"
