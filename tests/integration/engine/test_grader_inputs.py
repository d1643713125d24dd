"""What a grader receives: ``sample.output_json``/``output_tools`` and ``item`` built from the row.

Candidates come from a fake Responses API server on loopback (tests/integration/proxy/
fake_upstream.py) that answers with a JSON message and a ``function_call`` item, as OpenAI's
models do; the engine runs in-process with the process sandbox and SQLite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from evalkube.engine import LocalEngine, load_files, resolve_run_spec
from evalkube.sandbox import ProcessBackend
from evalkube.store import ResultStore, SampleRecord
from tests.integration.proxy.fake_upstream import FakeUpstream, Scripted

pytestmark = pytest.mark.timeout(120)

EVALKUBE = str(Path(sys.executable).parent / "evalkube")

ECHO_INPUTS = """
def grade(sample, item):
    return {"scores": {"seen": 1.0}, "judge": {
        "output_json": sample["output_json"],
        "output_tools": sample["output_tools"],
        "reference_answer": item["reference_answer"],
        "target": item["target"],
    }}
"""

RESPONSE = {
    "id": "resp_tool",
    "object": "response",
    "output": [
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"city": "Paris"}',
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": '{"answer": "4"}'}],
        },
    ],
}


def _suite(rows: list[dict[str, Any]], **task: Any) -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "inputs"},
        "spec": {
            "tasks": [
                {
                    "id": "t",
                    "dataset": {"rows": rows},
                    "prompt": "{{ item.question }}",
                    "grader": {"type": "python", "source": ECHO_INPUTS},
                    **task,
                }
            ]
        },
    }


def _run(tmp_path: Path, suite: dict[str, Any], base_url: str) -> list[SampleRecord]:
    suite_file, run_file = tmp_path / "suite.yaml", tmp_path / "run.yaml"
    suite_file.write_text(yaml.safe_dump(suite))
    run_file.write_text(
        yaml.safe_dump(
            {
                "kind": "EvalRun",
                "metadata": {"name": "r"},
                "spec": {
                    "models": ["openai:gpt-4.1-mini"],
                    "providers": {"openai": {"baseURL": base_url}},
                },
            }
        )
    )
    loaded, run = load_files(suite_file, run_file)
    spec = resolve_run_spec(loaded, run, None)
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        summary = LocalEngine(store, ProcessBackend()).start(loaded, spec, run_id="inputs")
        assert summary.phase == "Succeeded"
        return list(store.iter_samples("inputs"))
    finally:
        store.close()


def test_sample_has_output_json_and_output_tools(tmp_path: Path) -> None:
    with FakeUpstream() as upstream:
        upstream.then(Scripted(body=RESPONSE))
        (record,) = _run(tmp_path, _suite([{"question": "2+2?"}]), upstream.base_url)
    assert record.status == "valid"
    assert record.judge["output_json"] == {"answer": "4"}
    assert record.judge["output_tools"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"city": "Paris"}'},
        }
    ]


def test_plain_text_output_has_no_json_and_no_tools(tmp_path: Path) -> None:
    with FakeUpstream() as upstream:
        (record,) = _run(tmp_path, _suite([{"question": "hi"}]), upstream.base_url)
    assert record.output_text == "echo: hi"
    assert record.judge["output_json"] is None
    assert record.judge["output_tools"] == []


def test_a_rows_reference_answer_wins_over_the_target(tmp_path: Path) -> None:
    rows = [
        {"question": "2+2?", "reference_answer": "4"},
        {"question": "3+3?", "reference_answer": "6", "target": "six"},
    ]
    with FakeUpstream() as upstream:
        without_target = _run(tmp_path, _suite(rows), upstream.base_url)
        (tmp_path / "t2").mkdir()
        with_target = _run(
            tmp_path / "t2", _suite(rows, target="{{ item.question }}"), upstream.base_url
        )
    by_q = {r.dataset_row["question"]: r.judge for r in without_target}
    assert by_q["2+2?"]["reference_answer"] == "4"
    assert by_q["2+2?"]["target"] is None
    by_q = {r.dataset_row["question"]: r.judge for r in with_target}
    assert by_q["2+2?"] == {**by_q["2+2?"], "reference_answer": "4", "target": "2+2?"}
    assert by_q["3+3?"]["reference_answer"] == "6"
    assert by_q["3+3?"]["target"] == "six"


@pytest.mark.parametrize(
    ("field", "template", "message"),
    [
        ("prompt", "Grade {{ sample.output_text }}", "`sample` is not available here"),
        ("target", "{{ itme.answer }}", "unknown name(s) `itme`"),
    ],
)
def test_validate_refuses_a_template_naming_an_unknown_namespace(
    tmp_path: Path, field: str, template: str, message: str
) -> None:
    suite = _suite([{"question": "q"}], outputs={"column": "question"})
    suite["spec"]["tasks"][0][field] = template
    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(yaml.safe_dump(suite))
    done = subprocess.run(
        [EVALKUBE, "validate", str(suite_file)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout
    assert f"tasks[t].{field}: " in done.stderr
    assert message in done.stderr
