"""The engine end to end in-process: rows -> preprocess -> render -> extract -> grade -> store.

One suite exercises every stage's failure modes; it runs once per module (process sandbox,
SQLite store) and each test inspects what was stored and aggregated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from evalkube.engine import load_files, resolve_run_spec
from evalkube.local import LocalEngine, RunSummary
from evalkube.sandbox import ProcessBackend
from evalkube.store import ResultStore, SampleRecord

pytestmark = pytest.mark.timeout(120)

KINDS_GRADER = """
import math

def grade(sample, item):
    kind = item["kind"]
    if kind == "number":
        return 0.75
    if kind == "int":
        return 1
    if kind == "nan":
        return math.nan
    if kind == "inf":
        return math.inf
    if kind == "-inf":
        return -math.inf
    if kind == "true":
        return True
    if kind == "false":
        return False
    if kind == "str":
        return "1.0"
    if kind == "none":
        return None
    if kind == "list":
        return [1.0]
    if kind == "tuple":
        return (1.0, 0.0)
    if kind == "no_scores":
        return {"judge": {"why": "forgot scores"}}
    if kind == "bad_scores":
        return {"scores": {"a": math.nan, "b": True, "c": "x"}}
    if kind == "mixed_scores":
        return {"scores": {"a": 1, "b": math.inf, "c": 0.5}, "judge": {"ok": [1, 2]}}
    if kind == "huge":
        return 10 ** 400
    if kind == "raise":
        raise ZeroDivisionError("on purpose")
    if kind == "unserializable":
        return object()
    raise AssertionError(kind)
"""

KINDS = [
    "number", "int", "nan", "inf", "-inf", "true", "false", "str", "none", "list", "tuple",
    "no_scores", "bad_scores", "mixed_scores", "huge", "raise", "unserializable",
]  # fmt: skip
VALID = {
    "number": {"m": 0.75},
    "int": {"m": 1.0},
    "mixed_scores": {"a": 1.0, "c": 0.5},
}

TIMEOUT_GRADER = """
import time

def grade(sample, item):
    if item["slow"]:
        time.sleep(30)
    return 1.0
"""

TRANSFORM = """
def transform(row):
    if row.get("explode"):
        raise ValueError("cannot clean row " + row["q"])
    if row.get("not_a_dict"):
        return ["not", "a", "row"]
    row["q"] = row["q"].strip().upper()
    return row
"""

TRANSFORM_BATCH = """
def transform_batch(rows):
    out = [dict(row, tag="kept") for row in rows if not row.get("drop")]
    out.append({"q": "added", "out": "added", "tag": "new"})
    return out
"""

ECHO_GRADER = """
def grade(sample, item):
    return {"scores": {"match": 1.0 if sample["extracted_output"] == item["target"] else 0.0},
            "judge": {"prompt": sample["prompt"], "tag": item.get("tag")}}
"""

BATCH_OK = """
def grade_batch(samples):
    by_out = {s["output_text"]: s for s in samples}
    return {
        "metrics": {"accuracy": 0.5, "undeclared": 9.0},
        "samples": [
            {"sample_id": by_out["a"]["sample_id"], "scores": {"extra": 1.0}},
            {"sample_id": by_out["b"]["sample_id"], "judge": None},
            {"sample_id": by_out["c"]["sample_id"], "judge": {"new": 1},
             "extracted_output": "C!"},
            {"sample_id": by_out["d"]["sample_id"], "extracted_output": None},
            {"sample_id": "s_unknown", "scores": {"extra": 1.0}},
            {"sample_id": by_out["a"]["sample_id"], "scores": {"second": 2.0}},
            {"scores": {"extra": 1.0}},
        ],
    }
"""

PRE_BATCH_SCORES = """
def transform(row):
    return row
"""

BATCH_RAISES = """
def grade_batch(samples):
    raise RuntimeError("batch grader is broken")
"""

BATCH_NONE = """
def grade_batch(samples):
    return None
