"""What a runner posts is freed when the post returns: httpx's response refers to
its body's stream and back (encode/httpx#3733), which kept every response, its request and
the request's whole body (a sample chunk of up to 16 MB) until a full garbage collection,
rare under the runner's relaxed GC thresholds. With the collector off, no response of the
runner's store client outlives its call. The operator's real ingest server on loopback."""

from __future__ import annotations

import gc
from pathlib import Path

import httpx

from evalkube.store import ResultStore, RunRecord, SampleRecord
from evalkube.store.remote import RemoteStore
from evalkube.util.gctune import relaxed_gc
from tests.integration.engine.test_pod_start_downloads import (
    NAME,
    NS,
    RUN_ID,
    TOKEN,
    counting_ingest,
)


def _responses() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, httpx.Response))


def test_posted_chunks_are_freed_when_their_post_returns(tmp_path: Path) -> None:
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        store.create_run(RunRecord(RUN_ID, "qa", "sha256:x", {}, "pod"))
        with counting_ingest(store) as (url, _), relaxed_gc():
            remote = RemoteStore(url, NS, NAME, TOKEN)
            gc.collect()
            gc.disable()
            try:
                before = _responses()
                for chunk in range(10):
                    records = [
                        SampleRecord(RUN_ID, f"s{chunk}-{i}", "qa", "m", chunk * 100 + i, "valid",
                                     output_text="o" * 20_000)
                        for i in range(100)
                    ]  # fmt: skip
                    remote.record_samples(records)
                    assert remote.recorded_sample_ids(RUN_ID, "qa", "m", (0, 10**9))
                assert _responses() == before
            finally:
                gc.enable()
                remote.close()
        assert sum(1 for _ in store.iter_samples(RUN_ID)) == 1_000
    finally:
        store.close()
