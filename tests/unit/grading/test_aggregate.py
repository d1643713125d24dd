"""Aggregates per task x model: means over all samples (missing = 0), counts, model calls."""

from __future__ import annotations

import pytest

from evalkube.grading import Criterion, GradeOutcome, TaskAggregate, merge_outcomes


def test_mean_is_over_all_samples_with_missing_as_zero() -> None:
    agg = TaskAggregate()
    agg.add("valid", {"exact": 1.0, "f1": 0.5})
    agg.add("valid", {"exact": 1.0})  # no f1: counts 0
    agg.add("invalid", {"exact": 0.0})
    agg.add("errored", None)  # no scores at all: counts 0 for everything
    assert agg.metrics() == {"exact": pytest.approx(0.5), "f1": pytest.approx(0.125)}


def test_counts_by_status() -> None:
    agg = TaskAggregate()
    for status in ["valid", "valid", "invalid", "errored", "errored", "errored", "pending"]:
        agg.add(status, {})
    assert agg.counts() == {"samples": 7, "valid": 2, "invalid": 1, "errored": 3}
    assert agg.pending == 1


def test_invalid_samples_pull_the_mean_down() -> None:
    agg = TaskAggregate()
    agg.add("valid", {"score": 1.0})
    agg.add("invalid", {"score": 0.0})
    assert agg.metrics() == {"score": 0.5}


def test_no_samples_means_no_metrics() -> None:
    agg = TaskAggregate()
    assert agg.metrics() == {}
    assert agg.counts() == {"samples": 0, "valid": 0, "invalid": 0, "errored": 0}
    assert agg.metrics({"macro_f1": 0.3}) == {"macro_f1": 0.3}


def test_batch_metrics_are_added_as_they_are() -> None:
    agg = TaskAggregate()
    agg.add("valid", {"correct": 1.0})
    agg.add("valid", {"correct": 0.0})
    assert agg.metrics({"macro_f1": 0.42}) == {"correct": 0.5, "macro_f1": 0.42}


def test_batch_metric_wins_over_a_per_sample_metric_of_the_same_name() -> None:
    agg = TaskAggregate()
    agg.add("valid", {"f1": 1.0})
    assert agg.metrics({"f1": 0.25}) == {"f1": 0.25}


def test_metrics_are_sorted_by_name() -> None:
    agg = TaskAggregate()
    agg.add("valid", {"zeta": 1.0, "alpha": 1.0, "mid": 1.0})
    assert list(agg.metrics({"beta": 0.0})) == ["alpha", "beta", "mid", "zeta"]


def test_model_calls_are_summed_by_purpose_ignoring_non_counts() -> None:
    agg = TaskAggregate()
    agg.add("valid", {}, {"candidate": 1, "judge": 2, "response_ids": ["r1", "r2"]})
    agg.add("valid", {}, {"judge": 3, "embedding": 1, "flag": True, "odd": 1.5})
    agg.add("errored", None, None)
    assert agg.model_calls == {"candidate": 1, "judge": 5, "embedding": 1}


def test_streaming_many_samples_is_exact() -> None:
    agg = TaskAggregate()
    for i in range(10_000):
        agg.add("valid" if i % 4 else "invalid", {"m": 1.0 if i % 2 else 0.0})
    assert agg.metrics() == {"m": 0.5}
    assert agg.counts() == {"samples": 10_000, "valid": 7_500, "invalid": 2_500, "errored": 0}


def test_expected_metrics_count_zero_when_no_sample_is_valid() -> None:
    # every sample errored (a missing key): the metric is there, at 0, not missing
    agg = TaskAggregate()
    for _ in range(3):
        agg.add("errored", None)
    assert agg.metrics(expected=["score"]) == {"score": 0.0}
    assert agg.metrics() == {}


def test_expected_metrics_do_not_add_names_valid_samples_did_not_use() -> None:
    agg = TaskAggregate()
    agg.add("valid", {"f1": 1.0})
    agg.add("errored", None)
    assert agg.metrics(expected=["score"]) == {"f1": 0.5}


CRITERIA = (Criterion("exact", "exact", 1.0), Criterion("fuzzy", "ratio", 0.8), Criterion("x", "x"))


def test_pass_fail_per_criterion_is_score_at_least_threshold() -> None:
    agg = TaskAggregate()
    agg.add("valid", {"exact": 1.0, "ratio": 0.8}, None, CRITERIA)
    agg.add("valid", {"exact": 0.0, "ratio": 0.79}, None, CRITERIA)
    agg.add("invalid", {"exact": 0.0}, None, CRITERIA)  # a missing score counts 0
    agg.add("errored", {}, None, CRITERIA)  # never graded: neither
    assert agg.criteria_counts(CRITERIA) == {
        "exact": {"passed": 1, "failed": 2},
        "fuzzy": {"passed": 1, "failed": 2},
    }


def test_pass_fail_counts_merge_across_processes() -> None:
    one, two = TaskAggregate(), TaskAggregate()
    one.add("valid", {"exact": 1.0}, None, CRITERIA)
    two.add("valid", {"exact": 0.0}, None, CRITERIA)
    one.merge(two)
    assert one.criteria_counts(CRITERIA)["exact"] == {"passed": 1, "failed": 1}


def test_merge_outcomes_prefixes_secondary_scores_and_keeps_the_first_error() -> None:
    a, b = Criterion("a", "a"), Criterion("b", "bm")
    merged = merge_outcomes(
        [
            (a, GradeOutcome("valid", {"a": 1.0, "extra": 2.0}, {"why": 1})),
            (b, GradeOutcome("invalid", {"bm": 0.0}, None, {"type": "E", "message": "m"})),
        ]
    )
    assert merged.status == "invalid"
    assert merged.scores == {"a": 1.0, "a.extra": 2.0, "bm": 0.0}
    assert merged.judge == {"a": {"why": 1}, "b": None}
    assert merged.error == {"type": "E", "message": "m", "criterion": "b"}
