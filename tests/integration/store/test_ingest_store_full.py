"""The real ingest application over a real SQLite store that fills up: each refused post is a
503 naming the store's error (not aiohttp's anonymous 500), nothing of it is recorded, a
runner's client waits it out, and once there is room every sample is stored exactly once,
a post repeated after it was stored included (ingest is keyed by sample)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from evalkube.store import ResultStore, RunRecord, SampleRecord
from evalkube.store.remote import RemoteStore, sample_to_wire
from evalkube.util import jsonfast
from tests.unit.controller.test_api_off_loop import BASE, NS, RUN, RUN_ID, TOKEN, Probe, served

pytestmark = pytest.mark.timeout(120)


def samples(start: int, count: int) -> list[SampleRecord]:
    return [
        SampleRecord(
            RUN_ID, f"s_{i:06d}", "qa", "m", i, "valid", output_text=f"{i:x}" * 4000,
            scores={"score": float(i % 2)},
        )
        for i in range(start, start + count)
    ]  # fmt: skip


class Disk:
    """Caps the store's file at its current size (SQLite's ``max_page_count``: every write
    that needs a new page fails ``database or disk is full``, as on a full disk)."""

    def __init__(self, store: ResultStore) -> None:
        self.store = store
        self.pages = 0

    def _cap(self, connection: Any, _record: Any) -> None:
        connection.execute(f"PRAGMA max_page_count = {self.pages}")

    def fill(self) -> None:
        with self.store.engine.connect() as conn:
            self.pages = int(conn.exec_driver_sql("PRAGMA page_count").scalar_one())
        event.listen(self.store.engine, "connect", self._cap)
        self.store.engine.dispose()

    def free(self) -> None:
        event.remove(self.store.engine, "connect", self._cap)
        self.store.engine.dispose()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ResultStore]:
    opened = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    opened.create_run(RunRecord(RUN_ID, "qa", "sha256:x", {}, "pod"))
    yield opened
    opened.close()


def test_a_full_store_is_a_named_503_waited_out_and_nothing_is_lost_or_doubled(
    store: ResultStore,
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    disk = Disk(store)
    with served(store, Probe()) as (url, _), httpx.Client(base_url=url) as client:
        remote = RemoteStore(url, NS, RUN, TOKEN, retry_seconds=30)
        try:
            remote.record_samples(samples(0, 50))  # recorded before the disk fills
            disk.fill()
            body = jsonfast.dumps({"samples": [sample_to_wire(s) for s in samples(50, 50)]})
            refused = client.post(f"{BASE}/samples", content=body, headers=auth)
            assert refused.status_code == 503, refused.text
            message = refused.json()["error"]["message"]
            assert message.startswith("the results store is unavailable: ")
            assert "full" in message
            assert sum(1 for _ in store.iter_samples(RUN_ID)) == 50  # nothing of it recorded

            # a runner's post waits while the disk is full, and goes in once there is room
            done = threading.Event()
            errors: list[BaseException] = []

            def post() -> None:
                try:
                    remote.record_samples(samples(50, 50))
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    done.set()

            writer = threading.Thread(target=post)
            writer.start()
            assert not done.wait(2.0), errors  # still waiting, not failed
            disk.free()
            assert done.wait(30), "the post did not go in once the disk had room"
            writer.join()
            assert errors == []
            remote.record_samples(samples(25, 50))  # posted again after it was stored
        finally:
            remote.close()
    stored = list(store.iter_samples(RUN_ID))
    assert sorted(s.sample_id for s in stored) == [f"s_{i:06d}" for i in range(100)]
    assert {s.sample_id: s.scores for s in stored} == {
        f"s_{i:06d}": {"score": float(i % 2)} for i in range(100)
    }
