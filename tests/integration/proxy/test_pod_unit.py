"""A work unit exactly as its pod runs it: ``evalkube unit`` against a proxy sidecar (both
engines) and the operator's real ingest server, both on loopback.

What the pod must keep that the local engine keeps: the runner configures the sidecar's
budget for its unit (``max_model_calls`` per execution x planned executions) and opens one
token per execution; a task without model access gets a zero budget and no tokens, so its
grader spends nothing even when it finds the bridge's socket and talks to it directly.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from evalkube.controller.api import ApiServer
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunEntry, RunRegistry, digest
from evalkube.controller.snapshot import build_snapshot, check_suite
from evalkube.engine.snapshot import load_snapshot, parse_snapshot
from evalkube.models.snapshot import RunSnapshot
from evalkube.store import ResultStore, RunRecord
from tests.integration.proxy.conftest import MakeBridge
from tests.integration.proxy.fake_upstream import FakeUpstream, Scripted

pytestmark = pytest.mark.timeout(180)

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
NS, NAME, UID = "team-a", "nightly", "0f1e2d3c-0000-4000-8000-000000000000"
RUN_ID = "team-a.nightly.0f1e2d3c"
TOKEN = "ingest-token-for-the-test"

JUDGE = """
def grade(sample, item, ctx):
    ok, error = 0, ""
    for _ in range(5):
        try:
            ctx.responses_create(model="auto", input=sample["output_text"])
            ok += 1
        except Exception as exc:
            error = str(exc)
    return {"scores": {"calls": float(ok)}, "judge": {"error": error}}
"""

# No model access: no ctx; it finds the bridge's socket anyway and calls it by hand.
SNEAKY = """
import http.client, json, socket

def grade(sample, item):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(item["bridge"])
    conn = http.client.HTTPConnection("bridge")
    conn.sock = sock
    conn.request("POST", "/v1/responses", body=json.dumps({"input": "exfiltrate"}),
                 headers={"Content-Type": "application/json",
                          "X-Evalkube-Execution": sample["sample_id"]})
    return float(conn.getresponse().status)
