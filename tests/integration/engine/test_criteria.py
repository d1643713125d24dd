"""Several criteria per task (OpenAI's ``testing_criteria``) over one set of candidates.

The model under test is a fake Responses API server on loopback (tests/integration/proxy/
fake_upstream.py) that counts every call; the engine runs in-process (process sandbox, SQLite).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from rich.console import Console

from evalkube.cli.run_output import run_table
from evalkube.engine import aggregate_results, load_files, resolve_run_spec
from evalkube.engine.runtime import suite_criteria
from evalkube.grading.run_results import expected_metrics
from evalkube.local import LocalEngine, RunSummary
from evalkube.models import EvalRunStatus
from evalkube.sandbox import ProcessBackend
from evalkube.store import ResultStore, SampleRecord
from tests.integration.proxy.fake_upstream import FakeUpstream

pytestmark = pytest.mark.timeout(180)

ROWS = 20

# the fake answers "echo: <prompt>"; the prompt is the row's number
EXACT = """
def grade(sample, item):
    return 1.0 if sample["output_text"] == "echo: " + str(item["n"]) else 0.0
"""
EVEN = """
def grade(sample, item):
    print("even?", item["n"])
    return {"scores": {"half": 0.5}, "judge": {"n": item["n"]}} if item["n"] % 2 else 1.0
"""
BROKEN_ON_SEVEN = """
def grade(sample, item):
    if item["n"] == 7:
        raise ValueError("seven")
    return item["n"] / 20
"""


def _suite() -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "criteria"},
        "spec": {
            "tasks": [
                {
                    "id": "three",
                    "dataset": {"rows": [{"n": i} for i in range(ROWS)]},
                    "prompt": "{{ item.n }}",
                    "graders": [
                        {"type": "python", "name": "exact", "source": EXACT, "passThreshold": 1},
                        {"type": "python", "name": "even", "source": EVEN, "passThreshold": 1},
                        {"type": "python", "name": "late", "source": BROKEN_ON_SEVEN,
                         "metricId": "lateness", "pass_threshold": 0.5},
                    ],
                }
            ]
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSummary, list[SampleRecord], int]:
    root = tmp_path_factory.mktemp("criteria")
    suite_file, run_file = root / "suite.yaml", root / "run.yaml"
    suite_file.write_text(yaml.safe_dump(_suite()))
    with FakeUpstream() as upstream:
        run_file.write_text(
            yaml.safe_dump(
                {
                    "kind": "EvalRun",
                    "metadata": {"name": "r"},
                    "spec": {
                        "models": ["openai:m"],
                        "providers": {"openai": {"baseURL": upstream.base_url}},
                    },
                }
            )
        )
        loaded, run = load_files(suite_file, run_file)
        spec = resolve_run_spec(loaded, run, None)
        store = ResultStore.open(f"sqlite:///{root / 'results.db'}")
        try:
            summary = LocalEngine(store, ProcessBackend()).start(loaded, spec, run_id="crit")
            records = list(store.iter_samples("crit"))
            stored = store.get_run("crit")
            # what the operator computes from the store for the EvalRun status
            criteria_of = suite_criteria(loaded.suite.spec)
            (from_store,) = aggregate_results(
                store,
                "crit",
                None,
                expected_metrics(loaded.suite.spec, criteria_of),
                criteria_of=criteria_of,
            )
        finally:
            store.close()
        calls = len(upstream.received)
    assert stored is not None
    assert stored.summary is not None
    assert stored.summary["results"][0]["criteria"] == summary.to_json()["results"][0]["criteria"]
    assert from_store == summary.results[0]
    return summary, records, calls


def test_three_criteria_share_one_candidate_per_row(
    outcome: tuple[RunSummary, list[SampleRecord], int],
) -> None:
    summary, records, calls = outcome
    assert summary.phase == "Succeeded"
    assert calls == ROWS
    assert len(records) == ROWS
    assert all(r.model_calls.get("candidate") == 1 for r in records)


def test_metrics_are_named_per_criterion(
    outcome: tuple[RunSummary, list[SampleRecord], int],
) -> None:
    summary, records, _ = outcome
    (result,) = summary.results
    assert result.metrics == pytest.approx(
        {
            "exact": 1.0,
            "even": 0.5,
            "even.half": 0.25,
            "lateness": sum(n / 20 for n in range(ROWS) if n != 7) / ROWS,
        }
    )
    three = next(r for r in records if r.dataset_row["n"] == 3)
    assert three.scores == {"exact": 1.0, "even.half": 0.5, "lateness": 0.15}
    assert three.judge == {"exact": None, "even": {"n": 3}, "late": None}
    assert three.stdout == "[even]\neven? 3\n"


def test_an_invalid_criterion_makes_the_sample_invalid_and_names_itself(
    outcome: tuple[RunSummary, list[SampleRecord], int],
) -> None:
    summary, records, _ = outcome
    seven = next(r for r in records if r.dataset_row["n"] == 7)
    assert seven.status == "invalid"
    assert seven.error is not None
    assert seven.error["criterion"] == "late"
    assert seven.error["type"] == "ValueError"
    assert seven.scores["lateness"] == 0.0
    assert seven.scores["exact"] == 1.0
    counts = summary.results[0].counts
    assert (counts.samples, counts.valid, counts.invalid, counts.errored) == (ROWS, ROWS - 1, 1, 0)


def test_pass_and_fail_are_counted_per_criterion(
    outcome: tuple[RunSummary, list[SampleRecord], int],
) -> None:
    summary, _, _ = outcome
    (result,) = summary.results
    late_passed = sum(1 for n in range(ROWS) if n != 7 and n / 20 >= 0.5)
    expected = {
        "exact": {"passed": ROWS, "failed": 0},
        "even": {"passed": ROWS // 2, "failed": ROWS // 2},
        "late": {"passed": late_passed, "failed": ROWS - late_passed},
    }
    assert {k: v.model_dump() for k, v in result.criteria.items()} == expected
    status = EvalRunStatus.model_validate({"results": [result.to_wire()]})
    assert status.to_wire()["results"][0]["criteria"] == expected
    assert json.loads(json.dumps(summary.to_json()))["results"][0]["criteria"] == expected


def test_the_results_table_shows_passed_and_failed_per_criterion(
    outcome: tuple[RunSummary, list[SampleRecord], int],
) -> None:
    console = Console(width=200, record=True)
    console.print(run_table(outcome[0]))
    text = console.export_text()
    assert "passed/failed" in text
    assert "exact: 20/0" in text
    assert "even: 10/10" in text
