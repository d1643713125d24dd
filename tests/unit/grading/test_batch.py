"""docs/graders.md, the batch contract: what ``grade_batch`` may return, and every update case."""

from __future__ import annotations

import math
from typing import Any

import pytest

from evalkube import limits
from evalkube.grading import validate_batch_return

IDS = ["s_a", "s_b", "s_c"]


def check(value: Any, declared: list[str] | None = None, ids: list[str] = IDS) -> Any:
    return validate_batch_return(value, declared_metrics=declared, sample_ids=ids)


# -- metrics ------------------------------------------------------------------------------------


def test_metrics_only() -> None:
    outcome = check({"metrics": {"macro_f1": 0.5, "n": 3}})
    assert outcome.valid
    assert outcome.metrics == {"macro_f1": 0.5, "n": 3.0}
    assert all(type(v) is float for v in outcome.metrics.values())
    assert outcome.updates == []
    assert outcome.problems == []
    assert outcome.dropped_metrics == []


def test_undeclared_metrics_are_dropped_when_metrics_are_declared() -> None:
    outcome = check({"metrics": {"macro_f1": 0.5, "debug_count": 3.0}}, declared=["macro_f1"])
    assert outcome.valid
    assert outcome.metrics == {"macro_f1": 0.5}
    assert outcome.dropped_metrics == ["debug_count"]


def test_all_metrics_kept_when_none_declared() -> None:
    outcome = check({"metrics": {"a": 1.0, "b": 2.0}}, declared=None)
    assert outcome.metrics == {"a": 1.0, "b": 2.0}
    assert outcome.dropped_metrics == []


def test_declared_but_missing_metric_is_not_invented() -> None:
    outcome = check({"metrics": {"a": 1.0}}, declared=["a", "b"])
    assert outcome.metrics == {"a": 1.0}


@pytest.mark.parametrize(
    "bad", [float("nan"), math.inf, -math.inf, True, False, "0.5", None, [0.5], {"v": 1}]
)
def test_non_finite_metrics_are_reported_not_kept(bad: Any) -> None:
    outcome = check({"metrics": {"good": 1.0, "bad": bad}})
    assert outcome.valid
    assert outcome.metrics == {"good": 1.0}
    assert len(outcome.problems) == 1
    assert "'bad'" in outcome.problems[0]
    assert "not a finite number" in outcome.problems[0]


def test_non_finite_undeclared_metric_is_a_problem_not_a_drop() -> None:
    outcome = check({"metrics": {"a": 1.0, "junk": math.nan}}, declared=["a"])
    assert outcome.dropped_metrics == []
    assert len(outcome.problems) == 1


def test_metrics_must_be_an_object() -> None:
    outcome = check({"metrics": [0.5]})
    assert not outcome.valid
    assert outcome.error is not None
    assert outcome.error["type"] == "InvalidBatchResult"
    assert "metrics" in outcome.error["message"]
    assert outcome.error["invalid_payload"] == "{'metrics': [0.5]}"


# -- the return value itself --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind"),
    [(None, "None"), (0.5, "float"), ([], "list"), ("metrics", "str"), (True, "bool")],
)
def test_non_dict_return_fails_the_batch(value: Any, kind: str) -> None:
    outcome = check(value)
    assert not outcome.valid
    assert outcome.error is not None
    assert f"returned {kind}" in outcome.error["message"]
    assert outcome.error["invalid_payload"] == repr(value)
    assert outcome.metrics == {}
    assert outcome.updates == []


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"metrics": {}},
        {"metrics": {"a": math.nan}},
        {"samples": []},
        {"metrics": {}, "samples": None},
    ],
)
def test_nothing_usable_fails_the_batch(value: Any) -> None:
    outcome = check(value)
    assert not outcome.valid
    assert outcome.error is not None
    assert "no finite metric and no sample update" in outcome.error["message"]


def test_only_dropped_metrics_fails_the_batch() -> None:
    outcome = check({"metrics": {"debug": 1.0}}, declared=["macro_f1"])
    assert not outcome.valid


def test_samples_must_be_a_list() -> None:
    outcome = check({"metrics": {"a": 1.0}, "samples": {"sample_id": "s_a"}})
    assert not outcome.valid
    assert outcome.error is not None
    assert "`samples` must be a list" in outcome.error["message"]


def test_error_payload_repr_is_capped() -> None:
    outcome = check({"metrics": "x" * 100_000})
    assert outcome.error is not None
    assert len(outcome.error["invalid_payload"]) < 2_100


# -- sample updates -----------------------------------------------------------------------------


def test_updates_only_is_valid() -> None:
    outcome = check({"samples": [{"sample_id": "s_a", "scores": {"correct": 1}}]})
    assert outcome.valid
    assert outcome.metrics == {}
    assert [(u.sample_id, u.scores) for u in outcome.updates] == [("s_a", {"correct": 1.0})]


def test_scores_are_filtered_and_bad_ones_reported() -> None:
    outcome = check(
        {
            "metrics": {"m": 1.0},
            "samples": [
                {"sample_id": "s_a", "scores": {"ok": 0.5, "nan": math.nan, "flag": True}},
            ],
        }
    )
    (update,) = outcome.updates
    assert update.scores == {"ok": 0.5}
    assert sorted(outcome.problems) == [
        "samples[0].scores.flag is not a finite number",
        "samples[0].scores.nan is not a finite number",
    ]