"""


def model_backed_task(
    task_id: str, rows: list[dict[str, Any]], max_calls: int, metric: str, source: str
) -> dict[str, Any]:
    """A task over precomputed outputs whose grader calls models through ``ctx``."""
    return {
        "id": task_id,
        "dataset": {"rows": rows},
        "prompt": "{{ item.q }}",
        "outputs": {"column": "out"},
        "grader": {
            "type": "python",
            "contract": "model_backed",
            "maxModelCalls": max_calls,
            "metricId": metric,
            "source": source,
        },
    }


def suite_spec(bridge_socket: str) -> dict[str, Any]:
    rows = [{"q": f"q{i}", "out": f"answer {i}", "bridge": bridge_socket} for i in range(3)]
    return {
        "tasks": [
            model_backed_task("judge", rows, 2, "calls", JUDGE),
            {
                "id": "sneaky",
                "dataset": {"rows": rows[:2]},
                "prompt": "{{ item.q }}",
                "outputs": {"column": "out"},
                "grader": {"type": "python", "source": SNEAKY},
            },
        ]
    }


def snapshot_of(
    bridge_socket: str,
    spec: dict[str, Any] | None = None,
    models: tuple[str, ...] = ("precomputed",),
    shard_size: int = 10,
    providers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec = spec or suite_spec(bridge_socket)
    check = check_suite(NS, spec, lambda ns, cm, key: None)
    assert check.ok, check.problems
    run = {
        "metadata": {"namespace": NS, "name": NAME, "uid": UID},
        "spec": {
            "suiteRef": {"name": "qa"},
            "models": list(models),
            "shardSize": shard_size,
            **({"providers": providers} if providers else {}),
        },
    }
    snapshot = build_snapshot(run, RUN_ID, "qa", check)
    return snapshot.model_dump(mode="json", by_alias=True, exclude_none=True)


@contextmanager
def ingest_server(store: ResultStore) -> Iterator[str]:
    """The operator's ingest application on a loopback port, in a thread of its own."""
    registry = RunRegistry()
    registry.register(RunEntry(NS, NAME, RUN_ID, "qa", digest(TOKEN)))
    api = ApiServer(store, registry, OperatorMetrics())
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(api.ingest_app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def run_unit(snapshot: Path, unit: str, ingest: str, bridge: Any) -> None:
    done = subprocess.run(
        [
            EVALKUBE, "unit", "--snapshot", str(snapshot), "--unit", unit,
            "--ingest-url", ingest, "--sandbox", "process",
            "--bridge", bridge.endpoint, "--bridge-control", bridge.control_endpoint,
        ],
        env={**os.environ, "EVALKUBE_INGEST_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout


def test_the_pod_runner_enforces_budgets_and_model_access(
    make_bridge: MakeBridge, upstream: FakeUpstream, tmp_path: Path
) -> None:
    bridge = make_bridge(control_listen=f"unix:{tmp_path / 'control.sock'}")
    assert bridge.endpoint is not None
    assert bridge.control_endpoint is not None
    snapshot_path = tmp_path / "snapshot.json"
    snapshot_path.write_text(json.dumps(snapshot_of(bridge.endpoint.removeprefix("unix:"))))
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        store.create_run(RunRecord(RUN_ID, "qa", "sha256:x", {}, "pod"))
        units = load_snapshot(snapshot_path).units()
        assert [u.unit_id for u in units] == ["judge.precomputed.00000", "sneaky.precomputed.00000"]
        with ingest_server(store) as ingest:
            run_unit(snapshot_path, "judge.precomputed.00000", ingest, bridge)
            assert len(upstream.received) == 6  # 3 executions x maxModelCalls 2, no more
            run_unit(snapshot_path, "sneaky.precomputed.00000", ingest, bridge)
        samples = {s.sample_id: s for s in store.iter_samples(RUN_ID)}
        infos = store.done_unit_infos(RUN_ID)
    finally:
        store.close()
    # each unit reports what its sidecar refused (Prometheus never scrapes a Pod's proxy):
    # 3 executions x (5 asked - 2 allowed); the sneaky grader's 2 calls with no open token
    assert infos["judge.precomputed.00000"]["budgetRefused"] == {"execution": 9}
    assert infos["sneaky.precomputed.00000"]["budgetRefused"] == {"unknown_execution": 2}
    judged = [s for s in samples.values() if s.task_id == "judge"]
    assert len(judged) == 3
    for sample in judged:
        assert sample.status == "valid"
        assert sample.scores == {"calls": 2.0}
        assert "budget of 2 exhausted for this execution" in sample.judge["error"]
        assert sample.model_calls["judge"] == 2  # counted per sample, by its token
        assert len(sample.model_calls["response_ids"]) == 2
    sneaky = [s for s in samples.values() if s.task_id == "sneaky"]
    assert [s.scores for s in sneaky] == [{"score": 403.0}] * 2  # refused: no open token
    assert len(upstream.received) == 6  # the task without model access spent nothing
    assert bridge.budget()["max_calls_per_execution"] == 0


# A model-backed grader that hunts its worker's memory for other executions' tokens and
# spends with every one it finds, by hand, on the bridge's socket.
THIEF = """
import gc, http.client, json, re, socket

TOKEN = re.compile(r"^[A-Za-z0-9_-]{22}$")

def call(path, token):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    conn = http.client.HTTPConnection("bridge")
    conn.sock = sock
    conn.request("POST", "/v1/responses", body=json.dumps({"input": "steal"}),
                 headers={"Content-Type": "application/json", "X-Evalkube-Execution": token})
    return conn.getresponse().status

def strings(container):
    if isinstance(container, dict):
        yield from container.keys()
        yield from container.values()
    elif isinstance(container, (list, tuple, set, frozenset)):
        yield from container
    elif hasattr(container, "__slots__"):
        for name in getattr(type(container), "__slots__", ()):
            yield getattr(container, name, None)

def grade(sample, item, ctx):
    seen = set()
    for container in gc.get_objects():
        seen.update(s for s in strings(container) if isinstance(s, str) and TOKEN.match(s))
    others = sorted(seen - {ctx.execution_id})
    stolen = sum(call(item["bridge"], t) == 200 for t in others)
    return {"scores": {"stolen": float(stolen), "seen": float(len(others))}}
"""


def test_a_grader_finds_at_most_the_next_executions_token(
    make_bridge: MakeBridge, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Default isolation shares a worker between a task's executions. Graders with model
    access get one sample per request, so a worker holds its current execution's token and at
    most the next one's: a thief spends at most one neighbour's budget, never beyond the
    unit's total."""
    bridge = make_bridge(control_listen=f"unix:{tmp_path / 'control.sock'}")
    assert bridge.endpoint is not None
    socket_path = bridge.endpoint.removeprefix("unix:")
    rows = [{"q": f"q{i}", "out": f"a{i}", "bridge": socket_path} for i in range(8)]
    spec = {"tasks": [model_backed_task("thief", rows, 1, "stolen", THIEF)]}
    snapshot_path = tmp_path / "snapshot.json"
    snapshot_path.write_text(json.dumps(snapshot_of(socket_path, spec)))
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        store.create_run(RunRecord(RUN_ID, "qa", "sha256:x", {}, "pod"))
        with ingest_server(store) as ingest:
            run_unit(snapshot_path, "thief.precomputed.00000", ingest, bridge)
        samples = list(store.iter_samples(RUN_ID))
    finally:
        store.close()
    assert len(samples) == 8
    assert all(s.status == "valid" for s in samples), [s.error for s in samples]
    # candidates are many (any 22-character word), usable tokens at most one: the next one's
    assert max(s.scores["seen"] for s in samples) > 1
    assert max(s.scores["stolen"] for s in samples) <= 1
    assert sum(s.scores["stolen"] for s in samples) <= 8  # the unit's total caps it all
    assert len(upstream.received) <= 8


def test_the_operator_and_the_pod_plan_the_same_units(tmp_path: Path) -> None:
    """The operator creates a Job per unit of ``parse_snapshot(...).units()``; the runner runs
    the unit it is given from ``load_snapshot(file).units()``: one planner, one plan."""
    data = snapshot_of("/nowhere.sock")
    data["run_spec"]["shardSize"] = 2
    data["run_spec"]["models"] = ["precomputed", "openai:gpt-x"]
    data["run_spec"]["providers"] = {"openai": {"baseURL": "https://api.openai.example/v1"}}
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(data))
    operator_plan = parse_snapshot(RunSnapshot.model_validate_json(path.read_text())).units()
    pod_plan = load_snapshot(path).units()
    assert operator_plan == pod_plan
    assert [u.unit_id for u in pod_plan] == [
        "judge.precomputed.00000", "judge.precomputed.00001",
        "judge.openai-gpt-x.00000", "judge.openai-gpt-x.00001",
        "sneaky.precomputed.00000", "sneaky.openai-gpt-x.00000",
    ]  # fmt: skip


# -- a retried Job pays for nothing twice ---------------------------------------------------
ECHO = """
def grade(sample, item):
    return 1.0 if sample["output_text"] == "echo: " + item["q"] else 0.0
"""


def test_a_killed_pod_keeps_the_candidates_it_paid_for(
    make_bridge: MakeBridge, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The pod is killed (SIGKILL, as a node loss or a preemption would) while its shard is
    still generating; the retried Job takes back every answer that had arrived, through the
    operator's ingest API, and calls the provider only for the rest (at most the calls in
    flight at the kill are made twice). Before pods kept answers, a shard generates all its
    candidates before storing its first sample, so every answer was paid for again."""
    rows = 96
    upstream.then(*[Scripted(delay=0.05)] * (3 * rows))  # ~0.6 s of generation at 8 at a time
    bridge = make_bridge(control_listen=f"unix:{tmp_path / 'control.sock'}")
    assert bridge.endpoint is not None
    assert bridge.control_endpoint is not None
    spec = {
        "tasks": [
            {
                "id": "echo",
                "dataset": {"rows": [{"id": f"r{i}", "q": f"question {i}"} for i in range(rows)]},
                "prompt": "{{ item.q }}",
                "grader": {"type": "python", "source": ECHO},
            }
        ]
    }
    snapshot = snapshot_of(
        bridge.endpoint.removeprefix("unix:"),
        spec,
        models=("fake:gpt-test",),
        shard_size=rows,
        providers={"fake": {"baseURL": upstream.base_url}},
    )
    snapshot_path = tmp_path / "snapshot.json"
    snapshot_path.write_text(json.dumps(snapshot))
    [unit] = [u.unit_id for u in load_snapshot(snapshot_path).units()]
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        store.create_run(RunRecord(RUN_ID, "qa", "sha256:x", {}, "pod"))
        with ingest_server(store) as ingest:
            command = [
                EVALKUBE, "unit", "--snapshot", str(snapshot_path), "--unit", unit,
                "--ingest-url", ingest, "--sandbox", "process",
                "--bridge", bridge.endpoint, "--bridge-control", bridge.control_endpoint,
            ]  # fmt: skip
            env = {**os.environ, "EVALKUBE_INGEST_TOKEN": TOKEN}
            first = subprocess.Popen(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                deadline = time.monotonic() + 60
                while len(upstream.received) < rows // 2 and first.poll() is None:
                    assert time.monotonic() < deadline, "generation never got half way"
                    time.sleep(0.01)
            finally:
                first.kill()
                first.wait(10)
            paid_before_kill = len(upstream.received)
            assert paid_before_kill < rows, "the first attempt finished before the kill"
            with store.engine.connect() as conn:
                kept = conn.exec_driver_sql("SELECT count(*) FROM evalkube_answers").scalar_one()
            run_unit(snapshot_path, unit, ingest, bridge)
        samples = list(store.iter_samples(RUN_ID))
    finally:
        store.close()
    assert len(samples) == rows
    wrong = [(s.output_text, s.dataset_row, s.error) for s in samples if s.scores != {"score": 1.0}]
    assert not wrong, wrong[:3]
    prompts = collections.Counter(r.body["input"] for r in upstream.received)
    repeated = sum(n - 1 for n in prompts.values())
    assert len(prompts) == rows
    # the calls in flight at the kill, and answers still on their way to the operator (its
    # writer commits a burst at a time): at most two bursts of the generation concurrency
    assert repeated <= 2 * 8, f"{repeated} paid twice ({paid_before_kill} before the kill)"
    assert kept > 0, "no answer reached the operator before the kill"
