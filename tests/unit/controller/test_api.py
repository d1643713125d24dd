"""The operator's HTTP API (ingest, samples, unit done, metrics) on a real loopback server.

aiohttp's ``TestServer`` binds 127.0.0.1; the store is a real SQLite file.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from evalkube.controller.api import ApiServer
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunEntry, RunRegistry, digest
from evalkube.store import ResultStore, RunRecord
from evalkube.store.records import SampleRecord
from evalkube.store.remote import sample_to_wire

NS = "team-a"
RUN = "nightly"
RUN_ID = "team-a.nightly.0f1e2d3c"
TOKEN = "the-ingest-token"
OTHER_RUN, OTHER_RUN_ID, OTHER_TOKEN = "weekly", "team-a.weekly.99999999", "another-ingest-token"
BASE = f"/api/v1/namespaces/{NS}/evalruns/{RUN}"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
READ_TOKEN = "read-secret"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}


class Harness:
    """A store with two registered runs and the API over them (both of its applications'
    routes on one test server; :func:`test_ingest_and_api_are_separate_servers` checks the
    split the operator really serves)."""

    def __init__(self, root: Path) -> None:
        self.store = ResultStore.open(f"sqlite:///{root / 'results.db'}")
        self.registry = RunRegistry()
        self.metrics = OperatorMetrics()
        self.done: list[tuple[str, str]] = []
        for name, run_id, token in ((RUN, RUN_ID, TOKEN), (OTHER_RUN, OTHER_RUN_ID, OTHER_TOKEN)):
            self.store.create_run(RunRecord(run_id, "qa", "sha256:x", {}, "pod"))
            self.registry.register(RunEntry(NS, name, run_id, "qa", digest(token)))
        self.api = ApiServer(
            self.store,
            self.registry,
            self.metrics,
            on_unit_done=lambda entry, unit: self.done.append((entry.name, unit)),
            read_token=READ_TOKEN,
        )

    def serve(self, body: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
        async def main() -> None:
            app = web.Application()
            app.add_routes(self.api.ingest_routes() + self.api.api_routes())
            async with TestClient(TestServer(app)) as client:
                await body(client)

        asyncio.run(main())

    def count(self, run_id: str = RUN_ID) -> int:
        return sum(1 for _ in self.store.iter_samples(run_id))


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.store.close()


def sample(seq: int, task: str = "qa", status: str = "valid", **extra: Any) -> dict[str, Any]:
    record = SampleRecord(
        run_id=RUN_ID,
        sample_id=f"s_{task}_{seq:06d}",
        task_id=task,
        model="m",
        seq=seq,
        status=status,  # type: ignore[arg-type]
        target=str(seq),
        output_text=str(seq),
        scores={"exact_match": 1.0 if status == "valid" else 0.0},
        error={"stage": "grading", "type": "ValueError", "message": "x"}
        if status == "errored"
        else None,
        **extra,
    )
    return sample_to_wire(record)


def statuses(i: int) -> str:
    return ("valid", "valid", "invalid", "errored")[i % 4]


# -- authorization ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer wrong"},
        {"Authorization": TOKEN},  # not a bearer header
        {"Authorization": f"Bearer {OTHER_TOKEN}"},  # another run's token
        {"Authorization": f"Basic {TOKEN}"},
    ],
)
def test_ingest_needs_this_runs_token(harness: Harness, headers: dict[str, str]) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.post(
            f"{BASE}/samples", json={"samples": [sample(0)]}, headers=headers
        )
        assert response.status == 401
        assert "token" in (await response.json())["error"]["message"]

    harness.serve(body)
    assert harness.count() == 0


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/samples"),
        ("GET", "/sample-ids?task=qa&model=m"),
        ("GET", "/samples:export"),
        ("POST", "/answers"),
        ("POST", "/answers:lookup"),
        ("GET", "/generation-errored-ids?task=qa&model=m"),
        ("POST", "/samples:update"),
        ("POST", "/samples:settle"),
        ("POST", "/task-results"),
        ("POST", "/units/qa.m.00000:done"),
    ],
)
def test_every_runner_route_needs_the_token(harness: Harness, method: str, path: str) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        # the operator's read token opens runs to reading only, never to a runner's routes
        for headers in ({}, {"Authorization": "Bearer wrong"}, READ):
            response = await client.request(method, BASE + path, json={}, headers=headers)
            assert response.status == 401, (path, headers)

    harness.serve(body)
    assert harness.store.done_units(RUN_ID) == set()


def test_unknown_run_is_404_only_to_the_read_token(harness: Harness) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        for namespace, name in (("team-a", "nope"), ("team-b", RUN)):
            base = f"/api/v1/namespaces/{namespace}/evalruns/{name}"
            response = await client.get(f"{base}/samples", headers=READ)
            assert response.status == 404
            assert "not known" in (await response.json())["error"]["message"]

    harness.serve(body)


def test_ingest_answers_alike_for_existing_and_absent_runs(harness: Harness) -> None:
    """A forged token learns nothing: the same status and body for a run that exists (in this
    namespace or another) and for one that does not, on runner and reading routes."""
    forged = {"Authorization": "Bearer forged-token-0123456789abcdef"}
    answers: dict[tuple[str, str, str], tuple[int, Any]] = {}

    async def body(client: TestClient[Any, Any]) -> None:
        for namespace, name in ((NS, RUN), (NS, "absent"), ("team-b", RUN)):
            base = f"/api/v1/namespaces/{namespace}/evalruns/{name}"
            for method, path in (("POST", "/samples"), ("GET", "/samples")):
                for headers in ({}, forged, AUTH if name != RUN or namespace != NS else {}):
                    response = await client.request(
                        method, base + path, json={"samples": []}, headers=headers
                    )
                    answers[(namespace, name, method + str(headers))] = (
                        response.status,
                        await response.json(),
                    )

    harness.serve(body)
    by_route: dict[str, set[str]] = {}
    for (_ns, _name, route), (status, payload) in answers.items():
        assert status == 401, (route, payload)
        by_route.setdefault(route, set()).add(json.dumps(payload))
    assert all(len(bodies) == 1 for bodies in by_route.values()), by_route


def test_the_token_is_checked_before_any_lookup(harness: Harness) -> None:
    """No token, or text that cannot be a token, is refused without looking the run up; a run
    found absent is looked up once per interval, however many requests name it."""
    lookups: list[tuple[str, str]] = []

    async def resolve(namespace: str, name: str) -> RunEntry | None:
        lookups.append((namespace, name))
        return None

    harness.api.registry = RunRegistry()
    harness.api.resolve = resolve

    async def body(client: TestClient[Any, Any]) -> None:
        base = f"/api/v1/namespaces/{NS}/evalruns/absent/samples"
        for headers in ({}, {"Authorization": "Bearer short"}, {"Authorization": "Bearer a b"}):
            assert (await client.post(base, json={}, headers=headers)).status == 401
        assert lookups == []
        for _ in range(20):
            assert (await client.post(base, json={}, headers=AUTH)).status == 401
        assert lookups == [(NS, "absent")]

    harness.serve(body)


def test_ingest_is_idempotent_by_sample_id(harness: Harness) -> None:
    batch = [sample(i) for i in range(20)]

    async def body(client: TestClient[Any, Any]) -> None:
        for _ in range(3):
            response = await client.post(f"{BASE}/samples", json={"samples": batch}, headers=AUTH)
            assert response.status == 200
            assert await response.json() == {"recorded": 20}
        # a retried batch that overlaps and changes one sample replaces it, never duplicates
        changed = [sample(19, status="invalid"), sample(20)]
        response = await client.post(f"{BASE}/samples", json={"samples": changed}, headers=AUTH)
        assert response.status == 200

    harness.serve(body)
    stored = list(harness.store.iter_samples(RUN_ID))
    assert len(stored) == 21
    assert len({s.sample_id for s in stored}) == 21
    assert next(s for s in stored if s.seq == 19).status == "invalid"


def test_run_id_is_pinned_from_the_registry_not_the_body(harness: Harness) -> None:
    forged = {**sample(0), "run_id": OTHER_RUN_ID}

    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.post(f"{BASE}/samples", json={"samples": [forged]}, headers=AUTH)
        assert response.status == 200

    harness.serve(body)
    assert harness.count(RUN_ID) == 1
    assert harness.count(OTHER_RUN_ID) == 0


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([], "body must be"),
        ({"rows": []}, "body must be"),
        ({"samples": [{"sample_id": "x"}]}, "invalid sample"),
        ({"samples": [{**sample(0), "status": "great"}]}, "invalid sample"),
        ({"samples": [{**sample(0), "scores": {"x": "1"}}]}, "invalid sample"),
        ({"samples": [{**sample(0), "evil": True}]}, "unknown sample fields"),
        ({"samples": [{**sample(0), "seq": "1"}]}, "invalid sample"),
    ],
)
def test_bad_ingest_bodies_are_400(harness: Harness, payload: Any, message: str) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.post(f"{BASE}/samples", json=payload, headers=AUTH)
        assert response.status == 400
        assert message in (await response.json())["error"]["message"]

    harness.serve(body)
    assert harness.count() == 0


def test_a_body_that_is_not_json_is_400(harness: Harness) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.post(f"{BASE}/samples", data=b"{nope", headers=AUTH)
        assert response.status == 400

    harness.serve(body)


def test_sample_ids_list_what_this_run_recorded(harness: Harness) -> None:
    harness.store.record_samples(
        [
            SampleRecord(OTHER_RUN_ID, "s_other", "qa", "m", 0, "valid"),
            *[SampleRecord(RUN_ID, f"s_{i}", "qa", "m", i, "valid") for i in range(3)],
        ]
    )

    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.get(
            f"{BASE}/sample-ids", params={"task": "qa", "model": "m"}, headers=AUTH
        )
        assert await response.json() == {"sample_ids": ["s_0", "s_1", "s_2"]}
        # one shard's range of sequence numbers (what a pod asks for)
        shard = {"task": "qa", "model": "m", "seq_from": "1", "seq_to": "2"}
        response = await client.get(f"{BASE}/sample-ids", params=shard, headers=AUTH)
        assert await response.json() == {"sample_ids": ["s_1"]}
        for bad in ({"seq_from": "1"}, {"seq_from": "x", "seq_to": "2"}):
            query = {"task": "qa", "model": "m", **bad}
            response = await client.get(f"{BASE}/sample-ids", params=query, headers=AUTH)
            assert response.status == 400
            assert "seq_from and seq_to" in (await response.json())["error"]["message"]

    harness.serve(body)


# -- the samples view -------------------------------------------------------------------------
def test_samples_page_and_cursor_walk_everything_once(harness: Harness) -> None:
    harness.store.record_samples(
        [
            SampleRecord(RUN_ID, f"s_{t}_{i:03d}", t, "m", i, "valid")
            for t in ("a", "b")
            for i in range(13)
        ]
    )

    async def body(client: TestClient[Any, Any]) -> None:
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params = {"limit": "5", **({"cursor": cursor} if cursor else {})}
            response = await client.get(f"{BASE}/samples", headers=READ, params=params)
            assert response.status == 200
            page = await response.json()
            assert len(page["samples"]) <= 5
            seen += [s["sample_id"] for s in page["samples"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 6  # 26 samples, 5 a page
        assert len(seen) == len(set(seen)) == 26
        assert seen == sorted(seen)  # task, model, position

    harness.serve(body)


def test_samples_default_limit_and_view_fields(harness: Harness) -> None:
    harness.store.record_samples(
        [SampleRecord(RUN_ID, f"s_{i:03d}", "qa", "m", i, "valid") for i in range(12)]
    )

    async def body(client: TestClient[Any, Any]) -> None:
        page = await (await client.get(f"{BASE}/samples", headers=READ)).json()
        assert len(page["samples"]) == 10
        assert page["next_cursor"]
        first = page["samples"][0]
        assert {"sample_id", "task_id", "model", "status", "scores", "error", "stdout"} <= set(
            first
        )
        assert "dataset_row" not in first
        assert "run_id" not in first

    harness.serve(body)


def test_samples_status_failed_and_task_model_filters(harness: Harness) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        batch = [sample(i, status=statuses(i)) for i in range(12)] + [
            sample(i, task="other", status="errored") for i in range(3)
        ]
        assert (
            await client.post(f"{BASE}/samples", json={"samples": batch}, headers=AUTH)
        ).status == 200
        failed = await (
            await client.get(
                f"{BASE}/samples", headers=READ, params={"status": "failed", "limit": "100"}
            )
        ).json()
        assert {s["status"] for s in failed["samples"]} == {"invalid", "errored"}
        assert len(failed["samples"]) == 6 + 3
        assert failed["next_cursor"] is None
        only_qa = await (
            await client.get(
                f"{BASE}/samples",
                headers=READ,
                params={"status": "failed", "task": "qa", "model": "m", "limit": "100"},
            )
        ).json()
        assert len(only_qa["samples"]) == 6
        assert all(s["task_id"] == "qa" for s in only_qa["samples"])
        errored = await (
            await client.get(
                f"{BASE}/samples", headers=READ, params={"status": "errored", "task": "qa"}
            )
        ).json()
        assert [s["error"]["type"] for s in errored["samples"]] == ["ValueError"] * 3
        none = await (
            await client.get(
                f"{BASE}/samples", headers=READ, params={"task": "qa", "model": "other-model"}
            )
        ).json()
        assert none == {"samples": [], "next_cursor": None}

    harness.serve(body)


def test_samples_view_is_per_run(harness: Harness) -> None:
    harness.store.record_samples([SampleRecord(OTHER_RUN_ID, "s_other", "qa", "m", 0, "valid")])

    async def body(client: TestClient[Any, Any]) -> None:
        mine = await (await client.get(f"{BASE}/samples", headers=READ)).json()
        assert mine["samples"] == []
        theirs = await (
            await client.get(f"/api/v1/namespaces/{NS}/evalruns/{OTHER_RUN}/samples", headers=READ)
        ).json()
        assert [s["sample_id"] for s in theirs["samples"]] == ["s_other"]

    harness.serve(body)


def test_samples_score_text_and_wrong_filters_page_by_cursor(harness: Harness) -> None:
    """The API filters like ``evalkube samples``: a page is ``limit`` matching samples and
    ``next_cursor`` walks the matching ones only."""
    harness.store.record_samples(
        [
            SampleRecord(
                RUN_ID, f"s_{i:03d}", "qa", "m", i, "valid",
                output_text="needle" if i % 3 == 0 else "hay",
                scores={"exact": float(i % 2), "f1": i / 100},
            )
            for i in range(30)
        ]
    )  # fmt: skip

    async def walk(client: TestClient[Any, Any], params: dict[str, Any]) -> list[int]:
        seen: list[int] = []
        cursor: str | None = None
        while True:
            query = {**params, "limit": "4", **({"cursor": cursor} if cursor else {})}
            response = await client.get(f"{BASE}/samples", headers=READ, params=query)
            assert response.status == 200, await response.text()
            page = await response.json()
            assert 0 < len(page["samples"]) <= 4
            seen += [int(s["sample_id"][2:]) for s in page["samples"]]
            cursor = page["next_cursor"]
            if cursor is None:
                return seen

    async def body(client: TestClient[Any, Any]) -> None:
        assert await walk(client, {"status": "wrong"}) == list(range(0, 30, 2))
        assert await walk(client, {"min_score": "f1=0.2", "max_score": "f1=0.25"}) == list(
            range(20, 26)
        )
        assert await walk(client, {"search": "NEEDLE", "min_score": "exact=1"}) == [
            3, 9, 15, 21, 27,
        ]  # fmt: skip
        first = await (
            await client.get(f"{BASE}/samples", headers=READ, params={"metrics": "true"})
        ).json()
        assert first["metrics"] == ["exact", "f1"]

    harness.serve(body)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"status": "bogus"}, "status must be one of"),
        ({"limit": "0"}, "limit must be"),
        ({"limit": "1001"}, "limit must be"),
        ({"limit": "ten"}, "limit must be"),
        ({"cursor": "not-a-cursor"}, ""),
        ({"min_score": "0.5"}, "min_score takes METRIC=VALUE"),
        ({"max_score": "f1=lots"}, "max_score: 'lots' is not a number"),
    ],
)
def test_bad_samples_queries_are_400(
    harness: Harness, params: dict[str, str], message: str
) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.get(f"{BASE}/samples", headers=READ, params=params)
        assert response.status == 400
        assert message in (await response.json())["error"]["message"]

    harness.serve(body)


# -- units, results, metrics ------------------------------------------------------------------
def test_unit_done_is_recorded_observed_and_idempotent(harness: Harness) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        info = {"kind": "shard", "samples": 10, "skipped": 0, "restarts": 0, "seconds": 2.5}
        for _ in range(2):
            response = await client.post(f"{BASE}/units/qa.m.00000:done", json=info, headers=AUTH)
            assert response.status == 200
            assert await response.json() == {"done": "qa.m.00000"}
        text = await (await client.get("/metrics")).text()
        assert 'evalkube_unit_duration_seconds_count{kind="shard"} 2.0' in text
        assert 'evalkube_unit_duration_seconds_bucket{kind="shard",le="5.0"} 2.0' in text

    harness.serve(body)
    assert harness.store.done_units(RUN_ID) == {"qa.m.00000"}
    assert harness.store.done_units(OTHER_RUN_ID) == set()
    assert harness.done == [(RUN, "qa.m.00000")] * 2


def test_a_unit_failure_report_is_recorded_observed_and_checked(harness: Harness) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        url = f"{BASE}/units/qa.m.batch:failed"
        response = await client.post(url, json={"reason": "too many samples"}, headers=AUTH)
        assert await response.json() == {"failed": "qa.m.batch"}
        bad = await client.post(url, json={"reason": ""}, headers=AUTH)
        assert bad.status == 400
        assert "reason" in (await bad.json())["error"]["message"]
        refused = await client.post(url, json={"reason": "x"}, headers={})
        assert refused.status == 401

    harness.serve(body)
    assert harness.store.failed_units(RUN_ID) == {"qa.m.batch": "too many samples"}
    assert harness.store.failed_units(OTHER_RUN_ID) == {}
    assert harness.done == [(RUN, "qa.m.batch")]  # the run's pass is woken


def test_task_results_are_pinned_to_the_run(harness: Harness) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.post(
            f"{BASE}/task-results",
            json={"task": "s", "model": "m", "metrics": {"macro_f1": 0.5}, "run_id": OTHER_RUN_ID},
            headers=AUTH,
        )
        assert response.status == 200

    harness.serve(body)
    (result,) = harness.store.task_results(RUN_ID)
    assert (result.task_id, result.metrics) == ("s", {"macro_f1": 0.5})
    assert harness.store.task_results(OTHER_RUN_ID) == []


def test_update_accepts_only_result_columns(harness: Harness) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        await client.post(f"{BASE}/samples", json={"samples": [sample(0)]}, headers=AUTH)
        bad = await client.post(
            f"{BASE}/samples:update",
            json={"updates": [{"sample_id": "s_qa_000000", "run_id": OTHER_RUN_ID}]},
            headers=AUTH,
        )
        assert bad.status == 400
        good = await client.post(
            f"{BASE}/samples:update",
            json={"updates": [{"sample_id": "s_qa_000000", "scores": {"exact_match": 0.25}}]},
            headers=AUTH,
        )
        assert good.status == 200

    harness.serve(body)
    (stored,) = harness.store.iter_samples(RUN_ID)
    assert stored.scores == {"exact_match": 0.25}


def test_health_and_metrics(harness: Harness) -> None:
    harness.metrics.status_patches.inc(3)

    async def body(client: TestClient[Any, Any]) -> None:
        health = await client.get("/healthz")
        assert health.status == 200
        assert await health.json() == {"status": "ok"}
        metrics = await client.get("/metrics")
        assert metrics.status == 200
        assert metrics.headers["Content-Type"].startswith("text/plain")
        text = await metrics.text()
        assert "evalkube_status_patches_total 3.0" in text
        for name in (
            "evalkube_jobs_created_total",
            "evalkube_unit_duration_seconds",
            "# TYPE evalkube_score gauge",
            "# TYPE evalkube_runs gauge",
        ):
            assert name in text

    harness.serve(body)


def test_bad_runner_bodies_are_400s_naming_the_field(harness: Harness) -> None:
    """A task result with a metric that is not a number is refused with the field's path (it
    was a 500 from ``float()``), and the other small bodies answer the same way."""

    async def body(client: TestClient[Any, Any]) -> None:
        cases = [
            (
                "/task-results",
                {"task": "s", "model": "m", "metrics": {"macro_f1": "high"}},
                "metrics.macro_f1: Input should be a valid number",
            ),
            ("/task-results", {"model": "m"}, "task: Field required"),
            (
                "/samples:settle",
                {"task": "s", "model": "m", "status": "maybe"},
                "status: Input should be 'valid' or 'invalid'",
            ),
            (
                "/samples:settle",
                {"task": "s", "model": "m", "status": "valid", "values": {"seq": 1}},
                "values.seq: Extra inputs are not permitted",
            ),
            (
                "/samples:update",
                {"updates": [{"sample_id": "a"}, {"scores": {}}]},
                "updates[1].sample_id: Field required",
            ),
        ]
        for path, sent, message in cases:
            response = await client.post(f"{BASE}{path}", json=sent, headers=AUTH)
            assert response.status == 400, (path, sent)
            error = (await response.json())["error"]["message"]
            assert error.startswith(message), error
            assert "; send {" in error

    harness.serve(body)
    assert harness.store.task_results(RUN_ID) == []


def test_metrics_speak_prometheus_negotiation(harness: Harness) -> None:
    """``/metrics`` is prometheus_client's own handler: a scrape may ask for some families
    (``name[]``) or for OpenMetrics, as Prometheus does."""
    harness.metrics.status_patches.inc(3)

    async def body(client: TestClient[Any, Any]) -> None:
        some = await client.get("/metrics", params={"name[]": "evalkube_status_patches_total"})
        text = await some.text()
        assert "evalkube_status_patches_total 3.0" in text
        assert "evalkube_jobs_created" not in text
        openmetrics = await client.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        assert openmetrics.headers["Content-Type"].startswith("application/openmetrics-text")
        assert (await openmetrics.text()).endswith("# EOF\n")

    harness.serve(body)


def test_samples_view_always_needs_a_token(harness: Harness) -> None:
    """Prompts and outputs are served to the read token, or to a run's own token for that run
    only; never to a caller without one (a work pod of another run, say)."""

    async def body(client: TestClient[Any, Any]) -> None:
        await client.post(f"{BASE}/samples", json={"samples": [sample(0)]}, headers=AUTH)
        assert (await client.get(f"{BASE}/samples")).status == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (await client.get(f"{BASE}/samples", headers=wrong)).status == 401
        other_run = {"Authorization": f"Bearer {OTHER_TOKEN}"}
        assert (await client.get(f"{BASE}/samples", headers=other_run)).status == 401
        page = await (await client.get(f"{BASE}/samples", headers=READ)).json()
        assert len(page["samples"]) == 1
        assert (await client.get(f"{BASE}/samples", headers=AUTH)).status == 200

    harness.serve(body)
    harness.api.read_token = None  # no read token configured: still closed to token-less callers

    async def unconfigured(client: TestClient[Any, Any]) -> None:
        assert (await client.get(f"{BASE}/samples")).status == 401
        assert (await client.get(f"{BASE}/samples", headers=READ)).status == 401
        assert (await client.get(f"{BASE}/samples", headers=AUTH)).status == 200

    harness.serve(unconfigured)


# -- kept answers (a retried Job pays for nothing twice) ---------------------------------------
def test_answers_are_kept_per_run_and_looked_up(harness: Harness) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        answer = {"output_text": "echo", "response_id": "resp_1", "model_calls": {"candidate": 1}}
        kept = await client.post(
            f"{BASE}/answers",
            json={"purpose": "candidate", "answers": [["s_1", answer], ["s_2", {"x": 2}]]},
            headers=AUTH,
        )
        assert await kept.json() == {"recorded": 2}
        lookup = {"purpose": "candidate", "sample_ids": ["s_1", "s_3"]}
        found = await client.post(f"{BASE}/answers:lookup", json=lookup, headers=AUTH)
        assert await found.json() == {"answers": {"s_1": answer}}
        # another run's token reaches its own run only, and finds nothing of this one
        other = {"Authorization": f"Bearer {OTHER_TOKEN}"}
        elsewhere = f"/api/v1/namespaces/{NS}/evalruns/{OTHER_RUN}/answers:lookup"
        assert await (await client.post(elsewhere, json=lookup, headers=other)).json() == {
            "answers": {}
        }

    harness.serve(body)
    assert harness.store.recorded_answers(RUN_ID, "ctx", ["s_1"]) == {}


@pytest.mark.parametrize(
    ("path", "payload", "named"),
    [
        ("/answers", {"purpose": "bribe", "answers": []}, "purpose"),
        ("/answers", {"purpose": "candidate", "answers": [["s_1"]]}, "answers[0]"),
        ("/answers", {"purpose": "candidate", "answers": [], "run_id": "x"}, "run_id"),
        ("/answers:lookup", {"purpose": "ctx", "sample_ids": "s_1"}, "sample_ids"),
        ("/answers:lookup", [], "body"),
    ],
)
def test_bad_answer_bodies_are_400_naming_the_field(
    harness: Harness, path: str, payload: Any, named: str
) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.post(f"{BASE}{path}", json=payload, headers=AUTH)
        assert response.status == 400
        assert (await response.json())["error"]["message"].startswith(named)

    harness.serve(body)


def test_generation_errored_ids_name_the_samples_to_call_again(harness: Harness) -> None:
    failed = {"stage": "generation", "type": "ProviderError", "message": "HTTP 503"}
    harness.store.record_samples(
        [
            SampleRecord(RUN_ID, "s_ok", "qa", "m", 0, "valid"),
            SampleRecord(RUN_ID, "s_failed", "qa", "m", 1, "errored", error=failed),
        ]
    )

    async def body(client: TestClient[Any, Any]) -> None:
        query = {"task": "qa", "model": "m"}
        response = await client.get(f"{BASE}/generation-errored-ids", params=query, headers=AUTH)
        assert await response.json() == {"sample_ids": ["s_failed"]}

    harness.serve(body)


# -- scores for paired comparison and the export stream --------------------------------------
def test_scores_stream_every_sample_keyed_by_row_in_batches(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET .../scores`` is what ``evalkube compare --api`` pairs: every sample of this run
    only, keyed by its dataset row id (else its position), ordered by task, model; read from
    the store a batch at a time (a batch of 2 here, so 5 samples take 3 reads)."""
    monkeypatch.setattr("evalkube.controller.api.STREAM_BATCH", 2)
    harness.store.record_samples(
        [
            SampleRecord(OTHER_RUN_ID, "s_other", "qa", "m", 0, "valid", scores={"em": 1.0}),
            *[
                SampleRecord(
                    RUN_ID,
                    f"s_{task}_{i}",
                    task,
                    "m",
                    i,
                    "valid" if i else "errored",
                    row_id=f"row-{i}" if i % 2 else None,
                    scores={"em": float(i % 2)},
                )
                for task in ("qa", "math")
                for i in range(3)
            ][:5],
        ]
    )

    async def body(client: TestClient[Any, Any]) -> None:
        assert (await client.get(f"{BASE}/scores")).status == 401
        other_run = {"Authorization": f"Bearer {OTHER_TOKEN}"}
        assert (await client.get(f"{BASE}/scores", headers=other_run)).status == 401
        unknown = f"/api/v1/namespaces/{NS}/evalruns/nope/scores"
        assert (await client.get(unknown, headers=READ)).status == 404
        # without a token a reader does not learn whether a run exists
        assert (await client.get(unknown)).status == 401
        for headers in (READ, AUTH):
            response = await client.get(f"{BASE}/scores", headers=headers)
            assert response.status == 200
            assert response.content_type == "application/x-ndjson"
            lines = [json.loads(line) for line in (await response.text()).splitlines()]
            assert [(r["task"], r["key"], r["status"], r["scores"]) for r in lines] == [
                ("math", "#0", "errored", {"em": 0.0}),
                ("math", "row-1", "valid", {"em": 1.0}),
                ("qa", "#0", "errored", {"em": 0.0}),
                ("qa", "row-1", "valid", {"em": 1.0}),
                ("qa", "#2", "valid", {"em": 0.0}),
            ]
            assert {r["model"] for r in lines} == {"m"}

    harness.serve(body)


