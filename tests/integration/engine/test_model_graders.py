"""score_model and label_model graders through the model bridge, against a fake judge.

The judge is a real HTTP server on loopback speaking the Responses API (a subclass of
tests/integration/proxy/fake_upstream.py that answers the strict JSON schema it is asked
for, from what the rendered messages say). Calls go engine -> in-process model bridge
(key injection, ``model: auto`` -> judgeModel, counting) -> fake.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from evalkube.engine import load_files, resolve_run_spec
from evalkube.local import LocalEngine, RunSummary
from evalkube.proxy.bridge import local_model_access
from evalkube.sandbox import ProcessBackend
from evalkube.store import ResultStore, SampleRecord
from tests.integration.proxy.fake_upstream import FakeUpstream, Received

pytestmark = pytest.mark.timeout(120)

KEY = "sk-judge-0123456789abcdef"
ROWS = [
    {"answer": "Paris", "out": "Paris"},
    {"answer": "Rome", "out": "Milan"},
    {"answer": "Oslo", "out": "weird"},
]


class FakeJudge(FakeUpstream):
    """Answers ``{"steps", "result"}``: 8 / ``correct`` when the rendered candidate equals
    the reference, 2 / ``incorrect`` otherwise, and 42 (above the range) for ``weird``."""

    async def _responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            self.received.append(Received(request.path, dict(request.headers), body))
        text = body["input"][-1]["content"]
        found = re.search(r"Answer: (\w+) Reference: (\w+)", text)
        assert found is not None, text
        out, answer = found.groups()
        if body["text"]["format"]["name"] == "score_model":
            result: Any = 42 if out == "weird" else (8 if out == answer else 2)
        else:
            result = "correct" if out == answer else "incorrect"
        answer_text = json.dumps({"steps": [f"compared {out} with {answer}"], "result": result})
        return web.json_response(
            {
                "id": f"resp_{out}_{body['text']['format']['name']}",
                "object": "response",
                "model": body.get("model"),
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": answer_text}],
                    }
                ],
                "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
            }
        )


MESSAGES = [
    {"role": "system", "content": "You grade answers."},
    {"role": "user", "content": "Answer: {{ sample.output_text }} Reference: {{ item.answer }}"},
]
SUITE = {
    "apiVersion": "evalkube.io/v1alpha1",
    "kind": "EvalSuite",
    "metadata": {"name": "judges"},
    "spec": {
        "tasks": [
            {
                "id": "judged",
                "dataset": {"rows": ROWS},
                "outputs": {"column": "out"},
                "graders": [
                    {
                        "type": "score_model",
                        "name": "quality",
                        "input": MESSAGES,
                        "range": [0, 10],
                        "passThreshold": 5,
                        "samplingParams": {"temperature": 0, "max_completions_tokens": 50},
                    },
                    {
                        "type": "label_model",
                        "name": "verdict",
                        "model": "openai:labeler-2",
                        "input": MESSAGES,
                        "labels": ["correct", "incorrect"],
                        "passingLabels": ["correct"],
                    },
                ],
            },
            {
                "id": "similar",
                "dataset": {"rows": ROWS},
                "outputs": {"column": "out"},
                "grader": {
                    "type": "text_similarity",
                    "input": "{{ sample.output_text }}",
                    "reference": "{{ item.answer }}",
                    "evaluationMetric": "cosine",
                    "passThreshold": 0.999,
                },
            },
        ]
    },
}


@pytest.fixture(scope="module")
def outcome(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[RunSummary, list[SampleRecord], list[Received]]:
    root = tmp_path_factory.mktemp("judges")
    suite_file, run_file = root / "suite.yaml", root / "run.yaml"
    suite_file.write_text(yaml.safe_dump(SUITE))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUDGE_KEY", KEY)
    try:
        with FakeJudge() as judge:
            run_file.write_text(
                yaml.safe_dump(
                    {
                        "kind": "EvalRun",
                        "metadata": {"name": "r"},
                        "spec": {
                            "models": ["precomputed"],
                            "judgeModel": "openai:judge-1",
                            "embeddingModel": "openai:embed-3",
                            "providers": {
                                "openai": {"baseURL": judge.base_url, "apiKeyEnv": "JUDGE_KEY"}
                            },
                        },
                    }
                )
            )
            loaded, run = load_files(suite_file, run_file)
            store = ResultStore.open(f"sqlite:///{root / 'results.db'}")
            try:
                engine = LocalEngine(store, ProcessBackend(), bridge_factory=local_model_access)
                summary = engine.start(loaded, resolve_run_spec(loaded, run, None), run_id="j")
                records = sorted(store.iter_samples("j"), key=lambda r: r.seq)
            finally:
                store.close()
            received = list(judge.received)
    finally:
        mp.undo()
    return summary, records, received


def test_scores_and_labels_come_from_the_judge(
    outcome: tuple[RunSummary, list[SampleRecord], list[Received]],
) -> None:
    summary, records, _ = outcome
    assert summary.phase == "Succeeded"
    paris, rome, weird = [r for r in records if r.task_id == "judged"]
    assert paris.status == rome.status == "valid"
    assert paris.scores == {"quality": 8.0, "verdict": 1.0}
    assert rome.scores == {"quality": 2.0, "verdict": 0.0}
    assert paris.judge["quality"]["steps"] == ["compared Paris with Paris"]
    assert paris.judge["verdict"]["result"] == "correct"
    # out of range: clamped into range [0, 10] (OpenAI's score_model), so it passes 5
    assert weird.status == "valid"
    assert weird.scores == {"quality": 10.0, "verdict": 0.0}
    assert weird.judge["quality"]["result"] == 42
    (result,) = [r for r in summary.results if r.task == "judged"]
    assert {k: v.model_dump() for k, v in result.criteria.items()} == {
        "quality": {"passed": 2, "failed": 1},
        "verdict": {"passed": 1, "failed": 2},
    }


def test_calls_go_through_the_bridge_and_are_counted(
    outcome: tuple[RunSummary, list[SampleRecord], list[Received]],
) -> None:
    summary, records, received = outcome
    received = [c for c in received if c.path == "/v1/responses"]
    records = [r for r in records if r.task_id == "judged"]
    assert len(received) == 2 * len(ROWS)
    for call in received:
        assert call.headers["Authorization"] == f"Bearer {KEY}"
        fmt = call.body["text"]["format"]
        assert fmt["type"] == "json_schema"
        assert fmt["strict"] is True
        assert call.body["input"][0] == {"role": "system", "content": "You grade answers."}
    scored = [c.body for c in received if c.body["text"]["format"]["name"] == "score_model"]
    labelled = [c.body for c in received if c.body["text"]["format"]["name"] == "label_model"]
    assert {b["model"] for b in scored} == {"judge-1"}  # auto -> judgeModel
    assert {b["model"] for b in labelled} == {"labeler-2"}
    assert all(b["temperature"] == 0 and b["max_output_tokens"] == 50 for b in scored)
    assert labelled[0]["text"]["format"]["schema"]["properties"]["result"]["enum"] == [
        "correct",
        "incorrect",
    ]
    for record in records:
        assert record.model_calls["judge"] == 2
        assert len(record.model_calls["response_ids"]) == 2
    (result,) = [r for r in summary.results if r.task == "judged"]
    assert result.model_calls["judge"] == 2 * len(ROWS)


def test_cosine_uses_the_runs_embedding_model_through_the_bridge(
    outcome: tuple[RunSummary, list[SampleRecord], list[Received]],
) -> None:
    summary, records, received = outcome
    calls = [c for c in received if c.path == "/v1/embeddings"]
    assert len(calls) == len(ROWS)
    assert {c.body["model"] for c in calls} == {"embed-3"}
    similar = [r for r in records if r.task_id == "similar"]
    for record, row in zip(similar, ROWS, strict=True):
        # the fake embeds a text as [len(text), 1.0]
        a, b = (len(row["out"]), 1.0), (len(row["answer"]), 1.0)
        cosine = (a[0] * b[0] + 1.0) / (math.hypot(*a) * math.hypot(*b))
        assert record.scores == pytest.approx({"score": cosine})
        assert record.model_calls["embedding"] == 1
    (result,) = [r for r in summary.results if r.task == "similar"]
    passed = sum(1 for r in similar if r.scores["score"] >= 0.999)
    assert result.criteria["score"].model_dump() == {"passed": passed, "failed": 3 - passed}


SNEAKY = """
def grade(sample, item, ctx):
    ctx.responses_create(model="auto", input=[{"role": "user", "content": "free call"}])
    return 1.0
