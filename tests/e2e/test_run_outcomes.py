"""How `evalkube run` and `evalkube validate` end: checks before spending, terminal phases,
early stops on errors, `--resume --reload`, and the messages a person reads.

Every run is a real `evalkube` subprocess; the paid provider is faked by a real HTTP server
on loopback speaking the Responses API (tests/integration/proxy/fake_upstream.py).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.proxy.fake_upstream import FakeUpstream, Scripted

pytestmark = [pytest.mark.timeout(120)]

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
ROWS = 60
GRADER = """
def grade(sample, item):
    return 1.0 if sample["output_text"] == "echo: " + item["q"] else 0.0
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as server:
        yield server


def write_suite(
    folder: Path,
    *,
    base_url: str = "http://127.0.0.1:9/v1",
    precomputed: bool = False,
    grader: str = GRADER,
) -> tuple[Path, Path]:
    with (folder / "rows.jsonl").open("w") as handle:
        for n in range(ROWS):
            handle.write(json.dumps({"id": f"r{n}", "q": f"q{n}", "out": f"echo: q{n}"}) + "\n")
    (folder / "grader.py").write_text(grader)
    suite = folder / "suite.yaml"
    suite.write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalSuite\nmetadata: {name: outcomes}\nspec:\n"
        "  tasks:\n"
        "  - id: echo\n"
        "    dataset: {path: rows.jsonl, idField: id}\n"
        "    prompt: '{{ item.q }}'\n"
        + ("    outputs: {column: out}\n" if precomputed else "")
        + "    grader: {type: python, file: grader.py}\n"
    )
    run = folder / "run.yaml"
    models = "precomputed" if precomputed else "'openai:gpt-test'"
    run.write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalRun\nmetadata: {name: outcomes}\nspec:\n"
        f"  models: [{models}]\n"
        f"  providers: {{openai: {{baseURL: '{base_url}', apiKeyEnv: TEST_KEY}}}}\n"
        "  generation: {concurrency: 4, retries: 0}\n"
    )
    return suite, run


def evalkube(
    folder: Path, *args: str, key: str | None = "sk-test-outcomes"
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "250"}
    env.pop("EVALKUBE_DB", None)
    env.pop("TEST_KEY", None)
    if key is not None:
        env["TEST_KEY"] = key
    command = [EVALKUBE, *args]
    if args[0] == "run":
        command += ["--sandbox", "process", "--db", str(folder / "r.db")]
    return subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=100, check=False
    )


def runs(folder: Path) -> list[tuple[str, str, str, str]]:
    db = folder / "r.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT run_id, phase, suite_version, coalesce(summary, '') FROM evalkube_runs"
        ).fetchall()


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# -- pre-flight ------------------------------------------------------------------------------
def test_unset_key_stops_before_any_call_or_record(tmp_path: Path, upstream: FakeUpstream) -> None:
    suite, run = write_suite(tmp_path, base_url=upstream.base_url)
    before = len(upstream.received)
    done = evalkube(tmp_path, "run", str(suite), str(run), key=None)
    assert done.returncode == 2, done.stderr
    assert "providers.openai.apiKeyEnv: the environment variable TEST_KEY is not set" in (
        done.stderr
    )
    assert len(upstream.received) == before  # nothing paid
    assert runs(tmp_path) == []  # nothing recorded: there is nothing to resume


def test_a_model_of_an_undeclared_provider_stops_before_the_run(tmp_path: Path) -> None:
    suite, run = write_suite(tmp_path)
    done = evalkube(tmp_path, "run", str(suite), str(run), "--model", "nowhere:model-1")
    assert done.returncode == 2, done.stderr
    assert "run.spec.providers.nowhere: provider 'nowhere' is not declared" in done.stderr
    assert runs(tmp_path) == []