def test_export_streams_every_sample_across_batches(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("evalkube.controller.api.STREAM_BATCH", 2)

    async def body(client: TestClient[Any, Any]) -> None:
        posted = [sample(i) for i in range(5)]
        await client.post(f"{BASE}/samples", json={"samples": posted}, headers=AUTH)
        response = await client.get(f"{BASE}/samples:export", headers=AUTH)
        assert response.status == 200
        lines = [json.loads(line) for line in (await response.text()).splitlines()]
        assert [r["sample_id"] for r in lines] == [p["sample_id"] for p in posted]
        assert all(r["run_id"] == RUN_ID for r in lines)

    harness.serve(body)


def test_ingest_and_api_are_separate_servers(harness: Harness) -> None:
    """Work pods may reach the ingest port only: it serves no samples view, no metrics; the
    API port serves no runner route."""

    async def main() -> None:
        async with TestClient(TestServer(harness.api.ingest_app)) as ingest:
            assert (await ingest.get(f"{BASE}/samples", headers=READ)).status == 405
            assert (await ingest.get("/metrics")).status == 404
            posted = await ingest.post(
                f"{BASE}/samples", json={"samples": [sample(0)]}, headers=AUTH
            )
            assert posted.status == 200
        async with TestClient(TestServer(harness.api.api_app)) as api:
            posted = await api.post(f"{BASE}/samples", json={"samples": [sample(1)]}, headers=AUTH)
            assert posted.status == 405
            assert (await api.get(f"{BASE}/sample-ids", headers=AUTH)).status == 404
            assert (await api.get("/healthz")).status == 200
            assert (await api.get(f"{BASE}/samples", headers=READ)).status == 200

    asyncio.run(main())
    assert harness.count() == 1


def test_a_replica_that_never_saw_the_run_resolves_it_from_durable_state(
    harness: Harness,
) -> None:
    """A standby replica or a restarted operator accepts a unit's posts: the run and its token
    come from the cluster (the resolver), once, then from the registry."""
    lookups: list[tuple[str, str]] = []
    fresh = RunRegistry()  # this replica knows no run

    async def resolve(namespace: str, name: str) -> RunEntry | None:
        lookups.append((namespace, name))
        if name == RUN:
            return RunEntry(NS, RUN, RUN_ID, "qa", digest(TOKEN))
        if name == "finished":
            return RunEntry(NS, "finished", "team-a.finished.1", "qa", token_digest="")
        return None

    harness.api.registry = fresh
    harness.api.resolve = resolve

    async def body(client: TestClient[Any, Any]) -> None:
        for n in range(2):
            posted = await client.post(
                f"{BASE}/samples", json={"samples": [sample(n)]}, headers=AUTH
            )
            assert posted.status == 200
        wrong = await client.post(
            f"{BASE}/samples", json={"samples": [sample(9)]}, headers={"Authorization": "Bearer x"}
        )
        assert wrong.status == 401
        gone = f"/api/v1/namespaces/{NS}/evalruns/nope/samples"
        assert (await client.post(gone, json={"samples": []}, headers=AUTH)).status == 401
        finished = f"/api/v1/namespaces/{NS}/evalruns/finished/samples"
        assert (await client.post(finished, json={"samples": []}, headers=AUTH)).status == 401

    harness.serve(body)
    assert harness.count() == 2
    assert lookups.count((NS, RUN)) == 1  # remembered after the first lookup
