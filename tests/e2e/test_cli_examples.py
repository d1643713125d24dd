"""`evalkube` as users run it: a real subprocess on the recipes example, on SQLite and PostgreSQL.

Asserts the exact metrics and counts of every recipe, the debugging view of failed samples,
and exit code 2 with a precise message for each kind of configuration error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from evalkube.store import ResultStore
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.timeout(180)

EVALKUBE = Path(sys.executable).parent / "evalkube"
RECIPES = EXAMPLES / "recipes" / "suite.yaml"

#: task -> (metrics, counts): the exact expected results of examples/recipes.
EXPECTED: dict[str, tuple[dict[str, float], dict[str, int]]] = {
    "exact_match": (
        {"exact_match": 0.6},
        {"samples": 5, "valid": 4, "invalid": 0, "errored": 1},
    ),
    "case_insensitive": (
        {"exact_match": 0.75},
        {"samples": 4, "valid": 4, "invalid": 0, "errored": 0},
    ),
    "numeric_tolerance": (
        {"numeric_match": 0.75, "absolute_error": 0.006},
        {"samples": 4, "valid": 4, "invalid": 0, "errored": 0},
    ),
    "token_f1": (
        {"token_f1": 0.495238},
        {"samples": 3, "valid": 3, "invalid": 0, "errored": 0},
    ),
    "macro_f1": (
        {"macro_f1": 0.655556, "correct": 0.666667},
        {"samples": 6, "valid": 6, "invalid": 0, "errored": 0},
    ),
    "multi_score": (
        {"exact_match": 0.5, "contains_target": 0.75},
        {"samples": 4, "valid": 4, "invalid": 0, "errored": 0},
    ),
    "preprocess_row": (
        {"exact_match": 0.666667},
        {"samples": 3, "valid": 3, "invalid": 0, "errored": 0},
    ),
    "preprocess_batch": (
        {"exact_match": 0.666667},
        {"samples": 3, "valid": 3, "invalid": 0, "errored": 0},
    ),
}


def evalkube(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "TERM": "dumb"}
    env.pop("EVALKUBE_DB", None)
    return subprocess.run(
        [str(EVALKUBE), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class ExampleRun:
    db: str
    output: dict[str, Any]
    process: subprocess.CompletedProcess[str]
    cwd: Path


_RUNS: dict[str, ExampleRun] = {}


def _example_run(
    kind: str, request: pytest.FixtureRequest, factory: pytest.TempPathFactory
) -> ExampleRun:
    if kind not in _RUNS:
        cwd = factory.mktemp(f"cli-{kind}")
        if kind == "sqlite":
            db = f"sqlite:///{cwd / 'results.db'}"
        else:
            db = request.getfixturevalue("postgres_url")
        done = evalkube(
            "run", str(RECIPES), "--sandbox", "process", "--db", db, "--output", "out.json",
            cwd=cwd,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        _RUNS[kind] = ExampleRun(db, json.loads((cwd / "out.json").read_text()), done, cwd)
    return _RUNS[kind]


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def example_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ExampleRun:
    """The recipes example run once on SQLite and once on PostgreSQL."""
    return _example_run(request.param, request, tmp_path_factory)


@pytest.fixture(scope="module")
def sqlite_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ExampleRun:
    """The SQLite run alone, for CLI behaviour that does not depend on the store."""
    return _example_run("sqlite", request, tmp_path_factory)


def test_console_script_exists() -> None:
    assert EVALKUBE.is_file(), "install the project into the venv: make setup"


def test_every_recipe_has_exact_metrics_and_counts(example_run: ExampleRun) -> None:
    results = {r["task"]: r for r in example_run.output["results"]}
    assert list(results) == list(EXPECTED)
    for task, (metrics, counts) in EXPECTED.items():
        result = results[task]
        assert result["model"] == "precomputed"
        assert result["metrics"] == pytest.approx(metrics, abs=1e-6), task
        assert result["counts"] == counts, task
        assert "error" not in result


def test_undeclared_batch_metric_is_dropped_with_a_warning(example_run: ExampleRun) -> None:
    macro = next(r for r in example_run.output["results"] if r["task"] == "macro_f1")
    assert "debug_label_count" not in macro["metrics"]
    assert example_run.output["problems"] == [
        "task 'macro_f1' · precomputed: undeclared batch metrics dropped: ['debug_label_count']"
    ]
    assert "debug_label_count" in example_run.process.stderr


def test_output_file_shape(sqlite_run: ExampleRun) -> None:
    output = sqlite_run.output
    assert output["run_id"].startswith("recipes-")
    assert output["suite"] == "recipes"
    assert output["phase"] == "Succeeded"
    assert output["suite_version"].startswith("sha256:")
    assert output["sandbox"].startswith("process")


def test_the_table_is_printed(sqlite_run: ExampleRun) -> None:
    out = sqlite_run.process.stdout
    assert sqlite_run.output["run_id"] in out
    for task in EXPECTED:
        assert task in out
    assert "exact_match = 0.6000" in out
    assert "macro_f1 = 0.6556" in out


def test_samples_failed_json_shows_the_extraction_miss(example_run: ExampleRun) -> None:
    run_id = example_run.output["run_id"]
    done = evalkube(
        "samples",
        run_id,
        "--status",
        "failed",
        "--json",
        "--db",
        example_run.db,
        cwd=example_run.cwd,
    )
    assert done.returncode == 0, done.stderr
    (view,) = json.loads(done.stdout)
    assert view["task_id"] == "exact_match"
    assert view["status"] == "errored"
    assert view["row_id"] == "q5"
    assert view["prompt"] == "Answer with a number. What is 6 + 1?"
    assert view["target"] == "7"
    assert view["output_text"] == "I am not sure."
    assert view["extracted_output"] is None
    assert view["error"]["stage"] == "extraction"
    assert view["error"]["type"] == "ExtractionMiss"
    assert view["error"]["message"] == "pattern 'answer is (-?\\\\d+)' did not match the output"


def test_samples_filters_and_limit(sqlite_run: ExampleRun) -> None:
    run_id = sqlite_run.output["run_id"]
    done = evalkube(
        "samples", run_id, "--task", "multi_score", "--limit", "3", "--json", "--db", sqlite_run.db,
        cwd=sqlite_run.cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    views = json.loads(done.stdout)
    assert len(views) == 3
    assert {v["task_id"] for v in views} == {"multi_score"}
    assert views[0]["judge"] == {"output": "paris", "target": "paris"}
    assert views[0]["scores"] == {"exact_match": 1.0, "contains_target": 1.0}


def test_samples_human_view(sqlite_run: ExampleRun) -> None:
    run_id = sqlite_run.output["run_id"]
    done = evalkube(
        "samples", run_id, "--status", "errored", "--db", sqlite_run.db, cwd=sqlite_run.cwd
    )
    assert done.returncode == 0, done.stderr
    assert "ExtractionMiss" in done.stdout
    assert "I am not sure." in done.stdout


def test_samples_of_an_unknown_run_is_exit_2(sqlite_run: ExampleRun) -> None:
    done = evalkube("samples", "no-such-run", "--db", sqlite_run.db, cwd=sqlite_run.cwd)
    assert done.returncode == 2
    assert "not in the store" in done.stderr


def test_runs_lists_the_run(sqlite_run: ExampleRun) -> None:
    done = evalkube("runs", "--db", sqlite_run.db, cwd=sqlite_run.cwd)
    assert done.returncode == 0, done.stderr
    assert sqlite_run.output["run_id"] in done.stdout


def test_resuming_a_finished_run_is_a_config_error(sqlite_run: ExampleRun) -> None:
    done = evalkube(
        "run", "--resume", sqlite_run.output["run_id"], "--db", sqlite_run.db, cwd=sqlite_run.cwd
    )
    assert done.returncode == 2
    assert "already succeeded" in done.stderr


# -- configuration errors: exit 2, named precisely, nothing runs -------------------------------

GOOD_TASK = """\
  - id: good
    dataset: {rows: [{a: "1", out: "1"}]}
    target: "{{ item.a }}"
    outputs: {column: out}
    grader: {type: python, source: "def grade(sample, item):\\n    return 1.0\\n"}
