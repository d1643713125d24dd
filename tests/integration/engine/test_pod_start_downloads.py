"""What a work-unit pod downloads when it starts: its own shard's recorded ids,
never its task x model's other shards'.

``evalkube unit`` as its pod runs it, against the operator's real ingest server on loopback
(with a middleware that counts what each answer holds) and a real SQLite store in which the
run's other shards are already recorded: a retried or resumed pod's download does not grow
with the number of shards, and a shard that was fully recorded is skipped whole.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from evalkube.controller.api import ApiServer
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunEntry, RunRegistry, digest
from evalkube.controller.snapshot import build_snapshot, check_suite
from evalkube.engine.plan import SEQ_STRIDE, sample_id
from evalkube.store import ResultStore, RunRecord, SampleRecord

pytestmark = pytest.mark.timeout(300)

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
NS, NAME, UID = "team-a", "big", "0f1e2d3c-0000-4000-8000-000000000000"
RUN_ID = "team-a.big.0f1e2d3c"
TOKEN = "ingest-token-for-the-test"
SHARD, SHARDS = 50, 20
EXACT = "def grade(sample, item):\n    return float(sample['output_text'] == item['a'])\n"


@contextmanager
def counting_ingest(store: ResultStore) -> Iterator[tuple[str, dict[str, list[Any]]]]:
    """The ingest application on a loopback port; yields its URL and, per route name, the
    JSON answers it gave (a middleware reads each answer's body)."""
    registry = RunRegistry()
    registry.register(RunEntry(NS, NAME, RUN_ID, "qa", digest(TOKEN)))
    api = ApiServer(store, registry, OperatorMetrics())
    answers: dict[str, list[Any]] = defaultdict(list)

    @web.middleware
    async def count(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        if isinstance(response, web.Response) and response.body is not None:
            route = request.path.rsplit("/", 1)[-1]
            answers[route].append(json.loads(bytes(response.body)))  # type: ignore[arg-type]
        return response

    api.ingest_app.middlewares.append(count)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(api.ingest_app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", answers
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def snapshot_file(tmp_path: Path) -> Path:
    rows = [{"q": f"q{i}", "a": str(i), "out": str(i)} for i in range(SHARD * SHARDS)]
    spec = {
        "tasks": [
            {
                "id": "qa",
                "dataset": {"rows": rows},
                "prompt": "{{ item.q }}",
                "outputs": {"column": "out"},
                "grader": {"type": "python", "source": EXACT},
            }
        ]
    }
    check = check_suite(NS, spec, lambda ns, cm, key: None)
    assert check.ok, check.problems
    run = {
        "metadata": {"namespace": NS, "name": NAME, "uid": UID},
        "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"], "shardSize": SHARD},
    }
    path = tmp_path / "snapshot.json"
    snapshot = build_snapshot(run, RUN_ID, "qa", check)
    path.write_text(json.dumps(snapshot.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return path


def recorded(shard: int, errored: bool = False) -> list[SampleRecord]:
    """A shard's samples as its earlier pod stored them (the first one's model call failed)."""
    out = []
    for position in range(SHARD):
        seq = shard * SEQ_STRIDE + position
        record = SampleRecord(
            RUN_ID, sample_id(RUN_ID, "qa", "precomputed", seq), "qa", "precomputed", seq, "valid"
        )
        record.scores = {"score": 1.0}
        if errored and position == 0:
            record.status = "errored"
            record.error = {"stage": "generation", "type": "GenerationError", "message": "x"}
        out.append(record)
    return out


def run_unit(snapshot: Path, unit: str, ingest: str) -> str:
    done = subprocess.run(
        [
            EVALKUBE, "unit", "--snapshot", str(snapshot), "--unit", unit,
            "--ingest-url", ingest, "--sandbox", "process",
        ],
        env={**os.environ, "EVALKUBE_INGEST_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def test_a_pod_downloads_its_own_shards_ids_only(tmp_path: Path) -> None:
    """19 of 20 shards recorded (each with one sample whose model call failed): the last
    shard's pod is told of no recorded id at all, and a retried pod of a recorded shard of
    exactly its 50; both lists would hold every shard's ids (1,000) if the pod asked for its
    task x model's."""
    snapshot = snapshot_file(tmp_path)
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        store.create_run(RunRecord(RUN_ID, "qa", "sha256:x", {}, "pod"))
        for shard in range(SHARDS - 1):
            store.record_samples(recorded(shard, errored=True))
        with counting_ingest(store) as (ingest, answers):
            out = run_unit(snapshot, f"qa.precomputed.{SHARDS - 1:05d}", ingest)
            assert f"{SHARD} samples recorded, 0 already recorded" in out, out
            assert [len(a["sample_ids"]) for a in answers["sample-ids"]] == [0]
            assert [len(a["sample_ids"]) for a in answers["generation-errored-ids"]] == [0]

            answers.clear()
            out = run_unit(snapshot, "qa.precomputed.00007", ingest)
            # the one whose model call failed is made again; the other 49 are skipped
            assert "1 samples recorded, 49 already recorded" in out, out
            [ids] = [a["sample_ids"] for a in answers["sample-ids"]]
            assert sorted(ids) == sorted(r.sample_id for r in recorded(7))
            [errored] = [a["sample_ids"] for a in answers["generation-errored-ids"]]
            assert errored == [recorded(7)[0].sample_id]
        assert sum(1 for _ in store.iter_samples(RUN_ID)) == SHARD * SHARDS
    finally:
        store.close()
