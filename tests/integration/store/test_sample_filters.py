"""Sample filters and paged reads of the store, on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import pytest

from evalkube.store import ResultStore, RunRecord, SampleRecord
from evalkube.store.filters import SampleFilter

RUN = "run-f"


def seed(store: ResultStore) -> None:
    store.create_run(RunRecord(RUN, "s", "sha256:0", {}, "process"))
    store.record_samples(
        [
            SampleRecord(RUN, "right", "qa", "m1", 0, "valid", target="Paris",
                         output_text="It is Paris.", scores={"exact": 1.0, "f1": 1.0}),
            SampleRecord(RUN, "wrong", "qa", "m1", 1, "valid", target="Rome",
                         output_text="It is Milan.", scores={"exact": 0.0, "f1": 0.4}),
            SampleRecord(RUN, "half", "qa", "m2", 0, "valid", target="Oslo",
                         output_text="oslo 100%_sure", scores={"exact": 0.5, "f1": 0.5}),
            SampleRecord(RUN, "bad", "math", "m1", 0, "invalid", target="7",
                         output_text="seven", scores={"exact": 0.0}),
            SampleRecord(RUN, "boom", "math", "m2", 1, "errored", target="8",
                         output_text="8", error={"stage": "grading", "type": "KeyError",
                         "message": "'answer'", "traceback": "Traceback\n  line 3\nKeyError"}),
        ]
    )  # fmt: skip


def selected(store: ResultStore, **options: object) -> list[str]:
    where = SampleFilter.parse(**options)  # type: ignore[arg-type]
    return sorted(r.sample_id for r in store.iter_pages(RUN, where, page_size=2))


def test_status_wrong_is_valid_with_a_zero_score(store: ResultStore) -> None:
    seed(store)
    assert selected(store, status="wrong") == ["wrong"]
    assert selected(store, status="failed") == ["bad", "boom"]
    assert selected(store, status="valid") == ["half", "right", "wrong"]


def test_score_range_per_metric(store: ResultStore) -> None:
    seed(store)
    assert selected(store, min_score=["f1=0.45"]) == ["half", "right"]
    assert selected(store, min_score=["f1=0.45"], max_score=["f1=0.9"]) == ["half"]
    assert selected(store, max_score=["exact=0"]) == ["bad", "wrong"]
    # a sample without the metric is never in its range
    assert selected(store, min_score=["f1=0"]) == ["half", "right", "wrong"]
    assert selected(store, min_score=["missing=-1"]) == []


def test_text_search_in_output_target_and_error(store: ResultStore) -> None:
    seed(store)
    assert selected(store, search="milan") == ["wrong"]  # output, any case
    assert selected(store, search="ROME") == ["wrong"]  # target
    assert selected(store, search="line 3") == ["boom"]  # traceback
    assert selected(store, search="keyerror") == ["boom"]  # error type
    # LIKE wildcards are matched literally
    assert selected(store, search="100%_") == ["half"]
    assert selected(store, search="%") == ["half"]


def test_filters_combine_with_task_and_model(store: ResultStore) -> None:
    seed(store)
    assert selected(store, task="qa", model="m1") == ["right", "wrong"]
    assert selected(store, task="math", status="errored", search="answer") == ["boom"]


def test_iter_pages_reads_every_sample_in_order(store: ResultStore) -> None:
    store.create_run(RunRecord(RUN, "s", "sha256:0", {}, "process"))
    store.record_samples(
        [
            SampleRecord(RUN, f"s{i:05d}", "t", "m", i, "valid", scores={"x": 1.0})
            for i in range(2345)
        ]
    )
    seen = [r.seq for r in store.iter_pages(RUN, page_size=1000)]
    assert seen == list(range(2345))


def test_score_names_and_status_counts(store: ResultStore) -> None:
    seed(store)
    assert store.score_names(RUN) == ["exact", "f1"]
    assert store.score_names(RUN, limit=1) == ["exact"]  # the first, in order
    assert store.status_counts(RUN) == {
        ("qa", "m1"): {"valid": 2},
        ("qa", "m2"): {"valid": 1},
        ("math", "m1"): {"invalid": 1},
        ("math", "m2"): {"errored": 1},
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"status": "broken"}, "--status must be one of failed, valid, wrong"),
        ({"min_score": ["0.5"]}, "--min-score takes METRIC=VALUE"),
        ({"max_score": ["f1=high"]}, "--max-score: 'high' is not a number"),
        ({"max_score": ["f1=nan"]}, "NaN"),
    ],
)
def test_bad_filters_name_the_option(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SampleFilter.parse(**options)  # type: ignore[arg-type]


def test_search_survives_nul_characters_in_untrusted_text(store: ResultStore) -> None:
    """Model output may hold NUL (stored as ``\\u0000`` in the JSON column), which
    PostgreSQL's jsonb refuses: one such sample must not break every search of the run."""
    store.create_run(RunRecord(RUN, "s", "sha256:0", {}, "process"))
    store.record_samples(
        [
            SampleRecord(RUN, "nul", "t", "m", 0, "valid", output_text="a\x00b needle",
                         scores={"x": 0.0}),
            SampleRecord(RUN, "plain", "t", "m", 1, "valid", output_text="needle \\u0000",
                         scores={"x": 1.0}),
            SampleRecord(RUN, "other", "t", "m", 2, "valid", output_text="hay", scores={"x": 1.0}),
        ]
    )  # fmt: skip
    assert selected(store, search="needle") == ["nul", "plain"]
    assert selected(store, search="b needle") == ["nul"]


def test_wrong_looks_at_each_tasks_main_metric_first(store: ResultStore) -> None:
    """``absolute_error = 0`` is a perfect answer: ``wrong`` reads the grader's ``metricId``
    when the sample has it, and any score only when it does not."""
    spec = {
        "suite": {
            "spec": {
                "tasks": [
                    {"id": "num", "grader": {"metricId": "numeric_match"}},
                    {"id": "plain", "grader": {}},  # metricId defaults to "score"
                ]
            }
        }
    }
    store.create_run(RunRecord(RUN, "s", "sha256:0", spec, "process"))
    store.record_samples(
        [
            SampleRecord(RUN, "num-right", "num", "m", 0, "valid",
                         scores={"numeric_match": 1.0, "absolute_error": 0.0}),
            SampleRecord(RUN, "num-wrong", "num", "m", 1, "valid",
                         scores={"numeric_match": 0.0, "absolute_error": 0.5}),
            SampleRecord(RUN, "num-no-main", "num", "m", 2, "valid", scores={"other": 0.0}),
            SampleRecord(RUN, "plain-wrong", "plain", "m", 0, "valid", scores={"score": 0.0}),
            SampleRecord(RUN, "plain-right", "plain", "m", 1, "valid",
                         scores={"score": 1.0, "penalty": 0.0}),
            SampleRecord(RUN, "unknown-task", "gone", "m", 0, "valid", scores={"x": 0.0}),
        ]
    )  # fmt: skip
    where = SampleFilter.parse(status="wrong").for_run(store.get_run(RUN).spec)  # type: ignore[union-attr]
    assert sorted(r.sample_id for r in store.iter_pages(RUN, where)) == [
        "num-no-main", "num-wrong", "plain-wrong", "unknown-task",
    ]  # fmt: skip
