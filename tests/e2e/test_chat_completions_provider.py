"""`evalkube run` against a provider that speaks only Chat Completions (``api: chat_completions``).

The model under test and the judge are served by a fake self-hosted server with no
``/v1/responses`` (a real HTTP server on loopback speaking the Chat Completions shape,
tests/integration/proxy/fake_upstream.py, which counts and records every call): candidates
are generated through it and a grader's ``ctx.responses_create`` reaches it through the
model bridge, both translated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.proxy.fake_upstream import FakeUpstream

pytestmark = pytest.mark.timeout(180)

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
KEY = "sk-test-chat-provider-0123456789"

SUITE = {
    "apiVersion": "evalkube.io/v1alpha1",
    "kind": "EvalSuite",
    "metadata": {"name": "chat"},
    "spec": {
        "tasks": [
            {
                "id": "echo_judge",
                "dataset": {
                    "rows": [
                        {"question": "Say 4", "answer": "4"},
                        {"question": "Say Paris", "answer": "Paris"},
                        {"question": "Say nothing", "answer": "blue"},
                    ]
                },
                "prompt": [
                    {"role": "system", "content": "Answer briefly."},
                    {"role": "user", "content": "{{ item.question }}"},
                ],
                "target": "{{ item.answer }}",
                "grader": {
                    "type": "python",
                    "contract": "model_backed",
                    "metricId": "judged",
                    "maxModelCalls": 1,
                    "source": (
                        "def grade(sample, item, ctx):\n"
                        "    verdict = ctx.responses_create(\n"
                        "        model='auto', instructions='Judge the candidate.',\n"
                        "        input='Candidate: ' + sample['output_text'],\n"
                        "        max_output_tokens=10, temperature=0)\n"
                        "    ok = item['target'] in verdict['output_text']\n"
                        "    return {'scores': {'judged': 1.0 if ok else 0.0},\n"
                        "            'judge': {'response_id': verdict['id'],\n"
                        "                      'text': verdict['output_text'],\n"
                        "                      'tokens': verdict['usage']['input_tokens']}}\n"
                    ),
                },
            }
        ]
    },
}


def test_run_with_a_chat_completions_provider(tmp_path: Path) -> None:
    with FakeUpstream(chat_only=True) as upstream:
        run = {
            "apiVersion": "evalkube.io/v1alpha1",
            "kind": "EvalRun",
            "metadata": {"name": "chat"},
            "spec": {
                "models": ["vllm:llama-3.1-8b"],
                "judgeModel": "vllm:judge-8b",
                "providers": {
                    "vllm": {
                        "baseURL": upstream.base_url,
                        "apiKeyEnv": "VLLM_API_KEY",
                        "api": "chat_completions",
                    }
                },
                "generation": {"temperature": 0.2, "maxOutputTokens": 32},
            },
        }
        suite_file, run_file = tmp_path / "suite.yaml", tmp_path / "run.yaml"
        suite_file.write_text(yaml.safe_dump(SUITE))
        run_file.write_text(yaml.safe_dump(run))
        out, db = tmp_path / "out.json", tmp_path / "r.db"
        done = subprocess.run(
            [
                EVALKUBE, "run", str(suite_file), str(run_file), "--sandbox", "process",
                "--db", str(db), "--output", str(out), "-q",
            ],
            env={**os.environ, "VLLM_API_KEY": KEY},
            capture_output=True,
            text=True,
            timeout=150,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
        received = list(upstream.received)

    # every call went to /chat/completions, with the key: 3 candidates, then 3 judge calls
    assert [r.path for r in received] == ["/v1/chat/completions"] * 6
    assert all(r.headers.get("Authorization") == f"Bearer {KEY}" for r in received)
    candidates = sorted(
        (r.body for r in received if r.body["model"] == "llama-3.1-8b"),
        key=lambda b: str(b["messages"][-1]["content"]),
    )
    assert candidates == [
        {
            "model": "llama-3.1-8b",
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": question},
            ],
            "temperature": 0.2,
            "max_tokens": 32,
            "stream": False,
        }
        for question in ("Say 4", "Say Paris", "Say nothing")
    ]
    judged = sorted(
        (r.body for r in received if r.body["model"] == "judge-8b"),
        key=lambda b: str(b["messages"][-1]["content"]),
    )
    assert judged == [
        {
            "model": "judge-8b",
            "messages": [
                {"role": "system", "content": "Judge the candidate."},
                {"role": "user", "content": f"Candidate: echo: {question}"},
            ],
            "temperature": 0,
            "max_tokens": 10,
            "stream": False,
        }
        for question in ("Say 4", "Say Paris", "Say nothing")
    ]

    result = json.loads(out.read_text())["results"][0]
    assert result["metrics"] == {"judged": pytest.approx(2 / 3)}
    assert result["counts"] == {"samples": 3, "valid": 3, "invalid": 0, "errored": 0}
    assert result["model_calls"] == {"candidate": 3, "judge": 3}

    samples = subprocess.run(
        [EVALKUBE, "samples", json.loads(out.read_text())["run_id"], "--db", str(db), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    views = {v["output_text"]: v for v in json.loads(samples.stdout)}
    assert sorted(views) == ["echo: Say 4", "echo: Say Paris", "echo: Say nothing"]
    for question in ("Say 4", "Say Paris", "Say nothing"):
        view = views[f"echo: {question}"]
        assert view["judge"]["text"] == f"echo: Candidate: echo: {question}"
        assert view["judge"]["response_id"].startswith("chatcmpl-")
        assert view["judge"]["tokens"] == 5
        assert view["judge"]["response_id"] in view["model_calls"]["response_ids"]
    assert KEY not in samples.stdout


def test_an_unknown_api_is_refused_naming_the_field(tmp_path: Path) -> None:
    run = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": "chat"},
        "spec": {
            "models": ["vllm:llama"],
            "providers": {"vllm": {"baseURL": "http://127.0.0.1:9/v1", "api": "chat"}},
        },
    }
    suite_file, run_file = tmp_path / "suite.yaml", tmp_path / "run.yaml"
    suite_file.write_text(yaml.safe_dump(SUITE))
    run_file.write_text(yaml.safe_dump(run))
    done = subprocess.run(
        [EVALKUBE, "validate", str(suite_file), str(run_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert (
        "spec.providers.vllm.api: must be one of 'responses' or 'chat_completions' (got 'chat')"
        in done.stderr
    )
