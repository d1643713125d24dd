"""Model-call faults on the real node: the provider misbehaves (429 and 5xx storms, slow
bodies, dropped connections) during a run whose candidates and LLM judge go through the
work-unit pods' proxy sidecar, to the fake provider on a host outside the cluster
(tests/realnode/fake_provider.py, switched over HTTP).

Each fault's run is compared with a fault-free run of the same suite: the run succeeds with
its reason, every sample is stored exactly once with the same scores, the calls the provider
received (its bill) are exactly what the run's status counts (one per call plus its
``retries``), no answer the proxy received was asked for again, and nothing of the run is
left once it is deleted.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from evalkube.controller import names
from tests.cluster.realnode import RealNode
from tests.realnode.faults import jobs_by_name, kill_proxy_holding_a_call, one_task_suite
from tests.realnode.support import (
    OUTSIDE_IP,
    eval_run,
    outside_host,
    provider_calls,
    stored_samples,
    wait_finished,
)

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(900)]

PORT = 8444
KEY = "sk-realnode-faults-0123456789"
ROWS = [{"q": "alpha"}, {"q": "beta"}, {"q": "gamma"}]
#: Every call's first ``times`` requests misbehave: each call costs the provider 1 + times.
FAULTS: dict[str, dict[str, Any]] = {
    "storm429": {"times": 2, "retry_after": 1},
    "storm5xx": {"times": 2, "status": 503},
    "slow": {"times": 1, "delay": 12},  # past the provider's timeoutSeconds
    "drop": {"times": 2},
}
TIMEOUT_SECONDS = 4
JUDGE = """
import json

def grade(sample, item, ctx):
    response = ctx.responses_create(
        model="auto",
        input=f"Reference: {item['target']}\\nPrediction: {sample['output_text']}",
    )
    verdict = json.loads(response["output_text"])["verdict"]
    return 1.0 if verdict == "correct" else 0.0
"""


@dataclass
class Bench:
    node: RealNode
    namespace: str
    netns: str
    baseline: dict[str, Any]
    """The fault-free run: its EvalRun and its stored samples (id -> scores)."""


def set_mode(netns: str, mode: str, **options: Any) -> None:
    """Switch the fake provider's misbehaviour (and forget what it received)."""
    body = json.dumps({"mode": mode, "clear_calls": True, **options})
    subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", sys.executable, "-c",
         "import sys, urllib.request; urllib.request.urlopen(urllib.request.Request("
         f"'http://{OUTSIDE_IP}:{PORT}/_mode', data=sys.argv[1].encode(), method='POST'))",
         body],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip


