"""What a person reads of a finished run: `run --output-samples`, `runs` (table and JSON).

The recipes example is run once in a real subprocess with the default store (relative to
the working directory), as a new user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evalkube.store import ResultStore, RunRecord, SampleRecord
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.timeout(180)

EVALKUBE = Path(sys.executable).parent / "evalkube"
RECIPES = EXAMPLES / "recipes" / "suite.yaml"


def evalkube(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "TERM": "dumb"}
    env.pop("EVALKUBE_DB", None)
    return subprocess.run(
        [str(EVALKUBE), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=150
    )


@pytest.fixture(scope="module")
def recipes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The working directory of a recipes run (default store) and its ``--output`` JSON."""
    cwd = tmp_path_factory.mktemp("reporting")
    done = evalkube(
        "run", str(RECIPES), "--sandbox", "process", "--output", "out.json", "--output-samples",
        cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return cwd, json.loads((cwd / "out.json").read_text())


def test_output_samples_adds_every_sample_to_the_results(
    recipes: tuple[Path, dict[str, Any]],
) -> None:
    _, output = recipes
    assert output["phase"] == "Succeeded"
    assert output["results"]  # the aggregates are still there
    total = sum(result["counts"]["samples"] for result in output["results"])
    samples = output["samples"]
    assert len(samples) == total
    assert len({s["sample_id"] for s in samples}) == total
    miss = next(s for s in samples if s["row_id"] == "q5" and s["task_id"] == "exact_match")
    assert miss["status"] == "errored"
    assert miss["error"]["type"] == "ExtractionMiss"
    assert miss["output_text"] == "I am not sure."


def test_wrong_reads_the_main_metric_of_each_recipe(
    recipes: tuple[Path, dict[str, Any]],
) -> None:
    """numeric_tolerance scores ``absolute_error = 0`` on a right answer: only its main metric
    (``metricId: numeric_match``) says whether an answer is wrong."""
    cwd, output = recipes
    done = evalkube("samples", output["run_id"], "--status", "wrong", "-f", "jsonl", cwd=cwd)
    assert done.returncode == 0, done.stderr
    views = [json.loads(line) for line in done.stdout.splitlines()]
    numeric = [v for v in views if v["task_id"] == "numeric_tolerance"]
    assert [v["scores"]["numeric_match"] for v in numeric] == [0.0]
    assert ("case_insensitive", "Milan") in {(v["task_id"], v["output_text"]) for v in views}
    assert all(v["status"] == "valid" for v in views)


def test_output_samples_needs_output(tmp_path: Path) -> None:
    done = evalkube("run", str(RECIPES), "--output-samples", cwd=tmp_path)
    assert done.returncode == 2
    assert "--output-samples adds the samples to --output FILE" in done.stderr


def test_runs_shows_scores_counts_duration_phase_and_the_store(
    recipes: tuple[Path, dict[str, Any]],
) -> None:
    cwd, output = recipes
    done = evalkube("runs", cwd=cwd)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    store = cwd / ".evalkube" / "results.db"
    assert f"store: {store}" in out
    assert str(store).startswith("/")
    assert output["run_id"] in out
    assert f"Succeeded · {output['seconds']:.1f} s" in out
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines()]
    # one row per task x model: task, model, counts and its first metric
    assert ["exact_match", "precomputed", "5 · 4 valid · 1 errored", "exact_match = 0.6000"] in [
        row[3:] for row in rows if len(row) == 7
    ]
    numeric = next(i for i, row in enumerate(rows) if row and row[3:4] == ["numeric_tolerance"])
    assert sorted([rows[numeric][6], rows[numeric + 1][6]]) == [
        "absolute_error = 0.0060",
        "numeric_match = 0.7500",
    ]


def test_runs_json(recipes: tuple[Path, dict[str, Any]]) -> None:
    cwd, output = recipes
    done = evalkube("runs", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert listed["store"] == str(cwd / ".evalkube" / "results.db")
    (run,) = listed["runs"]
    assert run["run_id"] == output["run_id"]
    assert run["phase"] == "Succeeded"
    assert run["seconds"] == pytest.approx(output["seconds"], abs=1e-3)
    assert run["created_at"] < run["completed_at"]
    by_task = {r["task"]: r for r in run["results"]}
    for result in output["results"]:
        assert by_task[result["task"]]["metrics"] == result["metrics"]
        assert by_task[result["task"]]["counts"] == result["counts"]


def test_runs_counts_the_samples_of_an_unfinished_run(tmp_path: Path) -> None:
    """A run with no summary yet (running, interrupted) shows what it has recorded."""
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        store.create_run(RunRecord("half-done", "suite", "sha256:0", {}, "process"))
        store.record_samples(
            [
                SampleRecord("half-done", f"s{i}", "qa", "m", i, "errored" if i == 0 else "valid")
                for i in range(4)
            ]
        )
    finally:
        store.close()
    done = evalkube("runs", "--json", "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    assert run["phase"] == "Running"
    assert run["seconds"] is None
    assert run["results"] == [
        {
            "task": "qa",
            "model": "m",
            "metrics": {},
            "counts": {"samples": 4, "valid": 3, "invalid": 0, "errored": 1, "pending": 0},
        }
    ]
    table = evalkube("runs", "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert "Running" in table.stdout
    assert "4 · 3 valid · 1 errored" in table.stdout