"""


def rows(*items: dict[str, Any]) -> dict[str, Any]:
    return {"rows": list(items)}


def suite() -> dict[str, Any]:
    grader = {"type": "python"}
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "engine-test"},
        "spec": {
            "tasks": [
                {
                    "id": "kinds",
                    "dataset": rows(*({"kind": k, "out": k} for k in KINDS)),
                    "outputs": {"column": "out"},
                    "grader": {**grader, "source": KINDS_GRADER, "metricId": "m"},
                },
                {
                    "id": "timeout",
                    "dataset": rows(*({"slow": i == 2, "out": str(i)} for i in range(5))),
                    "outputs": {"column": "out"},
                    "grader": {**grader, "source": TIMEOUT_GRADER, "timeoutSeconds": 1},
                },
                {
                    "id": "pre_row",
                    "dataset": rows(
                        {"q": " one ", "out": "ONE"},
                        {"q": "two", "out": "x", "explode": True},
                        {"q": " three", "out": "THREE"},
                        {"q": "four", "out": "x", "not_a_dict": True},
                    ),
                    "preprocess": {"type": "python", "source": TRANSFORM},
                    "prompt": "Q: {{ item.q }}",
                    "target": "{{ item.q }}",
                    "outputs": {"column": "out"},
                    "grader": {**grader, "source": ECHO_GRADER},
                },
                {
                    "id": "pre_batch",
                    "dataset": rows(
                        {"q": "a", "out": "a"},
                        {"q": "b", "out": "b", "drop": True},
                        {"q": "c", "out": "wrong"},
                    ),
                    "preprocess": {
                        "type": "python",
                        "contract": "batch",
                        "source": TRANSFORM_BATCH,
                    },
                    "prompt": "{{ item.q }} ({{ item.tag }})",
                    "target": "{{ item.q }}",
                    "outputs": {"column": "out"},
                    "grader": {**grader, "source": ECHO_GRADER},
                },
                {
                    "id": "render",
                    "dataset": rows(
                        {"question": "fine", "out": "fine"}, {"questoin": "typo", "out": "x"}
                    ),
                    "prompt": "{{ item.question }}",
                    "target": "{{ item.question }}",
                    "outputs": {"column": "out"},
                    "grader": {**grader, "source": ECHO_GRADER},
                },
                {
                    "id": "extract",
                    "dataset": rows(
                        {"a": "4", "out": "The answer is 4."},
                        {"a": "5", "out": "I am not sure."},
                        {"a": "6", "out": "The answer is 6.\n###The answer is 7."},
                    ),
                    "prompt": "q",
                    "target": "{{ item.a }}",
                    "stop": ["###"],
                    "extraction": {"type": "regex", "pattern": r"answer is (\d+)"},
                    "outputs": {"column": "out"},
                    "grader": {**grader, "source": ECHO_GRADER},
                },
                {
                    "id": "batch_ok",
                    "dataset": rows(*({"out": x} for x in "abcd")),
                    "outputs": {"column": "out"},
                    "preprocess": {"type": "python", "source": PRE_BATCH_SCORES},
                    "grader": {**grader, "contract": "batch", "source": BATCH_OK},
                    "metrics": ["accuracy"],
                },
                {
                    "id": "batch_raises",
                    "dataset": rows(*({"out": x} for x in "ab")),
                    "outputs": {"column": "out"},
                    "grader": {
                        **grader,
                        "contract": "batch",
                        "source": BATCH_RAISES,
                        "metricId": "f1",
                    },
                },
                {
                    "id": "batch_none",
                    "dataset": rows({"out": "a"}),
                    "outputs": {"column": "out"},
                    "grader": {**grader, "contract": "batch", "source": BATCH_NONE},
                },
            ]
        },
    }


class Run:
    def __init__(self, summary: RunSummary, store: ResultStore) -> None:
        self.summary = summary
        self.store = store

    def samples(self, task: str) -> list[SampleRecord]:
        return list(self.store.iter_samples(self.summary.run_id, task_id=task))

    def result(self, task: str) -> Any:
        (found,) = [r for r in self.summary.results if r.task == task]
        return found


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("engine")
    path = root / "suite.yaml"
    path.write_text(yaml.safe_dump(suite(), sort_keys=False))
    loaded, run = load_files(path, None)
    spec = resolve_run_spec(loaded, run, None)
    store = ResultStore.open(f"sqlite:///{root / 'results.db'}")
    try:
        summary = LocalEngine(store, ProcessBackend()).start(loaded, spec, run_id="engine-run")
        yield Run(summary, store)
    finally:
        store.close()


def test_run_succeeded_with_every_task(engine_run: Run) -> None:
    assert engine_run.summary.phase == "Succeeded"
    assert [r.task for r in engine_run.summary.results] == [
        t["id"] for t in suite()["spec"]["tasks"]
    ]
    record = engine_run.store.get_run("engine-run")
    assert record is not None
    assert record.phase == "Succeeded"


# -- every return kind through the real worker ------------------------------------------------


def test_each_return_kind(engine_run: Run) -> None:
    samples = {s.dataset_row["kind"]: s for s in engine_run.samples("kinds")}
    assert set(samples) == set(KINDS)
    for kind, record in samples.items():
        if kind in VALID:
            assert record.status == "valid", kind
            assert record.scores == VALID[kind], kind
            assert record.error is None
        else:
            assert record.status == "invalid", kind
            assert record.scores == {"m": 0.0}, kind
            assert record.error is not None
            assert record.error["stage"] == "grading"
            assert isinstance(record.judge, dict)
            assert record.judge["error"]["type"] == record.error["type"], kind
            assert isinstance(record.judge["invalid_payload"], str)
    assert samples["mixed_scores"].judge == {"ok": [1, 2]}
    assert samples["raise"].error["type"] == "ZeroDivisionError"  # type: ignore[index]
    assert samples["raise"].error["message"] == "on purpose"  # type: ignore[index]
    assert "line" in samples["raise"].error["traceback"]  # type: ignore[index]
    assert samples["unserializable"].error["type"] == "UnserializableResult"  # type: ignore[index]
    assert samples["unserializable"].judge["invalid_payload"].startswith("<object object")
    assert samples["true"].judge["invalid_payload"] == "True"
    assert samples["nan"].judge["invalid_payload"] == "nan"
    assert samples["inf"].judge["invalid_payload"] == "inf"
    assert samples["list"].judge["invalid_payload"] == "[1.0]"
    assert samples["tuple"].judge["invalid_payload"] == "[1.0, 0.0]"  # JSON has no tuples


def test_kinds_aggregate(engine_run: Run) -> None:
    result = engine_run.result("kinds")
    n = len(KINDS)
    assert result.counts.model_dump() == {"samples": n, "valid": 3, "invalid": n - 3, "errored": 0}
    assert result.metrics == pytest.approx({"m": 1.75 / n, "a": 1 / n, "c": 0.5 / n})


# -- timeouts ---------------------------------------------------------------------------------


def test_timeout_marks_exactly_that_sample_invalid(engine_run: Run) -> None:
    samples = engine_run.samples("timeout")
    assert [s.status for s in samples] == ["valid", "valid", "invalid", "valid", "valid"]
    slow = samples[2]
    assert slow.dataset_row["slow"] is True
    assert slow.error is not None
    assert (slow.error["stage"], slow.error["type"]) == ("grading", "Timeout")
    assert slow.scores == {"score": 0.0}
    assert engine_run.result("timeout").metrics == {"score": pytest.approx(0.8)}


# -- preprocessors ----------------------------------------------------------------------------


def test_transform_per_row(engine_run: Run) -> None:
    samples = engine_run.samples("pre_row")
    assert [s.seq for s in samples] == [0, 1, 2, 3]
    one, two, three, four = samples
    assert (one.status, one.prompt, one.target, one.scores) == (
        "valid",
        "Q: ONE",
        "ONE",
        {"match": 1.0},
    )
    assert one.dataset_row["q"] == "ONE"  # the preprocessed row is what is stored
    assert three.prompt == "Q: THREE"
    assert two.status == "errored"
    assert two.error is not None
    assert (two.error["stage"], two.error["type"]) == ("preprocess", "ValueError")
    assert two.error["message"] == "cannot clean row two"
    assert two.prompt is None
    assert four.status == "errored"
    assert four.error is not None
    assert (four.error["stage"], four.error["type"]) == ("preprocess", "InvalidPreprocessResult")
    assert "transform returned ['not', 'a', 'row']" in four.error["message"]
    result = engine_run.result("pre_row")
    assert result.counts.model_dump() == {"samples": 4, "valid": 2, "invalid": 0, "errored": 2}
    assert result.metrics == {"match": 0.5}


def test_transform_batch_drops_and_adds_rows(engine_run: Run) -> None:
    samples = engine_run.samples("pre_batch")
    assert [s.prompt for s in samples] == ["a (kept)", "c (kept)", "added (new)"]
    assert [s.seq for s in samples] == [0, 1, 2]
    assert len({s.sample_id for s in samples}) == 3
    assert [s.scores["match"] for s in samples] == [1.0, 0.0, 1.0]
    result = engine_run.result("pre_batch")
    assert result.counts.samples == 3
    assert result.metrics == {"match": pytest.approx(2 / 3)}


# -- rendering and extraction -----------------------------------------------------------------


def test_render_error_is_an_errored_sample_with_a_message(engine_run: Run) -> None:
    fine, broken = engine_run.samples("render")
    assert fine.status == "valid"
    assert broken.status == "errored"
    assert broken.error is not None
    assert (broken.error["stage"], broken.error["type"]) == ("render", "TemplateError")
    assert "'question'" in broken.error["message"]
    assert broken.scores == {}
    result = engine_run.result("render")
    assert result.counts.model_dump() == {"samples": 2, "valid": 1, "invalid": 0, "errored": 1}
    assert result.metrics == {"match": 0.5}


def test_stop_sequences_and_extraction_misses(engine_run: Run) -> None:
    four, miss, six = engine_run.samples("extract")
    assert (four.status, four.extracted_output, four.scores) == ("valid", "4", {"match": 1.0})
    assert miss.status == "errored"
    assert miss.error is not None
    assert (miss.error["stage"], miss.error["type"]) == ("extraction", "ExtractionMiss")
    assert "did not match the output" in miss.error["message"]
    assert miss.output_text == "I am not sure."
    assert miss.extracted_output is None
    assert six.output_text == "The answer is 6.\n"
    assert six.extracted_output == "6"
    assert engine_run.result("extract").metrics == {"match": pytest.approx(2 / 3)}


# -- batch grading ----------------------------------------------------------------------------


def test_batch_updates_are_applied_to_stored_samples(engine_run: Run) -> None:
    a, b, c, d = engine_run.samples("batch_ok")
    assert {s.status for s in (a, b, c, d)} == {"valid"}
    assert a.scores["extra"] == 1.0
    assert (a.judge, a.extracted_output) == (None, "a")
    assert b.judge is None
    assert (c.judge, c.extracted_output) == ({"new": 1}, "C!")
    assert d.extracted_output is None
    assert d.scores == {}


def test_batch_metrics_declared_kept_and_per_sample_means(engine_run: Run) -> None:
    result = engine_run.result("batch_ok")
    assert result.metrics == {"accuracy": 0.5, "extra": 0.25, "second": 0.5}
    assert result.error is None
    assert result.counts.model_dump() == {"samples": 4, "valid": 4, "invalid": 0, "errored": 0}
    problems = engine_run.summary.problems
    assert any("s_unknown" in p for p in problems)
    assert any("samples[6].sample_id is required" in p for p in problems)
    # warnings name their task and model (a suite may have many batch tasks)
    assert "task 'batch_ok' · precomputed: undeclared batch metrics dropped: ['undeclared']" in (
        problems
    )


def test_batch_updates_of_one_sample_merge_their_scores(engine_run: Run) -> None:
    # two updates of sample "a" in one return: scores merge, the second does not erase the first
    a = engine_run.samples("batch_ok")[0]
    assert a.scores == {"extra": 1.0, "second": 2.0}


def test_grade_batch_failure_makes_samples_invalid_and_reports_the_task(engine_run: Run) -> None:
    samples = engine_run.samples("batch_raises")
    assert len(samples) == 2
    for record in samples:
        assert record.status == "invalid"
        assert record.scores == {"f1": 0.0}
        assert record.error is not None
        assert (record.error["stage"], record.error["type"]) == ("batch", "RuntimeError")
        assert record.error["message"] == "batch grader is broken"
        assert record.judge["error"]["type"] == "RuntimeError"
    result = engine_run.result("batch_raises")
    assert result.error == "RuntimeError: batch grader is broken"
    assert result.metrics == {"f1": 0.0}
    assert result.counts.model_dump() == {"samples": 2, "valid": 0, "invalid": 2, "errored": 0}


def test_grade_batch_returning_none(engine_run: Run) -> None:
    (record,) = engine_run.samples("batch_none")
    assert record.status == "invalid"
    assert record.error is not None
    assert record.error["type"] == "InvalidBatchResult"
    assert "grade_batch returned None" in record.error["message"]
    assert record.judge["invalid_payload"] == "None"
    assert engine_run.result("batch_none").error is not None


def test_no_sample_is_left_pending(engine_run: Run) -> None:
    pending = list(engine_run.store.iter_samples("engine-run", status="pending"))
    assert pending == []


def test_aggregates_are_means_over_stored_samples(engine_run: Run) -> None:
    for result in engine_run.summary.results:
        samples = engine_run.samples(result.task)
        assert result.counts.samples == len(samples)
        for name, value in result.metrics.items():
            if name in ("accuracy",):
                continue
            expected = sum(s.scores.get(name, 0.0) for s in samples) / len(samples)
            assert math.isclose(value, expected), (result.task, name)


def test_resuming_a_succeeded_run_is_refused(engine_run: Run) -> None:
    from evalkube.engine import ConfigError

    with pytest.raises(ConfigError, match="already succeeded"):
        LocalEngine(engine_run.store, ProcessBackend()).resume("engine-run")


def test_a_run_that_breaks_midway_ends_failed_with_the_reason(tmp_path: Path) -> None:
    """Every run ends in a terminal phase: a dataset line that does not parse (in the second
    shard) fails the run with that reason, and the first shard's samples are kept."""
    data = tmp_path / "rows.jsonl"
    good = [f'{{"q": "{i}", "out": "{i}"}}' for i in range(4)]
    data.write_text("\n".join([*good[:2], "{not json", *good[2:]]) + "\n")
    (tmp_path / "suite.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "evalkube.io/v1alpha1",
                "kind": "EvalSuite",
                "metadata": {"name": "broken"},
                "spec": {
                    "tasks": [
                        {
                            "id": "qa",
                            "dataset": {"path": "rows.jsonl"},
                            "prompt": "{{ item.q }}",
                            "target": "{{ item.q }}",
                            "outputs": {"column": "out"},
                            "grader": {"type": "python", "source": "def grade(s, i): return 1.0"},
                        }
                    ]
                },
            }
        )
    )
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        loaded, _ = load_files(tmp_path / "suite.yaml", None)
        spec = resolve_run_spec(loaded, None, None).model_copy(update={"shard_size": 2})
        engine = LocalEngine(store, ProcessBackend())
        with pytest.raises(Exception, match=r"rows\.jsonl"):
            engine.start(loaded, spec, run_id="broken-run")
        record = store.get_run("broken-run")
        assert record is not None
        assert record.phase == "Failed"
        assert record.summary is not None
        assert "rows.jsonl" in record.summary["reason"]
        assert [s.row_id for s in store.iter_samples("broken-run")] == ["0", "1"]
    finally:
        store.close()


def test_unknown_run_cannot_be_resumed(tmp_path: Path) -> None:
    from evalkube.engine import ConfigError

    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        with pytest.raises(ConfigError, match="not in the store"):
            LocalEngine(store, ProcessBackend()).resume("nope")
    finally:
        store.close()
