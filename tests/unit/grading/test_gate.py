"""The gate's checks (grading/gate.py) on results, and the paired comparison behind its
baseline check (grading/compare.py) on a real SQLite store."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from evalkube.grading.compare import bootstrap_interval, compare_runs
from evalkube.grading.gate import evaluate_gate, gate_message, gate_run
from evalkube.models import GateSpec, SampleCounts, TaskModelResult
from evalkube.store import ResultStore, RunRecord, SampleRecord


def result(task: str, value: float | None, errored: int = 0) -> TaskModelResult:
    metrics = {} if value is None else {"acc": value}
    counts = SampleCounts(samples=10, valid=10 - errored, invalid=0, errored=errored)
    return TaskModelResult(task=task, model="m", metrics=metrics, counts=counts)


def test_thresholds_and_error_rate_name_each_failed_check() -> None:
    gate = GateSpec.model_validate(
        {
            "thresholds": [
                {"metric": "acc", "min": 0.5},
                {"task": "b", "metric": "acc", "min": 0.1},
                {"metric": "f1", "min": 0.1},
            ],
            "maxErrorRate": 0.1,
        }
    )
    status = evaluate_gate(gate, [result("a", 0.7), result("b", None, errored=10)])
    assert not status.passed
    failed = {c.name for c in status.checks if not c.passed}
    assert failed == {"min b/m acc", "min any task f1", "errors b/m"}
    message = gate_message(status)
    assert "metric 'acc' missing" in message
    assert "10/10 errored" in message
    assert evaluate_gate(gate.model_copy(update={"thresholds": []}), [result("a", 0.7)]).passed


def test_a_gate_without_checks_passes_and_says_so() -> None:
    status = evaluate_gate(GateSpec(), [result("a", 0.2)])
    assert status.passed
    assert gate_message(status) == "0 checks passed"


def test_bootstrap_interval_is_seeded_and_covers_the_mean() -> None:
    import numpy as np

    diffs = np.array([1.0, 0.0, 0.0, -1.0, 1.0, 0.0, 1.0, 0.0])
    low, high = bootstrap_interval(diffs, 0.95)
    assert (low, high) == bootstrap_interval(diffs, 0.95)
    assert low < diffs.mean() < high
    assert bootstrap_interval(np.zeros(5), 0.95) == (0.0, 0.0)


def _store_with(tmp_path: Path, runs: dict[str, list[float]]) -> ResultStore:
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    for run_id, scores in runs.items():
        store.create_run(RunRecord(run_id, "suite", "v1", {"models": ["m"]}, "process"))
        store.record_samples(
            [
                SampleRecord(
                    run_id,
                    f"{run_id}-{i}",
                    "qa",
                    "m",
                    i,
                    "valid",
                    row_id=f"r{i}",
                    scores={"acc": value},
                )
                for i, value in enumerate(scores)
            ]
        )
        store.finish_run(run_id, "Succeeded", None)
    return store


def test_a_real_drop_on_many_rows_fails_and_noise_on_few_does_not(tmp_path: Path) -> None:
    rng = random.Random(7)
    before = [1.0 if rng.random() < 0.8 else 0.0 for _ in range(1000)]
    # 10% of the right answers become wrong: a real drop of about 8 points
    after = [0.0 if v and rng.random() < 0.1 else v for v in before]
    few_before = [1.0] * 18 + [0.0] * 2
    few_after = [1.0] * 17 + [0.0] * 3  # one flip on 20 rows: noise
    store = _store_with(
        tmp_path, {"base": before, "new": after, "few-base": few_before, "few-new": few_after}
    )
    try:
        (drop,) = compare_runs(store, "base", "new")
        assert drop.shared == 1000
        assert drop.improved == 0
        assert drop.regressed > 50
        assert drop.delta == pytest.approx(sum(after) / 1000 - sum(before) / 1000)
        assert drop.significant_drop(0.02)
        assert not drop.significant_drop(0.2)  # a large allowance tolerates it
        (noise,) = compare_runs(store, "few-base", "few-new")
        assert noise.delta == pytest.approx(-0.05)
        assert not noise.significant_drop()
        assert noise.flipped == [{"key": "r17", "baseline": 1.0, "score": 0.0}]

        gate = GateSpec.model_validate({"baseline": {"run": "base", "maxRegression": 0.02}})
        status = gate_run(store, gate, "new", [], suite="suite", baseline_id="base")
        assert not status.passed
        assert "dropped" in gate_message(status)
        latest = GateSpec.model_validate({"baseline": {"lastSucceeded": True}})
        status = gate_run(store, latest, "few-new", [], suite="suite")
        assert status.baseline == "few-base"
        assert status.passed
        missing = gate_run(store, gate, "new", [], suite="suite", baseline_id="nope")
        assert not missing.passed
        assert "has no results" in gate_message(missing)
    finally:
        store.close()


def test_baseline_needs_exactly_one_of_run_and_last_succeeded() -> None:
    with pytest.raises(ValueError, match="exactly one of `run`"):
        GateSpec.model_validate({"baseline": {"run": "x", "lastSucceeded": True}})
