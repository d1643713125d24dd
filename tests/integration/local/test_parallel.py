"""Shard units on several unit processes (``evalkube run --workers N``).

The same suite run with one process and with two must record the same samples and report
the same aggregates; a failure in a unit process surfaces in the parent with the type a
sequential run raises; and how many processes ``auto`` picks follows the documented rule.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from evalkube.engine import aggregate_results, load_files, resolve_run_spec
from evalkube.engine.unit_context import UnitFailed
from evalkube.local import LocalEngine
from evalkube.local.parallel import MIN_SAMPLES_PER_WORKER, choose_workers
from evalkube.models.errors import ConfigError
from evalkube.sandbox import ProcessBackend
from evalkube.store import ResultStore
from tests.integration.engine.suites import write_two_task_suite

pytestmark = pytest.mark.timeout(180)

GRADER = """
import os

def grade(sample, item):
    n = int(item["n"])
    if n % 11 == 0:
        raise ValueError("invalid on purpose")
    return {"scores": {"exact": 1.0 if sample["extracted_output"] == item["target"] else 0.0,
                       "pid": float(os.getpid())}}
"""


def write_suite(
    folder: Path, rows: int, *, grader: str = GRADER, bad_line: int | None = None
) -> tuple[Path, Path]:
    data = folder / "rows.jsonl"
    with data.open("w") as handle:
        for n in range(rows):
            if n == bad_line:
                handle.write('{"n": oops}\n')
                continue
            handle.write(json.dumps({"n": n, "a": str(n % 3), "out": str(n % 4)}) + "\n")
    return write_two_task_suite(
        folder, dataset={"path": "rows.jsonl"}, grader=grader, shard_size=90, name="parallel"
    )


def run_suite(folder: Path, workers: int, db: str) -> tuple[Any, ResultStore, LocalEngine]:
    suite, run = write_suite(folder, 700)
    loaded, run_resource = load_files(suite, run)
    store = ResultStore.open(f"sqlite:///{folder / db}")
    engine = LocalEngine(store, ProcessBackend(), workers=workers)
    return engine.start(loaded, resolve_run_spec(loaded, run_resource, None)), store, engine


def test_two_unit_processes_record_and_report_what_one_does(tmp_path: Path) -> None:
    one, store_one, _ = run_suite(tmp_path, 1, "one.db")
    two, store_two, engine = run_suite(tmp_path, 2, "two.db")
    try:
        assert engine.last_workers == 2
        # the live aggregates merged from both processes equal the store's
        stored = {(r.task, r.model): r for r in aggregate_results(store_two, two.run_id)}
        for result in two.results:
            assert result.counts == stored[(result.task, result.model)].counts
            assert result.metrics == pytest.approx(stored[(result.task, result.model)].metrics)
        # ... and the sequential run's, except the worker pid the grader reports
        for a, b in zip(one.results, two.results, strict=True):
            assert (a.task, a.model, a.counts) == (b.task, b.model, b.counts)
            assert a.metrics["exact"] == pytest.approx(b.metrics["exact"])
        samples_one = {
            (r.task_id, r.seq, r.status, r.scores.get("exact"))
            for r in store_one.iter_samples(one.run_id)
        }
        samples_two = {
            (r.task_id, r.seq, r.status, r.scores.get("exact"))
            for r in store_two.iter_samples(two.run_id)
        }
        assert samples_one == samples_two
        assert len(samples_two) == 2 * 700
        # graded in more than one process: more than one worker pid shows up (two workers'
        # pids may share a parity, so the pids themselves are compared)
        pids = {r.scores.get("pid") for r in store_two.iter_samples(two.run_id, status="valid")}
        assert len(pids) >= 2, pids
        assert len(store_two.done_units(two.run_id)) == 2 * 8
        assert two.phase == "Succeeded"
    finally:
        store_one.close()
        store_two.close()


def test_a_failing_unit_process_raises_in_the_parent_and_keeps_the_rest(tmp_path: Path) -> None:
    suite, run = write_suite(tmp_path, 700, bad_line=500)
    loaded, run_resource = load_files(suite, run)
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        engine = LocalEngine(store, ProcessBackend(), workers=2)
        with pytest.raises(ConfigError, match=r"rows.jsonl line 501: invalid JSON"):
            engine.start(loaded, resolve_run_spec(loaded, run_resource, None))
        (record,) = store.list_runs()
        kept = list(store.iter_samples(record.run_id))
        assert kept, "samples graded before the failure are kept"
        done = store.done_units(record.run_id)
        assert "one.precomputed.00005" not in done  # the shard holding line 501
        assert {f"one.precomputed.0000{n}" for n in range(3)} <= done
    finally:
        store.close()


def test_a_grader_that_does_not_load_fails_the_run_clearly(tmp_path: Path) -> None:
    grader = (
        "raise RuntimeError('no model weights here')\ndef grade(sample, item):\n    return 1.0\n"
    )
    suite, run = write_suite(tmp_path, 400, grader=grader)
    loaded, run_resource = load_files(suite, run)
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        with pytest.raises(
            UnitFailed, match=r"task 'one' grader \(line 1\): RuntimeError: .*no model weights"
        ):
            LocalEngine(store, ProcessBackend(), workers=2).start(
                loaded, resolve_run_spec(loaded, run_resource, None)
            )
    finally:
        store.close()


def test_auto_uses_a_process_per_core_only_where_it_pays() -> None:
    cores = len(os.sched_getaffinity(0))
    assert choose_workers(None, 5_000, 8) == 1
    assert choose_workers(None, 2 * MIN_SAMPLES_PER_WORKER, 20) == min(cores, 2)
    assert choose_workers(None, 10**7, 1) == 1
    assert choose_workers(None, 10**7, 64) == min(cores, 64)
    assert choose_workers(3, 10, 2) == 2
    assert choose_workers(4, 10, 64) == 4


BATCH_GRADER = """
def grade_batch(samples):
    hits = [s["extracted_output"] == s["target"] for s in samples]
    return {
        "metrics": {"accuracy": sum(hits) / len(hits), "graded": float(len(samples))},
        "samples": [{"sample_id": s["sample_id"], "scores": {"hit": float(h)}}
                    for s, h in zip(samples, hits)],
    }