"""


def write_suite(directory: Path, tasks: str, files: dict[str, str] | None = None) -> Path:
    for name, text in (files or {}).items():
        (directory / name).write_text(text)
    path = directory / "suite.yaml"
    path.write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalSuite\nmetadata: {name: bad}\nspec:\n"
        "  tasks:\n" + tasks
    )
    return path


def run_config_error(directory: Path, suite: Path) -> str:
    db = directory / "results.db"
    done = evalkube("run", str(suite), "--sandbox", "process", "--db", str(db), cwd=directory)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""  # no table, no scores
    if db.exists():
        store = ResultStore.open(f"sqlite:///{db}")
        try:
            assert store.list_runs() == [], "a run was created for a suite that cannot run"
        finally:
            store.close()
    return " ".join(done.stderr.split())


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, GOOD_TASK + "  - id: broken\n    dataset: {rows: [}\n")
    message = run_config_error(tmp_path, suite)
    assert "YAML error at line 12, column 22" in message
    assert str(suite) in message


def test_unknown_field_is_named(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, GOOD_TASK.replace("target:", "targt:"))
    message = run_config_error(tmp_path, suite)
    assert "spec.tasks[0].targt: unknown field" in message


def test_out_of_range_field_is_named(tmp_path: Path) -> None:
    task = GOOD_TASK.replace("type: python,", "type: python, timeoutSeconds: 0,")
    message = run_config_error(
        tmp_path, write_suite(tmp_path, GOOD_TASK + task.replace("good", "second"))
    )
    assert "spec.tasks[1].grader.timeoutSeconds: must be between 1 and 600 (got 0)" in message


def test_grader_syntax_error_is_reported_before_anything_runs(tmp_path: Path) -> None:
    task = GOOD_TASK.replace("good", "broken").replace(
        'source: "def grade(sample, item):\\n    return 1.0\\n"', "file: broken.py"
    )
    files = {"broken.py": "def grade(sample, item):\n    x = [1, 2\n    return x\n"}
    message = run_config_error(tmp_path, write_suite(tmp_path, GOOD_TASK + task, files))
    assert "task 'broken' grader" in message
    assert "broken.py" in message
    assert "SyntaxError at line 2" in message or "SyntaxError at line 3" in message


def test_missing_grade_function(tmp_path: Path) -> None:
    task = GOOD_TASK.replace("def grade(sample, item)", "def score(sample, item)")
    message = run_config_error(tmp_path, write_suite(tmp_path, task))
    assert "task 'good' grader" in message
    assert "does not define `grade(...)`" in message


def test_missing_grade_batch_function(tmp_path: Path) -> None:
    task = GOOD_TASK.replace("type: python,", "type: python, contract: batch,")
    message = run_config_error(tmp_path, write_suite(tmp_path, task))
    assert "does not define `grade_batch(...)`" in message


def test_missing_grader_file(tmp_path: Path) -> None:
    task = GOOD_TASK.replace(
        'source: "def grade(sample, item):\\n    return 1.0\\n"', "file: nope.py"
    )
    message = run_config_error(tmp_path, write_suite(tmp_path, task))
    assert "tasks[good].grader.file: cannot read 'nope.py'" in message


def test_import_time_error_is_a_config_error(tmp_path: Path) -> None:
    task = GOOD_TASK.replace(
        'source: "def grade(sample, item):\\n    return 1.0\\n"', "file: boom.py"
    )
    files = {
        "boom.py": "import json\nCONFIG = json.loads('{')\ndef grade(sample, item):\n    return 1\n"
    }
    db = tmp_path / "results.db"
    done = evalkube(
        "run",
        str(write_suite(tmp_path, task, files)),
        "--sandbox",
        "process",
        "--db",
        str(db),
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    message = " ".join(done.stderr.split())
    assert "task 'good' grader (boom.py, line 2)" in message
    assert "JSONDecodeError" in message


def test_template_syntax_error_is_a_config_error(tmp_path: Path) -> None:
    task = GOOD_TASK.replace('target: "{{ item.a }}"', 'target: "{{ item.a "')
    message = run_config_error(tmp_path, write_suite(tmp_path, task))
    assert "tasks[good].target: template syntax error on line 1" in message


def test_no_suite_and_no_resume(tmp_path: Path) -> None:
    done = evalkube("run", "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert done.returncode == 2
    assert "give a SUITE file" in done.stderr


@pytest.mark.postgres
def test_config_errors_on_postgresql(tmp_path: Path, postgres_url: str) -> None:
    suite = write_suite(tmp_path, GOOD_TASK.replace("def grade(", "def grade_(", 1))
    done = evalkube("run", str(suite), "--sandbox", "process", "--db", postgres_url, cwd=tmp_path)
    assert done.returncode == 2
    assert "does not define `grade(...)`" in " ".join(done.stderr.split())


def test_user_data_is_never_parsed_as_markup(tmp_path: Path) -> None:
    grader = (
        "def grade(sample, item):\n"
        "    return {'scores': {'[/m]': 1.0}, 'judge': {'why': '[/oops] [bold]'}}\n"
    )
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalSuite\nmetadata: {name: markup}\nspec:\n"
        "  tasks:\n"
        "  - id: t\n"
        "    dataset: {rows: [{out: '[/red] [link=x]'}]}\n"
        "    outputs: {column: out}\n"
        f"    grader: {{type: python, source: {json.dumps(grader)}}}\n"
    )
    db = str(tmp_path / "r.db")
    done = evalkube(
        "run", str(suite), "--sandbox", "process", "--db", db, "-o", "o.json", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "[/m] = 1.0000" in done.stdout
    run_id = json.loads((tmp_path / "o.json").read_text())["run_id"]
    shown = evalkube("samples", run_id, "--db", db, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "[/red] [link=x]" in shown.stdout
    assert "[/oops] [bold]" in shown.stdout


def test_samples_json_is_valid_utf8_with_lone_surrogates(tmp_path: Path) -> None:
    """A grader's judge may hold a lone surrogate: the export stays valid UTF-8 and JSON, and
    decodes back to what the grader returned."""
    (tmp_path / "suite.yaml").write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalSuite\nmetadata: {name: odd}\nspec:\n"
        "  tasks:\n  - id: odd\n    dataset: {rows: [{q: a, out: x}]}\n"
        "    prompt: '{{ item.q }}'\n    outputs: {column: out}\n"
        "    grader:\n      type: python\n      source: |\n"
        "        def grade(sample, item):\n"
        "            return {'scores': {'s': 1.0}, 'judge': {'text': chr(0xD800) + ' é'}}\n"
    )
    db = f"sqlite:///{tmp_path / 'r.db'}"
    ran = evalkube("run", "suite.yaml", "--db", db, "--output", "out.json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads((tmp_path / "out.json").read_text())["run_id"]
    done = subprocess.run(
        [str(EVALKUBE), "samples", run_id, "--json", "--db", db],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode("utf-8")  # strict: raises on invalid UTF-8
    (view,) = json.loads(text)
    assert view["judge"] == {"text": "\ud800 é"}
    human = evalkube("samples", run_id, "--db", db, cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "\\ud800" in human.stdout
