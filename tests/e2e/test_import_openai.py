"""`evalkube import openai` then `evalkube run`: an OpenAI eval export runs end to end.

The export (tests/fixtures/openai_eval_export.json) has the shapes OpenAI's Evals API
returned for an eval and a run; the model is a fake Responses API server on loopback
(tests/integration/proxy/fake_upstream.py) that echoes the prompt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.proxy.fake_upstream import FakeUpstream

pytestmark = pytest.mark.timeout(180)

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
EXPORT = Path(__file__).parent.parent / "fixtures" / "openai_eval_export.json"


def _import(export: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EVALKUBE, "import", "openai", str(export), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_export_imports_and_runs_with_the_same_criteria(tmp_path: Path) -> None:
    done = _import(EXPORT, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "3 items, 3 criteria" in done.stdout
    suite = yaml.safe_load((tmp_path / "suite.yaml").read_text())
    run = yaml.safe_load((tmp_path / "run.yaml").read_text())
    (task,) = suite["spec"]["tasks"]
    assert suite["metadata"]["name"] == "capitals-quiz"
    assert task["prompt"][1] == {"role": "user", "content": "{{ item.question }}"}
    assert [g["name"] for g in task["graders"]] == ["Contains_the_answer", "Short_enough", "fuzzy"]
    assert run["spec"]["models"] == ["openai:gpt-4.1-mini"]
    assert run["spec"]["generation"]["maxOutputTokens"] == 64
    with FakeUpstream() as upstream:
        run["spec"]["providers"]["openai"]["baseURL"] = upstream.base_url
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
        results = tmp_path / "results.json"
        done = subprocess.run(
            [EVALKUBE, "run", str(tmp_path / "suite.yaml"), str(tmp_path / "run.yaml"),
             "--sandbox", "process", "--db", f"sqlite:///{tmp_path / 'r.db'}",
             "--output", str(results), "--quiet"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "OPENAI_API_KEY": "sk-import-test-0123456789"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
        calls = len(upstream.received)
        temperatures = {c.body.get("temperature") for c in upstream.received}
    assert calls == 3  # one candidate per item, shared by the three criteria
    assert temperatures == {0}
    (result,) = json.loads(results.read_text())["results"]
    # the fake echoes the prompt: "Say Paris" contains "Paris", "Say blue" lacks "red"
    assert result["metrics"]["Contains_the_answer"] == pytest.approx(2 / 3)
    assert result["metrics"]["Short_enough"] == 1.0
    assert result["criteria"]["Contains_the_answer"] == {"passed": 2, "failed": 1}
    assert result["criteria"]["Short_enough"] == {"passed": 3, "failed": 0}
    assert result["counts"]["valid"] == 3


def test_items_are_checked_against_the_item_schema(tmp_path: Path) -> None:
    export = json.loads(EXPORT.read_text())
    export["run"]["data_source"]["source"]["content"][1]["item"] = {"question": "Say Rome"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(export))
    done = _import(bad, tmp_path / "out")
    assert done.returncode == 2
    assert "run.data_source.source.content[1].item: 'answer' is a required property" in (
        done.stderr
    )
    assert "item_schema" in done.stderr
    assert not (tmp_path / "out" / "suite.yaml").exists()


def test_a_criterion_without_an_equivalent_is_named(tmp_path: Path) -> None:
    export = json.loads(EXPORT.read_text())
    export["eval"]["testing_criteria"][0]["type"] = "endpoint"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(export))
    done = _import(bad, tmp_path)
    assert done.returncode == 2
    assert "eval.testing_criteria[0].type: 'endpoint' has no evalkube equivalent" in done.stderr


def test_a_jsonl_run_grades_stored_samples_without_a_model(tmp_path: Path) -> None:
    """A `jsonl` data source (stored completions) imports as precomputed outputs: the run
    calls no model and grades the samples as logged."""
    export = json.loads(EXPORT.read_text())
    content = [
        {"item": {"question": "Say Paris", "answer": "Paris"}, "sample": {"output_text": "Paris!"}},
        {"item": {"question": "Say Rome", "answer": "Rome"}, "sample": {"output_text": "Milan"}},
    ]
    export["run"]["data_source"] = {
        "type": "jsonl",
        "source": {"type": "file_content", "content": content},
    }
    source = tmp_path / "logs.json"
    source.write_text(json.dumps(export))
    done = _import(source, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no model is called" in " ".join(done.stdout.split())
    lines = [json.loads(x) for x in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert lines == [{"id": "0", "output_text": "Paris!"}, {"id": "1", "output_text": "Milan"}]
    results = tmp_path / "results.json"
    done = subprocess.run(
        [EVALKUBE, "run", str(tmp_path / "suite.yaml"), str(tmp_path / "run.yaml"),
         "--sandbox", "process", "--db", f"sqlite:///{tmp_path / 'r.db'}",
         "--output", str(results), "--quiet"],
        capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                         if k != "OPENAI_API_KEY"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    (result,) = json.loads(results.read_text())["results"]
    assert result["model"] == "precomputed"
    assert result["criteria"]["Contains_the_answer"] == {"passed": 1, "failed": 1}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: [e], "the export: expected"),
        (lambda e: {**e, "eval": {**e["eval"], "testing_criteria": ["string_check"]}},
         "eval.testing_criteria[0]: expected a criterion object"),
        (lambda e: {**e, "eval": {**e["eval"], "data_source_config": "custom"}},
         "eval.data_source_config: expected an object"),
    ],
)  # fmt: skip
def test_a_malformed_export_exits_2_naming_the_field(
    tmp_path: Path, change: Any, message: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(change(json.loads(EXPORT.read_text()))))
    done = _import(bad, tmp_path / "out")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