"""


def with_grader(suite: Path, **grader: Any) -> None:
    data = yaml.safe_load(suite.read_text())
    for task in data["spec"]["tasks"]:
        task["grader"].update(grader)
    suite.write_text(yaml.safe_dump(data))


def test_grade_batch_runs_after_the_shards_of_every_process(tmp_path: Path) -> None:
    suite, run = write_suite(tmp_path, 700)
    with_grader(suite, source=BATCH_GRADER, contract="batch")
    loaded, run_resource = load_files(suite, run)
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        engine = LocalEngine(store, ProcessBackend(), workers=2)
        summary = engine.start(loaded, resolve_run_spec(loaded, run_resource, None))
        assert engine.last_workers == 2
        for result in summary.results:
            assert result.metrics["graded"] == 700.0  # grade_batch saw every shard's samples
            assert result.counts.samples == 700
            assert result.metrics["hit"] == pytest.approx(result.metrics["accuracy"])
        statuses = {r.status for r in store.iter_samples(summary.run_id)}
        assert statuses <= {"valid", "errored"}  # nothing left pending
    finally:
        store.close()


def test_model_backed_suites_stay_in_one_process(tmp_path: Path) -> None:
    # their model bridge (budgets, usage) lives in the parent process
    suite, run = write_suite(tmp_path, 200)
    with_grader(
        suite,
        source="def grade(sample, item, ctx):\n    return 1.0\n",
        contract="model_backed",
    )
    loaded, run_resource = load_files(suite, run)
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        # one task of this suite fails extraction on every sample: keep going regardless
        engine = LocalEngine(store, ProcessBackend(), workers=2, max_error_rate=None)
        summary = engine.start(loaded, resolve_run_spec(loaded, run_resource, None))
        assert engine.last_workers == 1
        assert summary.phase == "Succeeded"
    finally:
        store.close()
