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

from evalkube.engine import load_files, resolve_run_spec
from evalkube.local import LocalEngine
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


def _run(
    tmp_path: Path,
    suite: dict[str, Any],
    base_url: str | None,
    generation: dict[str, Any] | None = None,
    api: str = "responses",
) -> list[SampleRecord]:
    suite_file, run_file = tmp_path / "suite.yaml", tmp_path / "run.yaml"
    suite_file.write_text(yaml.safe_dump(suite))
    spec: dict[str, Any] = {"models": ["precomputed"]}
    if base_url is not None:
        spec = {
            "models": ["openai:gpt-4.1-mini"],
            "providers": {"openai": {"baseURL": base_url, "api": api}},
            "generation": generation or {},
        }
    run_file.write_text(
        yaml.safe_dump({"kind": "EvalRun", "metadata": {"name": "r"}, "spec": spec})
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


OPENAI_INPUTS = """
def grade(sample, item):
    return {"scores": {"seen": 1.0}, "judge": {
        "sample": sample,
        "item": item,
        "reference": item.get("reference_answer", item["answer"]),
    }}
"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a city up",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "strict": True,
        },
    }
]
GENERATION = {
    "temperature": 0.3,
    "maxOutputTokens": 99,
    "topP": 0.8,
    "seed": 42,
    "reasoningEffort": "low",
    "tools": TOOLS,
    "toolChoice": {"type": "function", "function": {"name": "lookup"}},
    "responseFormat": {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
    },
}


def _openai_suite(rows: list[dict[str, Any]]) -> dict[str, Any]:
    suite = _suite(rows, graderInputs="openai")
    suite["spec"]["tasks"][0]["grader"]["source"] = OPENAI_INPUTS
    return suite


def test_an_openai_task_gets_the_item_exactly_and_openais_sample(tmp_path: Path) -> None:
    """Imported tasks: `item` is the data source item (no convenience keys, so a grader's
    `item.get("reference_answer", item["answer"])` falls back) and `sample` has OpenAI's
    fields; `output_json` only because the run asked for structured output."""
    rows = [{"question": "2+2?", "answer": "4"}]
    with FakeUpstream() as upstream:
        upstream.then(Scripted(body=RESPONSE))
        (record,) = _run(tmp_path, _openai_suite(rows), upstream.base_url, GENERATION)
    assert record.status == "valid", record.error
    assert record.judge["item"] == {"question": "2+2?", "answer": "4"}
    assert record.judge["reference"] == "4"
    sample = record.judge["sample"]
    assert sorted(sample) == ["choices", "output_json", "output_text", "output_tools"]
    assert sample["output_json"] == {"answer": "4"}
    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"city": "Paris"}'},
    }
    assert sample["output_tools"] == [tool_call]
    assert sample["choices"] == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": '{"answer": "4"}',
                "tool_calls": [tool_call],
            },
            "finish_reason": "tool_calls",
        }
    ]


def test_an_openai_sample_has_no_output_json_without_structured_output(tmp_path: Path) -> None:
    rows = [{"question": "2+2?", "answer": "4"}]
    with FakeUpstream() as upstream:
        upstream.then(Scripted(body=RESPONSE))
        (record,) = _run(tmp_path, _openai_suite(rows), upstream.base_url)
    assert sorted(record.judge["sample"]) == ["choices", "output_text", "output_tools"]


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_every_generation_parameter_reaches_the_provider(tmp_path: Path, api: str) -> None:
    """tools, tool choice, seed, top_p, response format and reasoning effort, in the
    shape of the provider's API."""
    with FakeUpstream() as upstream:
        _run(tmp_path, _suite([{"question": "q"}]), upstream.base_url, GENERATION, api=api)
        (call,) = upstream.received
    body = call.body
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.3, 0.8, 42)
    if api == "responses":
        assert call.path == "/v1/responses"
        assert body["max_output_tokens"] == 99
        assert body["reasoning"] == {"effort": "low"}
        assert body["tools"] == [{"type": "function", **TOOLS[0]["function"]}]
        assert body["tool_choice"] == {"type": "function", "name": "lookup"}
        assert body["text"] == {
            "format": {
                "type": "json_schema",
                "name": "answer",
                "schema": {"type": "object"},
                "strict": True,
            }
        }
    else:
        assert call.path == "/v1/chat/completions"
        assert body["max_tokens"] == 99
        assert body["reasoning_effort"] == "low"
        assert body["tools"] == TOOLS
        assert body["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
        assert body["response_format"] == GENERATION["responseFormat"]


def test_an_explicit_null_extracted_output_reaches_the_grader_as_none(tmp_path: Path) -> None:
    """A precomputed line's `"extracted_output": null` means the extraction found no answer:
    the grader gets None, not the output text."""
    (tmp_path / "outputs.jsonl").write_text(
        '{"id": "0", "output_text": "I think 4", "extracted_output": null}\n'
        '{"id": "1", "output_text": "6", "extracted_output": "6"}\n'
        '{"id": "2", "output_text": "8"}\n'
    )
    grader = (
        "def grade(sample, item):\n"
        "    return {'scores': {'seen': 1.0}, 'judge': {'x': sample['extracted_output']}}\n"
    )
    suite = _suite([{"question": q} for q in ("a", "b", "c")], outputs={"path": "outputs.jsonl"})
    suite["spec"]["tasks"][0]["grader"]["source"] = grader
    records = sorted(_run(tmp_path, suite, None), key=lambda r: r.seq)
    assert [r.judge["x"] for r in records] == [None, "6", "8"]
    assert [r.extracted_output for r in records] == [None, "6", "8"]


def _validate(tmp_path: Path, suite: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(yaml.safe_dump(suite))
    return subprocess.run(
        [EVALKUBE, "validate", str(suite_file)], capture_output=True, text=True, timeout=60
    )


def test_validate_refuses_a_template_naming_a_field_no_row_has(tmp_path: Path) -> None:
    """Such a run would end 0 with every sample invalid: validate names the template, the
    field and the first row without it."""
    suite = _suite(
        [{"question": "q", "answer": "a"}, {"question": "r"}], outputs={"column": "question"}
    )
    suite["spec"]["tasks"][0]["grader"] = {
        "type": "string_check",
        "input": "{{ sample.output_text }}",
        "reference": "{{ item.answer }}",
        "operation": "eq",
    }
    done = _validate(tmp_path, suite)
    assert done.returncode == 2, done.stdout
    assert "tasks[t].grader.reference: `item.answer` is not in row 1 of the dataset" in done.stderr
    guarded = "{{ item.answer | default('none') }} {{ item.target }}"  # target: a convenience key
    suite["spec"]["tasks"][0]["grader"]["reference"] = guarded
    done = _validate(tmp_path, suite)
    assert done.returncode == 0, done.stderr