def run_once(
    bench_node: RealNode,
    namespace: str,
    netns: str,
    name: str,
    *,
    timeout_seconds: float = TIMEOUT_SECONDS,
    during: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run the judged suite as EvalRun ``name`` (``during`` called once it is applied); the
    finished run, its stored samples and what the provider received meanwhile."""
    providers = {
        "fake": {
            "baseURL": f"http://{OUTSIDE_IP}:{PORT}/v1",
            "credentialsSecretRef": {"name": "provider", "key": "api-key"},
            "timeoutSeconds": timeout_seconds,
        }
    }
    bench_node.apply(
        eval_run(
            namespace, name, "judged",
            models=["fake:cand"], judgeModel="fake:judge", providers=providers,
        )
    )  # fmt: skip
    if during is not None:
        during()
    run = wait_finished(bench_node, namespace, name)
    samples = stored_samples(bench_node, run)
    return {
        "run": run,
        "ids": collections.Counter(row(s.sample_id) for s in samples),
        "scores": {row(s.sample_id): s.scores for s in samples},
        "calls": provider_calls(netns, PORT),
    }


def row(sample_id: str) -> str:
    """A sample id without its run's part (``s_<run>_<row>``): the row, the same in every run."""
    return sample_id.rsplit("_", 1)[-1]


@pytest.fixture(scope="module")
def bench(evalkube_on_node: RealNode) -> Iterator[Bench]:
    node = evalkube_on_node
    namespace = f"rn-models-{uuid.uuid4().hex[:6]}"
    node.kubectl("create", "namespace", namespace)
    script = str(Path(__file__).with_name("fake_provider.py"))
    try:
        with outside_host(node, [script, OUTSIDE_IP, str(PORT)]) as netns:
            node.kubectl(
                "create", "secret", "generic", "provider", "-n", namespace,
                f"--from-literal=api-key={KEY}",
            )  # fmt: skip
            node.apply(suite_object(namespace))
            baseline = run_once(node, namespace, netns, "fault-free")
            yield Bench(node, namespace, netns, baseline)
    finally:
        node.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def suite_object(namespace: str) -> dict[str, Any]:
    task = {
        "id": "judged",
        "dataset": {"rows": ROWS},
        "prompt": "{{ item.q }}",
        "target": "{{ item.q }}",
        "grader": {
            "type": "python",
            "contract": "model_backed",
            "source": JUDGE,
            "metricId": "judge_score",
            "maxModelCalls": 2,
        },
    }
    return one_task_suite(namespace, "judged", task)


def test_the_fault_free_run_pays_one_request_per_call(bench: Bench) -> None:
    """The reference the faults are compared with, itself exact."""
    status = bench.baseline["run"]["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    (result,) = status["results"]
    assert result["counts"] == {"samples": 3, "valid": 3, "invalid": 0, "errored": 0}
    assert result["metrics"]["judge_score"] == pytest.approx(2 / 3, abs=1e-6)
    assert result["modelCalls"] == {"candidate": 3, "judge": 3}, result
    assert len(bench.baseline["calls"]) == 6
    assert set(bench.baseline["ids"].values()) == {1}


# Every fault on each CI run: a fault's run takes 10-26 s on the shared node (the fault-free
# run and the node itself are set up once), 66 s for all four.
def _assert_like_baseline(
    got: dict[str, Any], baseline: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Succeeded with its reason, every sample stored exactly once with the fault-free run's
    scores, metrics and counts; the run and its one result."""
    run = got["run"]
    status = run["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    assert conditions["Succeeded"]["status"] == "True", conditions
    assert conditions["Succeeded"].get("reason"), conditions
    assert got["ids"] == baseline["ids"]
    assert set(got["ids"].values()) == {1}
    assert got["scores"] == baseline["scores"]
    (result,) = status["results"]
    (reference,) = baseline["run"]["status"]["results"]
    assert result["metrics"] == reference["metrics"]
    assert result["counts"] == reference["counts"]
    return run, result


@pytest.mark.parametrize("mode", ["storm429", "storm5xx", "slow", "drop"])
def test_provider_fault_loses_nothing_and_every_paid_request_is_counted(
    bench: Bench, mode: str
) -> None:
    node, namespace = bench.node, bench.namespace
    set_mode(bench.netns, mode, **FAULTS[mode])
    try:
        got = run_once(node, namespace, bench.netns, mode)
    finally:
        set_mode(bench.netns, "ok")
    run, result = _assert_like_baseline(got, bench.baseline)
    # the provider's bill, exactly: one request per call and each retry that reached it
    calls = got["calls"]
    per_call = 1 + FAULTS[mode]["times"]
    model_calls = result["modelCalls"]
    assert model_calls == {"candidate": 3, "judge": 3, "retries": 6 * (per_call - 1)}, model_calls
    assert len(calls) == model_calls["candidate"] + model_calls["judge"] + model_calls["retries"]
    assert {c["answer"] for c in calls} == {"ok", mode}
    # no answer the proxy received was asked for again
    answered = collections.Counter(c["request"] for c in calls if c["answer"] == "ok")
    assert len(answered) == 6, answered
    assert set(answered.values()) == {1}, answered
    assert_nothing_left(node, namespace, mode, run["metadata"]["uid"])


def assert_nothing_left(node: RealNode, namespace: str, name: str, uid: str) -> None:
    """Delete the run; none of its Jobs, Pods, Secrets or ConfigMaps may remain."""
    node.kubectl("delete", "evalrun", name, "-n", namespace, "--wait=true", timeout=120)

    def left() -> list[str]:
        found = []
        for kind in ("jobs", "pods", "secrets", "configmaps"):
            for item in node.kubectl_json("get", kind, "-n", namespace)["items"]:
                meta = item["metadata"]
                owned = any(o.get("uid") == uid for o in meta.get("ownerReferences", []))
                labelled = meta.get("labels", {}).get(names.LABEL_RUN) == names.run_label(name)
                if owned or labelled:
                    found.append(f"{kind}/{meta['name']}")
        return found

    deadline = time.monotonic() + 120
    while remaining := left():
        assert time.monotonic() < deadline, f"left behind by the deleted run: {remaining}"
        time.sleep(2)


#: How long the provider holds each request's answer (its first try) in the sidecar test: long
#: enough for the kill to land mid-call, short enough under ``PROXY_TIMEOUT_SECONDS``.
HOLD_SECONDS = 10
PROXY_TIMEOUT_SECONDS = 60


def test_proxy_sidecar_killed_mid_model_call_loses_nothing_and_pays_nothing_uncounted(
    bench: Bench,
) -> None:
    """The proxy sidecar SIGKILLed twice while the provider holds its calls: once mid candidate
    call (the runner's), once mid judge call (a grader's ``ctx``). The kubelet restarts it; it
    replays its journal (budgets, tokens, usage; the requests the dead process had sent count
    as retries); the runner and ``ctx`` send the dropped calls again. Every sample is graded
    once with the fault-free scores, and the provider's bill is exactly what ``status``
    counts."""
    node, namespace, netns, name = bench.node, bench.namespace, bench.netns, "proxy-killed"
    set_mode(netns, "slow", times=1, delay=HOLD_SECONDS)
    restarts: list[float] = []

    def kill_twice() -> None:
        for model in ("cand", "judge"):
            try:
                restarts.append(
                    kill_proxy_holding_a_call(
                        node, namespace, name, lambda m=model: held(provider_calls(netns, PORT), m)
                    )
                )
            except (AssertionError, TimeoutError) as exc:  # the checks below say what failed
                print(f"no {model} call killed: {exc}")

    try:
        got = run_once(
            node, namespace, netns, name, timeout_seconds=PROXY_TIMEOUT_SECONDS, during=kill_twice
        )
    finally:
        set_mode(netns, "ok")
    print(f"proxy sidecar back (restarted, running) {restarts} s after each kill")
    run, result = _assert_like_baseline(got, bench.baseline)
    # the bill: every request the provider received is a call or a counted retry
    calls = got["calls"]
    cut = [c for c in calls if c.get("delivered") is False]
    model_calls = result["modelCalls"]
    print(f"modelCalls {model_calls}; the provider received {len(calls)}, {len(cut)} cut")
    assert len(calls) == model_calls["candidate"] + model_calls["judge"] + model_calls.get(
        "retries", 0
    ), (model_calls, calls)
    assert model_calls == {"candidate": 3, "judge": 3, "retries": len(cut)}, (model_calls, calls)
    # a call of each kind was cut by a kill, and the Pod lived on (its sidecar restarted)
    assert {c["model"] for c in cut} == {"cand", "judge"}, (restarts, cut)
    assert len(restarts) == 2, restarts
    (job,) = jobs_by_name(node, namespace, name).values()
    assert not job["status"].get("failed"), job["status"]
    # each call's answer was received once; a request was sent again only when the dead proxy
    # never got its answer
    by_request = collections.defaultdict(list)
    for c in calls:
        by_request[c["request"]].append(c)
    assert len(by_request) == 6, by_request
    for sent in by_request.values():
        assert [c.get("delivered") for c in sent] == [False] * (len(sent) - 1) + [True], sent
    assert_nothing_left(node, namespace, name, run["metadata"]["uid"])


def held(calls: list[dict[str, Any]], model: str) -> bool:
    """Whether the provider holds a request of ``model`` (its answer still dribbling)."""
    return any(c["model"] == model and c.get("delivered", True) is None for c in calls)