"""


def test_a_python_grader_beside_a_model_grader_gets_no_model_access(tmp_path: Path) -> None:
    """The runner makes score_model's calls; a Python grader of the same task that did not ask
    for model access must not share them (its ctx is disabled, the provider sees nothing)."""
    suite = copy.deepcopy(SUITE)
    (task, _) = suite["spec"]["tasks"]
    task["graders"] = [
        task["graders"][0],
        {"type": "python", "name": "sneaky", "source": SNEAKY, "passThreshold": 1},
    ]
    suite["spec"]["tasks"] = [task]
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUDGE_KEY", KEY)
    try:
        with FakeJudge() as judge:
            run = {
                "kind": "EvalRun",
                "metadata": {"name": "r"},
                "spec": {
                    "models": ["precomputed"],
                    "judgeModel": "openai:judge-1",
                    "providers": {"openai": {"baseURL": judge.base_url, "apiKeyEnv": "JUDGE_KEY"}},
                },
            }
            (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
            loaded, spec = load_files(tmp_path / "suite.yaml", tmp_path / "run.yaml")
            store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
            try:
                engine = LocalEngine(store, ProcessBackend(), bridge_factory=local_model_access)
                engine.start(loaded, resolve_run_spec(loaded, spec, None), run_id="s")
                records = sorted(store.iter_samples("s"), key=lambda r: r.seq)
            finally:
                store.close()
            received = list(judge.received)
    finally:
        mp.undo()
    assert len(received) == len(ROWS)  # score_model's calls only
    assert {c.body["text"]["format"]["name"] for c in received} == {"score_model"}
    for record in records[:2]:  # Paris, Rome (the third is out of score_model's range too)
        assert record.status == "invalid"
        assert record.error is not None
        assert record.error["criterion"] == "sneaky"
        assert "model access is disabled" in record.error["message"]
