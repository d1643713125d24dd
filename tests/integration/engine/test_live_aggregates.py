"""Aggregates computed while samples stream by equal the ones read back from the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkube.engine import aggregate_results, load_files, resolve_run_spec
from evalkube.local import LocalEngine
from evalkube.sandbox import ProcessBackend
from evalkube.store import ResultStore

from .suites import write_two_task_suite

GRADER = """
def grade(sample, item):
    n = int(item["n"])
    if n % 7 == 0:
        raise ValueError("invalid on purpose")
    return {"scores": {"exact": 1.0 if sample["extracted_output"] == item["target"] else 0.0,
                       "half": 0.5}}
"""


@pytest.mark.timeout(120)
def test_live_aggregates_match_the_store(tmp_path: Path) -> None:
    rows = [{"n": i, "a": str(i % 3), "out": str(i % 4)} for i in range(250)]
    path, run = write_two_task_suite(
        tmp_path, dataset={"rows": rows}, grader=GRADER, shard_size=60, name="live"
    )
    loaded, run_resource = load_files(path, run)
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        summary = LocalEngine(store, ProcessBackend()).start(
            loaded, resolve_run_spec(loaded, run_resource, None)
        )
        from_store = aggregate_results(store, summary.run_id)
    finally:
        store.close()
    live = {(r.task, r.model): r for r in summary.results}
    stored = {(r.task, r.model): r for r in from_store}
    assert live.keys() == stored.keys() == {("one", "precomputed"), ("two", "precomputed")}
    for key, result in live.items():
        assert result.counts == stored[key].counts
        assert result.metrics == pytest.approx(stored[key].metrics)
    counts = live[("one", "precomputed")].counts
    # 250 rows: outputs "3" (i % 4 == 3) miss the extraction; multiples of 7 raise
    assert counts.errored == sum(1 for i in range(250) if i % 4 == 3)
    assert counts.invalid == sum(1 for i in range(250) if i % 4 != 3 and i % 7 == 0)