def test_scores_must_be_an_object() -> None:
    outcome = check({"metrics": {"m": 1.0}, "samples": [{"sample_id": "s_a", "scores": [1]}]})
    (update,) = outcome.updates
    assert update.scores == {}
    assert outcome.problems == ["samples[0].scores must be an object"]


@pytest.mark.parametrize("raw", [{}, {"scores": {"x": 1}}, {"sample_id": ""}, {"sample_id": 3}])
def test_sample_id_is_required(raw: dict[str, Any]) -> None:
    outcome = check({"metrics": {"m": 1.0}, "samples": [raw]})
    assert outcome.valid
    assert outcome.updates == []
    assert outcome.problems == ["samples[0].sample_id is required"]


def test_non_object_update_is_reported() -> None:
    outcome = check({"metrics": {"m": 1.0}, "samples": ["s_a", None]})
    assert outcome.updates == []
    assert outcome.problems == ["samples[0] is not an object", "samples[1] is not an object"]


def test_unknown_sample_ids_are_reported_not_crashing() -> None:
    outcome = check(
        {
            "metrics": {"m": 1.0},
            "samples": [
                {"sample_id": "s_a", "scores": {"x": 1.0}},
                {"sample_id": "s_nope", "scores": {"x": 1.0}},
                {"sample_id": "s_c", "scores": {"x": 0.0}},
            ],
        }
    )
    assert outcome.valid
    assert [u.sample_id for u in outcome.updates] == ["s_a", "s_c"]
    assert len(outcome.problems) == 1
    assert "samples[1].sample_id 's_nope'" in outcome.problems[0]
    assert "not a sample of this task" in outcome.problems[0]


def test_unknown_ids_only_fail_without_metrics() -> None:
    outcome = check({"samples": [{"sample_id": "other", "scores": {"x": 1.0}}]})
    assert not outcome.valid


def test_judge_replaces() -> None:
    (update,) = check({"samples": [{"sample_id": "s_a", "judge": {"new": 1}}]}).updates
    assert update.sets_judge
    assert update.judge == {"new": 1}
    assert not update.sets_extracted_output


def test_judge_null_clears() -> None:
    (update,) = check({"samples": [{"sample_id": "s_a", "judge": None}]}).updates
    assert update.sets_judge
    assert update.judge is None


def test_judge_absent_is_untouched() -> None:
    (update,) = check({"samples": [{"sample_id": "s_a", "scores": {"x": 1}}]}).updates
    assert not update.sets_judge
    assert not update.sets_extracted_output


def test_extracted_output_replaced() -> None:
    (update,) = check({"samples": [{"sample_id": "s_b", "extracted_output": "neutral"}]}).updates
    assert update.sets_extracted_output
    assert update.extracted_output == "neutral"


def test_extracted_output_null_allowed() -> None:
    (update,) = check({"samples": [{"sample_id": "s_b", "extracted_output": None}]}).updates
    assert update.sets_extracted_output
    assert update.extracted_output is None


@pytest.mark.parametrize("bad", [3, 1.5, ["a"], {"a": 1}, True])
def test_non_string_extracted_output_is_reported(bad: Any) -> None:
    outcome = check(
        {"metrics": {"m": 1}, "samples": [{"sample_id": "s_b", "extracted_output": bad}]}
    )
    (update,) = outcome.updates
    assert not update.sets_extracted_output
    assert outcome.problems == ["samples[0].extracted_output must be a string or null"]


def test_every_field_at_once() -> None:
    outcome = check(
        {
            "metrics": {"macro_f1": 0.6, "debug": 2.0},
            "samples": [
                {
                    "sample_id": "s_a",
                    "scores": {"correct": 1.0},
                    "judge": {"label": "pos"},
                    "extracted_output": "positive",
                },
                {"sample_id": "s_b", "judge": None, "extracted_output": None},
            ],
        },
        declared=["macro_f1"],
    )
    assert outcome.valid
    assert outcome.metrics == {"macro_f1": 0.6}
    assert outcome.dropped_metrics == ["debug"]
    a, b = outcome.updates
    assert (a.scores, a.judge, a.extracted_output) == (
        {"correct": 1.0},
        {"label": "pos"},
        "positive",
    )
    assert (b.scores, b.judge, b.extracted_output) == ({}, None, None)
    assert b.sets_judge
    assert b.sets_extracted_output
    assert outcome.problems == []


def test_undeclared_batch_metrics_and_update_scores_are_capped() -> None:
    many = {f"m{n}": 1.0 for n in range(limits.SCORE_NAMES_PER_SAMPLE + 10)}
    outcome = check({"metrics": many, "samples": [{"sample_id": "s_a", "scores": many}]})
    assert len(outcome.metrics) == limits.SCORE_NAMES_PER_SAMPLE
    assert outcome.updates == []  # the update with too many names is refused whole
    assert any("10 metrics dropped" in p for p in outcome.problems)
    assert any("samples[0]" in p and "`metrics`" in p for p in outcome.problems)
    long_name = {"n" * (limits.SCORE_NAME_CHARS + 1): 1.0, "ok": 1.0}
    assert check({"metrics": long_name}).metrics == {"ok": 1.0}
