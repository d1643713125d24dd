"""Three public `evals.create` definitions from OpenAI's cookbook, imported and run.

tests/fixtures/cookbook/ holds each notebook's eval and one of its runs as `evalkube import
openai` takes them (`_source` names the notebook): tools-evaluation (a score_model reading
`sample.output_tools[0].function.arguments.symbols`, a completions run with a function tool,
seed, temperature, top_p and a token cap), structured-outputs-evaluation (a responses run with
`text.format` json_schema; the grader reads `sample.output_json.symbols`) and
bulk-experimentation (a label_model). The model under test and the judges are one fake OpenAI
Responses server on loopback that records every request: each declared parameter must reach
it, and the scores must follow from its answers.
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
from aiohttp import web

from tests.integration.proxy.fake_upstream import FakeUpstream, Received

pytestmark = pytest.mark.timeout(240)

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
COOKBOOK = Path(__file__).parents[1] / "fixtures" / "cookbook"
KEY = "sk-cookbook-0123456789abcdef"
SYMBOLS = {"symbols": [{"name": "add", "symbol_type": "function"},
                       {"name": "Calculator", "symbol_type": "class"}]}  # fmt: skip


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text}]}  # fmt: skip


class CookbookModel(FakeUpstream):
    """The model under test and the judges: a judge (asked for its strict schema) gives 6
    when the symbols reached its prompt (else 2) and the label `concise-and-snappy`; the
    model calls its tool when given one, answers JSON when asked, else summarizes."""

    async def _responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            self.received.append(Received(request.path, dict(request.headers), body))
        fmt = (body.get("text") or {}).get("format") or {}
        output: list[dict[str, Any]]
        if fmt.get("name") in ("score_model", "label_model"):
            prompt = body["input"][-1]["content"]
            result: Any = 6 if '"name": "Calculator"' in prompt else 2
            if fmt["name"] == "label_model":
                result = "concise-and-snappy"
            output = [_message(json.dumps({"steps": ["read it"], "result": result}))]
        elif body.get("tools"):
            name = body["tools"][0]["name"]
            call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": name}
            output = [{**call, "arguments": json.dumps(SYMBOLS)}]
        elif fmt.get("type") == "json_schema":
            output = [_message(json.dumps(SYMBOLS))]
        else:
            output = [_message("Sarah asks for a call; package delivered; 20% off electronics.")]
        return web.json_response(
            {"id": f"resp_{len(self.received)}", "object": "response", "model": body.get("model"),
             "output": output, "usage": {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}}
        )  # fmt: skip


def _import_and_run(
    name: str, tmp_path: Path
) -> tuple[dict[str, Any], list[Received], dict[str, Any]]:
    export = json.loads((COOKBOOK / f"{name}.json").read_text())
    done = subprocess.run(
        [EVALKUBE, "import", "openai", str(COOKBOOK / f"{name}.json"), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = yaml.safe_load((tmp_path / "run.yaml").read_text())
    with CookbookModel() as fake:
        run["spec"]["providers"]["openai"]["baseURL"] = fake.base_url
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
        done = subprocess.run(
            [EVALKUBE, "run", str(tmp_path / "suite.yaml"), str(tmp_path / "run.yaml"),
             "--sandbox", "process", "--db", f"sqlite:///{tmp_path / 'r.db'}",
             "--output", str(tmp_path / "results.json"), "--quiet"],
            capture_output=True, text=True, timeout=180,
            env={**os.environ, "OPENAI_API_KEY": KEY},
        )  # fmt: skip
        received = list(fake.received)
    assert done.returncode == 0, done.stderr + done.stdout
    (result,) = json.loads((tmp_path / "results.json").read_text())["results"]
    return export, received, result


def _split(received: list[Received]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    judged = [r.body for r in received if (r.body.get("text") or {}).get("format", {}).get("name")
              in ("score_model", "label_model")]  # fmt: skip
    return [r.body for r in received if r.body not in judged], judged


def test_tools_evaluation_sends_its_tool_and_grades_the_call(tmp_path: Path) -> None:
    export, received, result = _import_and_run("tools_evaluation", tmp_path)
    source = export["run"]["data_source"]
    (candidate,), (judged,) = _split(received)
    assert candidate["model"] == "gpt-4.1"
    assert (candidate["seed"], candidate["temperature"], candidate["top_p"]) == (42, 0.7, 0.9)
    assert candidate["max_output_tokens"] == 10000
    (tool,) = source["sampling_params"]["tools"]
    assert candidate["tools"] == [{"type": "function", **tool["function"]}]
    assert candidate["input"][1]["content"].startswith(
        "Extract the symbols from the code file def add"
    )
    assert judged["model"] == "o3"
    # the parsed tool arguments reached the judge's prompt, so it scored 6 of [1, 7]
    assert '"name": "Calculator"' in judged["input"][1]["content"]
    assert result["metrics"]["General_Evaluator"] == 6.0
    assert result["criteria"]["General_Evaluator"] == {"passed": 1, "failed": 0}


def test_structured_outputs_evaluation_asks_for_json_and_grades_output_json(
    tmp_path: Path,
) -> None:
    export, received, result = _import_and_run("structured_outputs_evaluation", tmp_path)
    params = export["run"]["data_source"]["sampling_params"]
    (candidate,), (judged,) = _split(received)
    assert candidate["model"] == "gpt-4.1-mini"
    assert candidate["text"] == params["text"]
    assert (candidate["seed"], candidate["temperature"], candidate["top_p"]) == (42, 0.7, 0.9)
    assert candidate["max_output_tokens"] == 10000
    assert '"name": "Calculator"' in judged["input"][1]["content"]  # sample.output_json.symbols
    assert result["metrics"]["General_Evaluator"] == 6.0
    assert result["criteria"]["General_Evaluator"] == {"passed": 1, "failed": 0}  # 6 >= 5.5


def test_bulk_experimentation_labels_every_summary(tmp_path: Path) -> None:
    export, received, result = _import_and_run("bulk_experimentation", tmp_path)
    template = export["run"]["data_source"]["input_messages"]["template"]
    candidates, judged = _split(received)
    assert len(candidates) == len(judged) == 3
    notifications = {line["item"]["notifications"] for line in
                     export["run"]["data_source"]["source"]["content"]}  # fmt: skip
    for body in candidates:
        assert body["model"] == "gpt-5.4-mini"
        assert body["input"][0] == {"role": "developer", "content": template[0]["content"]}
        sent = body["input"][1]["content"]
        assert sent.removeprefix("<push_notifications>").removesuffix("</push_notifications>") in (
            notifications
        )
    labels = export["eval"]["testing_criteria"][0]["labels"]
    for body in judged:
        assert body["model"] == "gpt-5.4-mini"
        assert body["text"]["format"]["schema"]["properties"]["result"]["enum"] == labels
        assert "<summary>Sarah asks for a call" in body["input"][1]["content"]
    name = "Push_Notification_Summary_Grader"
    assert result["metrics"][name] == 1.0
    assert result["criteria"][name] == {"passed": 3, "failed": 0}
