"""Built-in graders in a run: alone, and mixed with a Python grader as criteria of one task.

Precomputed outputs (no model); the engine runs in-process (process sandbox, SQLite). The
expected similarity scores come from rapidfuzz directly.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rapidfuzz import fuzz

from evalkube.engine import load_files, resolve_run_spec
from evalkube.local import LocalEngine, RunSummary
from evalkube.sandbox import ProcessBackend
from evalkube.store import ResultStore, SampleRecord

pytestmark = pytest.mark.timeout(120)

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
ROWS = [
    {"answer": "Paris", "out": "Paris"},
    {"answer": "Paris", "out": "It is paris, I think"},
    {"answer": "Rome", "out": "Milan"},
]
LENGTH = """
def grade(sample, item):
    return len(sample["output_text"]) / 100
"""


def _suite(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    for task in tasks:
        task.setdefault("dataset", {"rows": ROWS})
        task.setdefault("outputs", {"column": "out"})
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "builtins"},
        "spec": {"tasks": tasks},
    }


EQ = {
    "type": "string_check",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "operation": "eq",
}
MULTI = {
    "type": "multi",
    "graders": {
        "fuzzy": {
            "type": "text_similarity",
            "input": "{{ sample.output_text }}",
            "reference": "{{ item.answer }}",
            "evaluation_metric": "fuzzy_match",
        },
        "exact": {**EQ, "name": "ignored"},
    },
    "calculateOutput": "0.5 * fuzzy + 0.5 * exact",
    "passThreshold": 0.75,
}
TASKS = [
    {"id": "alone", "grader": {**EQ, "metricId": "exact"}},
    {"id": "multi", "grader": MULTI},
    {
        "id": "mixed",
        "graders": [
            {**EQ, "name": "contains", "operation": "ilike"},
            {
                "type": "text_similarity",
                "name": "fuzzy",
                "input": "{{ sample.output_text }}",
                "reference": "{{ item.answer }}",
                "evaluationMetric": "fuzzy_match",
                "passThreshold": 0.9,
            },
            {"type": "python", "name": "length", "source": LENGTH},
        ],
    },
]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSummary, list[SampleRecord]]:
    root = tmp_path_factory.mktemp("builtins")
    path = root / "suite.yaml"
    path.write_text(yaml.safe_dump(_suite([dict(t) for t in TASKS])))
    loaded, run = load_files(path, None)
    store = ResultStore.open(f"sqlite:///{root / 'results.db'}")
    try:
        summary = LocalEngine(store, ProcessBackend()).start(
            loaded, resolve_run_spec(loaded, run, None), run_id="b"
        )
        return summary, list(store.iter_samples("b"))
    finally:
        store.close()


def test_a_task_with_only_a_string_check(outcome: tuple[RunSummary, list[SampleRecord]]) -> None:
    summary, records = outcome
    assert summary.phase == "Succeeded"
    alone = sorted((r for r in records if r.task_id == "alone"), key=lambda r: r.seq)
    assert [r.scores for r in alone] == [{"exact": 1.0}, {"exact": 0.0}, {"exact": 0.0}]
    assert alone[0].judge == {"input": "Paris", "reference": "Paris"}
    (result,) = [r for r in summary.results if r.task == "alone"]
    assert result.metrics == pytest.approx({"exact": 1 / 3})
    # a string_check passes on a match (OpenAI's semantics) without a passThreshold
    assert result.criteria["exact"].model_dump() == {"passed": 1, "failed": 2}


def test_built_ins_and_python_as_criteria_of_one_task(
    outcome: tuple[RunSummary, list[SampleRecord]],
) -> None:
    summary, records = outcome
    mixed = sorted((r for r in records if r.task_id == "mixed"), key=lambda r: r.seq)
    fuzzy = [fuzz.WRatio(row["out"], row["answer"]) / 100 for row in ROWS]
    for record, row, expected in zip(mixed, ROWS, fuzzy, strict=True):
        assert record.status == "valid"
        assert record.scores == pytest.approx(
            {
                "contains": 1.0 if row["answer"].lower() in row["out"].lower() else 0.0,
                "fuzzy": expected,
                "length": len(row["out"]) / 100,
            }
        )
    (result,) = [r for r in summary.results if r.task == "mixed"]
    fuzzy_passed = sum(1 for value in fuzzy if value >= 0.9)
    assert {k: v.model_dump() for k, v in result.criteria.items()} == {
        "contains": {"passed": 2, "failed": 1},
        "fuzzy": {"passed": fuzzy_passed, "failed": 3 - fuzzy_passed},
    }


@pytest.mark.parametrize(
    ("grader", "message"),
    [
        (
            {**EQ, "reference": "{{ items.answer }}"},
            "tasks[t].grader.reference: unknown name(s) `items`",
        ),
        (
            {k: v for k, v in EQ.items() if k != "operation"},
            "`operation` is required for a string_check grader",
        ),
        (
            {**EQ, "source": "def grade(s, i): return 1"},
            "`source` is for python graders",
        ),
        (
            {**MULTI, "calculateOutput": "fuzzy.__class__"},
            "tasks[t].grader.calculateOutput: `fuzzy.__class__` is not allowed",
        ),
        (
            {**MULTI, "calculateOutput": "fuzzy + exactt"},
            "unknown name `exactt`; use the graders: exact, fuzzy",
        ),
    ],
)
def test_validate_names_what_is_wrong_with_a_built_in(
    tmp_path: Path, grader: dict[str, Any], message: str
) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(_suite([{"id": "t", "grader": grader}])))
    done = subprocess.run(
        [EVALKUBE, "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout
    assert message in done.stderr


def test_a_multi_grader_combines_its_graders_with_the_formula(
    outcome: tuple[RunSummary, list[SampleRecord]],
) -> None:
    summary, records = outcome
    multi = sorted((r for r in records if r.task_id == "multi"), key=lambda r: r.seq)
    for record, row in zip(multi, ROWS, strict=True):
        fuzzy = fuzz.WRatio(row["out"], row["answer"]) / 100
        exact = 1.0 if row["out"] == row["answer"] else 0.0
        assert record.scores == pytest.approx({"score": 0.5 * fuzzy + 0.5 * exact})
        assert record.judge == {"scores": pytest.approx({"fuzzy": fuzzy, "exact": exact})}
    (result,) = [r for r in summary.results if r.task == "multi"]
    passed = sum(1 for r in multi if r.scores["score"] >= 0.75)
    assert result.criteria["score"].model_dump() == {"passed": passed, "failed": 3 - passed}