def test_validate_reads_every_row_and_tries_imports_in_the_sandbox(tmp_path: Path) -> None:
    suite, run = write_suite(tmp_path)
    with (tmp_path / "rows.jsonl").open("a") as handle:
        handle.write('{"id": "broken", "q": }\n')
    done = evalkube(tmp_path, "validate", str(suite), str(run), "--sandbox", "process")
    assert done.returncode == 2
    assert f"{tmp_path / 'rows.jsonl'} line {ROWS + 1}: invalid JSON" in done.stderr

    write_suite(tmp_path, grader="import no_such_module_here\n" + GRADER)
    done = evalkube(tmp_path, "validate", str(suite), str(run), "--sandbox", "process")
    assert done.returncode == 2
    assert "task 'echo' grader (grader.py, line 1): ModuleNotFoundError" in done.stderr
    assert "no_such_module_here" in done.stderr


def test_probe_makes_one_call_per_provider_and_reports_a_wrong_endpoint(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    suite, run = write_suite(tmp_path, base_url=upstream.base_url)
    before = len(upstream.received)
    done = evalkube(tmp_path, "validate", str(suite), str(run), "--sandbox", "process", "--probe")
    assert done.returncode == 0, done.stderr
    assert len(upstream.received) == before + 1
    assert upstream.received[-1].body["model"] == "gpt-test"

    # a provider without /v1/responses (the base URL misses /v1)
    suite, run = write_suite(tmp_path, base_url=upstream.base_url.removesuffix("/v1"))
    done = evalkube(tmp_path, "run", str(suite), str(run), "--probe")
    assert done.returncode == 2
    assert "probe of provider 'openai' (gpt-test, POST /responses)" in done.stderr
    assert "HTTP 404" in done.stderr
    assert runs(tmp_path) == []


# -- early stop ------------------------------------------------------------------------------
def test_all_calls_failing_stops_the_run_fast_failed_with_one_message(tmp_path: Path) -> None:
    with FakeUpstream() as failing:  # a server that has no Responses API
        missing = Scripted(status=404, body={"error": {"message": "no route /v1/responses"}})
        failing.then(*[missing] * ROWS)
        suite, run = write_suite(tmp_path, base_url=failing.base_url)
        done = evalkube(tmp_path, "run", str(suite), str(run))
        calls = len(failing.received)
    assert done.returncode == 4, done.stderr
    assert 20 <= calls < ROWS  # stopped after the first 20 failures (+ the 4 in flight)
    (line,) = error_lines(done.stderr)
    assert "task 'echo' · openai:gpt-test: 20 of the first 20 model calls failed" in line
    assert "HTTP 404: no route /v1/responses" in line
    ((run_id, phase, _, summary),) = runs(tmp_path)
    assert phase == "Failed"
    assert "20 of the first 20 model calls failed" in json.loads(summary)["reason"]
    assert f"evalkube run --resume {run_id}" in done.stderr


JUDGED = """
def grade(sample, item, ctx):
    ctx.responses_create(input="is this right? " + sample["output_text"])
    return 1.0
"""


def test_failing_judge_calls_stop_the_run_and_are_reported_once(tmp_path: Path) -> None:
    with FakeUpstream() as failing:
        missing = Scripted(status=404, body={"error": {"message": "no route /v1/responses"}})
        failing.then(*[missing] * ROWS)
        suite, run = write_suite(tmp_path, base_url=failing.base_url, precomputed=True)
        suite.write_text(
            suite.read_text().replace("type: python,", "type: python, contract: model_backed,")
        )
        run.write_text(
            run.read_text().replace("  generation:", "  judgeModel: openai:judge-1\n  generation:")
        )
        (tmp_path / "grader.py").write_text(JUDGED)
        done = evalkube(tmp_path, "run", str(suite), str(run))
        calls = len(failing.received)
    assert done.returncode == 4, done.stderr
    assert 20 <= calls < ROWS
    assert "20 of the first 20 samples failed" in done.stderr
    failures = [line for line in done.stderr.splitlines() if "HTTP 404" in line]
    # the cause once, then how many more failed that way, then the error: not a line a sample
    assert len(failures) == 3, done.stderr
    assert failures[0].startswith("warning: model call failed: provider openai answered HTTP 404")
    assert failures[1].startswith(f"warning: {calls - 1} more model calls failed the same way")
    assert len(error_lines(done.stderr)) == 1


def test_when_every_sample_errors_the_metric_counts_zero(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    suite, run = write_suite(tmp_path, base_url=upstream.base_url.removesuffix("/v1"))
    out = tmp_path / "out.json"
    done = evalkube(tmp_path, "run", str(suite), str(run), "--keep-going", "-o", str(out))
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert result["counts"] == {"samples": ROWS, "valid": 0, "invalid": 0, "errored": ROWS}
    assert result["metrics"] == {"score": 0.0}  # there, counting 0, not missing


# -- terminal phases, resume and reload ------------------------------------------------------
def test_failed_import_ends_failed_then_resume_reload_takes_the_fixed_grader(
    tmp_path: Path,
) -> None:
    suite, run = write_suite(
        tmp_path, precomputed=True, grader="import no_such_module_here\n" + GRADER
    )
    done = evalkube(tmp_path, "run", str(suite), str(run))
    assert done.returncode == 2
    ((run_id, phase, version, summary),) = runs(tmp_path)
    assert phase == "Failed"
    assert "no_such_module_here" in json.loads(summary)["reason"]
    assert f"evalkube run --resume {run_id} --reload" in done.stderr

    (tmp_path / "grader.py").write_text(GRADER)  # fixed on disk
    done = evalkube(tmp_path, "run", "--resume", run_id)
    assert done.returncode == 2
    # the message names the copy it ran, not the file that is fixed by now
    assert f"the copy of grader.py saved when run {run_id} started" in done.stderr
    assert str(tmp_path / "grader.py") not in done.stderr
    assert f"evalkube run --resume {run_id} --reload" in done.stderr
    assert runs(tmp_path)[0][1] == "Failed"

    out = tmp_path / "out.json"
    done = evalkube(tmp_path, "run", "--resume", run_id, "--reload", "-o", str(out))
    assert done.returncode == 0, done.stderr
    ((_, phase, new_version, _),) = runs(tmp_path)
    assert phase == "Succeeded"
    assert new_version != version
    output = json.loads(out.read_text())
    assert [(r["from"], r["to"]) for r in output["reloads"]] == [(version, new_version)]
    assert output["suite_version"] == new_version
    assert f"suite version changed: {version[:19]} -> {new_version[:19]}" in done.stderr
    assert output["results"][0]["metrics"] == {"score": 1.0}


@pytest.mark.parametrize("damage", ["broken row", "missing file"])
def test_a_dataset_that_breaks_the_run_ends_failed_with_the_reason(
    tmp_path: Path, damage: str
) -> None:
    suite, run = write_suite(tmp_path, precomputed=True)
    if damage == "broken row":
        with (tmp_path / "rows.jsonl").open("a") as handle:
            handle.write('{"id": "broken", "q": }\n')
        reason = f"line {ROWS + 1}: invalid JSON"
    else:
        (tmp_path / "rows.jsonl").unlink()
        reason = f"cannot read {tmp_path / 'rows.jsonl'}"
    done = evalkube(tmp_path, "run", str(suite), str(run))
    assert done.returncode == 2
    ((run_id, phase, _, summary),) = runs(tmp_path)
    assert phase == "Failed"
    assert reason in json.loads(summary)["reason"]
    assert f"run {run_id} is recorded as Failed" in done.stderr


def test_resume_of_an_unknown_run_names_the_store_file(tmp_path: Path) -> None:
    done = evalkube(tmp_path, "run", "--resume", "no-such-run")
    assert done.returncode == 2
    assert f"run 'no-such-run' is not in the store {tmp_path / 'r.db'}" in done.stderr
