"""Aggregates per task x model: means over all samples (missing = 0), counts, model calls."""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction

import pytest

from evalkube import limits
from evalkube.grading import Criterion, GradeOutcome, TaskAggregate, merge_outcomes
from evalkube.grading.aggregate import cap_metrics


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


def test_aggregation_tracks_a_bounded_number_of_names() -> None:
    aggregate = TaskAggregate()
    for n in range(limits.METRIC_NAMES_TRACKED + 500):
        aggregate.add("valid", {"score": 1.0, f"flood{n}": 1.0})
    assert len(aggregate.sums) == limits.METRIC_NAMES_TRACKED
    assert aggregate.metrics()["score"] == 1.0  # every sample's score counted
    assert aggregate.untracked == 501


def test_a_result_keeps_declared_metrics_then_others_up_to_the_cap() -> None:
    metrics = {f"z{n:04d}": 0.5 for n in range(200)} | {"zz_declared": 1.0}
    kept, omitted = cap_metrics(metrics, ["zz_declared"])
    assert len(kept) == limits.METRICS_PER_RESULT
    assert kept["zz_declared"] == 1.0
    assert "z0000" in kept
    assert "z0199" not in kept
    assert omitted == 201 - limits.METRICS_PER_RESULT


def test_means_are_exact_whatever_the_order_or_the_split() -> None:
    """A mean is the correctly rounded quotient of the exact sum: counting the samples in any
    order, or in parts merged afterwards (units, processes, kept per unit as JSON), gives the
    same float, which naive float sums do not."""
    rng = random.Random(7)
    values = [rng.choice([0.1, 0.2, 0.7, rng.random(), rng.uniform(-1e6, 1e6)]) for _ in range(999)]
    exact_mean = float(sum(Fraction(v) for v in values) / len(values))
    ways = []
    for _ in range(5):
        rng.shuffle(values)
        cut = sorted(rng.sample(range(1, len(values)), 4))
        whole = TaskAggregate()
        for part in (values[a:b] for a, b in zip([0, *cut], [*cut, len(values)], strict=True)):
            piece = TaskAggregate()
            for v in part:
                piece.add("valid", {"m": v})
            whole.merge(TaskAggregate.from_wire(json.loads(json.dumps(piece.to_wire()))))
        ways.append(whole.metrics()["m"])
    assert ways == [exact_mean] * 5
    assert sum(values) / len(values) != exact_mean  # what naive sums give here


def test_sums_beyond_the_largest_float_keep_an_exact_mean() -> None:
    agg = TaskAggregate()
    for _ in range(4):
        agg.add("valid", {"big": 1.5e308, "tiny": 5e-324})
    wire = json.loads(json.dumps(agg.to_wire()))
    back = TaskAggregate.from_wire(wire)
    assert back.metrics() == agg.metrics() == {"big": 1.5e308, "tiny": 5e-324}


def test_non_finite_scores_are_not_summed() -> None:
    """Validation never stores NaN or infinities; a store holding one anyway (written by
    hand) does not poison the mean."""
    agg = TaskAggregate()
    agg.add("valid", {"m": 1.0})
    agg.add("valid", {"m": math.nan})
    agg.add("valid", {"m": math.inf})
    assert agg.metrics() == {"m": pytest.approx(1 / 3)}
