"""OpenAI's graders scored by `evalkube run` exactly as the golden file says.

tests/fixtures/openai_golden.json holds cases (an OpenAI grader config, a sample, an item ->
the expected score and pass), each expected value taken from OpenAI's graders guide or
computed by the reference implementation it names. Each case is imported as OpenAI exported
it (an eval with the one criterion, a `jsonl` run grading the one stored sample) and all run
in one `evalkube run`; model graders ask a fake OpenAI server on loopback, which answers
each case's `judge_answer` (and embeds a text as [len(text), 1.0]).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from evalkube.local.openai_import import import_openai
from tests.cluster.ctrlplane import wait_for
from tests.integration.proxy.fake_upstream import FakeUpstream, Received
from tests.support.ports import accepts, free_port

pytestmark = pytest.mark.timeout(600)

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
GOLDEN_FILE = Path(__file__).parents[1] / "fixtures" / "openai_golden.json"
GOLDEN = json.loads(GOLDEN_FILE.read_text())
PROVIDER = str(Path(__file__).parents[1] / "support" / "golden_provider.py")
CASES: list[dict[str, Any]] = GOLDEN["cases"]
KEY = "sk-golden-0123456789abcdef"
_CASE = re.compile(r"case (\S+):")


class GoldenJudge(FakeUpstream):
    """Answers each model-graded case with its `judge_answer` (found by the case id its
    prompt names)."""

    async def _responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            self.received.append(Received(request.path, dict(request.headers), body))
        found = _CASE.search(body["input"][-1]["content"])
        assert found is not None, body
        answer = {c["id"]: c.get("judge_answer") for c in CASES}[found.group(1)]
        text = answer if isinstance(answer, str) else json.dumps(answer)
        message = {"type": "message", "role": "assistant",
                   "content": [{"type": "output_text", "text": text}]}  # fmt: skip
        return web.json_response({"id": f"resp_{found.group(1)}", "object": "response",
                                  "output": [message]})  # fmt: skip


def task_id(case: dict[str, Any]) -> str:
    return str(case["id"]).lower()


def golden_suite(root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """One task per case, each imported from an OpenAI export of it."""
    tasks = []
    judge_models: set[str] = set()
    (root / "outputs").mkdir(parents=True, exist_ok=True)
    for case in CASES:
        line = {"item": case["item"], "sample": case["sample"]}
        export = {
            "eval": {"name": case["id"], "testing_criteria": [case["grader"]]},
            "run": {"data_source": {"type": "jsonl",
                                    "source": {"type": "file_content", "content": [line]}}},
        }  # fmt: skip
        imported = import_openai(export)
        (task,) = imported.suite.to_wire()["spec"]["tasks"]
        task["id"] = task_id(case)
        task["outputs"] = {"path": f"outputs/{task['id']}.jsonl"}
        assert imported.outputs is not None
        (root / task["outputs"]["path"]).write_text(
            "".join(json.dumps(o) + "\n" for o in imported.outputs)
        )
        tasks.append(task)
        judge_models.update(g["model"] for g in task["graders"] if g.get("model"))
    suite = {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalSuite",
             "metadata": {"name": "openai-golden"}, "spec": {"tasks": tasks}}  # fmt: skip
    run = {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalRun",
           "metadata": {"name": "openai-golden"},
           "spec": {"models": ["precomputed"], "judgeModel": sorted(judge_models)[0],
                    "embeddingModel": "openai:text-embedding-3-large",
                    "providers": {"openai": {"baseURL": "http://127.0.0.1:1/v1",
                                             "apiKeyEnv": "OPENAI_API_KEY"}}}}  # fmt: skip
    return suite, run


def expected_results(
    results: list[dict[str, Any]], cases: list[dict[str, Any]] = CASES
) -> list[tuple[str, str, Any, Any]]:
    """``(case, what, got, expected)`` for every case of ``cases`` whose score or pass
    differs."""
    by_task = {r["task"]: r for r in results}
    wrong = []
    for case in cases:
        result = by_task[task_id(case)]
        name = case["grader"]["name"]
        score, passed = result["metrics"].get(name), result["criteria"].get(name)
        want = case["expected"]
        if score is None or abs(score - want["score"]) > 1e-9:
            wrong.append((case["id"], "score", score, want["score"]))
        counts = {"passed": 1, "failed": 0} if want["pass"] else {"passed": 0, "failed": 1}
        if passed != counts:
            wrong.append((case["id"], "pass", passed, counts))
    return wrong


def test_the_golden_file_has_every_grader_type_and_enough_cases() -> None:
    assert len(CASES) >= 60
    assert len({c["id"] for c in CASES}) == len(CASES)
    kinds = {c["grader"]["type"] for c in CASES}
    assert kinds == {"string_check", "text_similarity", "score_model", "label_model", "multi",
                     "python"}  # fmt: skip
    assert all(c["reference"] for c in CASES)


def test_evalkube_run_scores_every_golden_case_as_expected(tmp_path: Path) -> None:
    suite, run = golden_suite(tmp_path)
    with GoldenJudge() as judge:
        run["spec"]["providers"]["openai"]["baseURL"] = judge.base_url
        (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
        done = subprocess.run(
            [EVALKUBE, "run", str(tmp_path / "suite.yaml"), str(tmp_path / "run.yaml"),
             "--sandbox", "process", "--db", f"sqlite:///{tmp_path / 'r.db'}",
             "--output", str(tmp_path / "results.json"), "--quiet"],
            capture_output=True, text=True, timeout=540,
            env={**os.environ, "OPENAI_API_KEY": KEY},
        )  # fmt: skip
        calls = len(judge.received)
    assert done.returncode == 0, done.stderr + done.stdout
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert expected_results(results) == []
    model_graded = sum(c["grader"]["type"] in ("score_model", "label_model") for c in CASES)
    cosine = sum(c["grader"].get("evaluation_metric") == "cosine" for c in CASES)
    assert calls == model_graded + cosine  # one call per model-graded sample, none else


def generated(root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The golden suite with candidates generated by ``openai:golden`` instead of read from
    files: each task's prompt names its case; JSON output asked for (`output_json`)."""
    suite, run = golden_suite(root)
    for task in suite["spec"]["tasks"]:
        del task["outputs"]
        task["prompt"] = f"golden case {next(c['id'] for c in CASES if task_id(c) == task['id'])}"
    run["spec"]["models"] = ["openai:golden"]
    run["spec"]["generation"] = {"responseFormat": {"type": "json_object"}}
    return suite, run


def _free_port() -> int:
    return free_port()


def test_generated_golden_cases_score_as_expected_in_evalkube_run(tmp_path: Path) -> None:
    """The generated variant, first through `evalkube run` on loopback (no node needed)."""
    suite, run = generated(tmp_path)
    port = _free_port()
    run["spec"]["providers"]["openai"]["baseURL"] = f"http://127.0.0.1:{port}/v1"
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    server = subprocess.Popen([sys.executable, PROVIDER, str(GOLDEN_FILE), "127.0.0.1", str(port)])
    try:
        wait_for(lambda: accepts(port), timeout=30, what="the golden provider")
        done = subprocess.run(
            [EVALKUBE, "run", str(tmp_path / "suite.yaml"), str(tmp_path / "run.yaml"),
             "--sandbox", "process", "--db", f"sqlite:///{tmp_path / 'r.db'}",
             "--output", str(tmp_path / "results.json"), "--quiet"],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "OPENAI_API_KEY": KEY},
        )  # fmt: skip
    finally:
        server.kill()
        server.wait(timeout=10)
    assert done.returncode == 0, done.stderr + done.stdout
    assert expected_results(json.loads((tmp_path / "results.json").read_text())["results"]) == []
