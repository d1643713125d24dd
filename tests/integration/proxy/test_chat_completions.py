"""Providers with ``api: chat_completions`` behind both proxy engines, over loopback.

The grader keeps calling ``ctx.responses_create``; the proxy sends Chat Completions to a fake
server that has no ``/v1/responses`` (a real aiohttp server speaking the real API shape,
counting calls) and hands back a Responses-shaped object. Every case runs against the Python
and the native proxy.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evalkube.controller.snapshot import build_snapshot, check_suite
from evalkube.engine.snapshot import load_snapshot
from evalkube.store import ResultStore, RunRecord
from evalkube_sandbox.ctx import Context, ModelCallError
from tests.integration.proxy.conftest import KEY, OPEN_TOKEN, MakeBridge, native_or_skip
from tests.integration.proxy.fake_upstream import FakeUpstream, Scripted
from tests.integration.proxy.test_end_to_end import _unix_request, _wait_for
from tests.integration.proxy.test_pod_unit import NAME, NS, RUN_ID, UID, ingest_server, run_unit
from tests.integration.proxy.test_proxy import raw_post

pytestmark = pytest.mark.timeout(180)

VERDICT = {
    "type": "object",
    "properties": {"verdict": {"type": "string"}},
    "required": ["verdict"],
    "additionalProperties": False,
}


@pytest.fixture
def upstream() -> Any:
    """The proxy tests' fake provider, without ``/v1/responses``: chat completions only."""
    with FakeUpstream(chat_only=True) as fake:
        yield fake


def test_a_judge_call_is_sent_as_chat_and_answered_as_a_response(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    bridge = make_bridge(api="chat_completions")
    assert bridge.endpoint is not None
    ctx = Context(bridge.endpoint, OPEN_TOKEN, "task")
    answer = ctx.responses_create(
        model="auto",
        instructions="You grade answers.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Is 4 right?"}]}],
        temperature=0,
        top_p=0.5,
        seed=3,
        max_output_tokens=20,
        text={"format": {"type": "json_schema", "name": "v", "schema": VERDICT, "strict": True}},
        metadata={"judge": "binary"},
        stream=True,
    )

    sent = upstream.received[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["Authorization"] == f"Bearer {KEY}"
    assert sent.body == {
        "model": "judge-1",
        "messages": [
            {"role": "system", "content": "You grade answers."},
            {"role": "user", "content": "Is 4 right?"},
        ],
        "temperature": 0,
        "top_p": 0.5,
        "seed": 3,
        "max_tokens": 20,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "v", "schema": VERDICT, "strict": True},
        },
        "stream": False,
    }
    assert answer["output_text"] == "echo: Is 4 right?"
    assert answer["id"] == "chatcmpl-0001"
    assert (answer["object"], answer["model"], answer["status"]) == (
        "response",
        "judge-1",
        "completed",
    )
    assert answer["output"] == [
        {
            "type": "message",
            "id": "msg_chatcmpl-0001",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "echo: Is 4 right?", "annotations": []}],
        }
    ]
    assert answer["usage"]["input_tokens"] == 5
    assert answer["usage"]["output_tokens"] == 2
    # embeddings are the same API on such servers: not translated
    vectors = ctx.embeddings_create(input=["a"])
    assert upstream.received[1].path == "/v1/embeddings"
    assert vectors["data"][0]["embedding"] == [1.0, 1.0]
    usage = bridge.take_usage([OPEN_TOKEN])[OPEN_TOKEN]
    assert usage["response_ids"] == ["chatcmpl-0001"]
    assert usage["usage"] == {
        "input_tokens": 5,
        "output_tokens": 2,
        "total_tokens": 8,  # 7 for the judge call, 1 for the embedding
        "prompt_tokens": 1,
    }
    assert usage["by_purpose"] == {"judge": 1, "embedding": 1}


def test_tool_calls_come_back_as_function_call_items(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    bridge = make_bridge(api="chat_completions")
    assert bridge.endpoint is not None
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    upstream.then(
        Scripted(
            body={
                "id": "chatcmpl-tools",
                "object": "chat.completion",
                "created": 1,
                "model": "judge-1",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                        "finish_reason": "tool_calls",
                    }
                ],
            }
        )
    )
    answer = Context(bridge.endpoint, OPEN_TOKEN, "task").responses_create(
        input="use f", tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    )
    assert upstream.received[0].body["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert answer["output"] == [
        {
            "type": "function_call",
            "id": "fc_call_1",
            "call_id": "call_1",
            "name": "f",
            "arguments": "{}",
            "status": "completed",
        }
    ]
    assert answer["output_text"] == ""


def test_an_untranslatable_request_is_refused_before_it_costs_a_call(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    bridge = make_bridge(api="chat_completions")
    assert bridge.endpoint is not None
    bridge.configure_unit("unit-chat", 1, 1)
    bridge.open_executions(["exec-chat"])
    ctx = Context(bridge.endpoint, "exec-chat", "task")
    with pytest.raises(ModelCallError) as refused:
        ctx.responses_create(input="more", previous_response_id="resp_1")
    assert refused.value.kind == "invalid_request"
    assert refused.value.status == 400
    assert str(refused.value) == (
        "provider fake speaks Chat Completions (api: chat_completions): `previous_response_id` "
        "needs a provider that keeps Responses state; a Chat Completions provider cannot honour it"
    )
    assert upstream.received == []
    # the budget of one call is still whole
    assert ctx.responses_create(input="hi")["output_text"] == "echo: hi"


@pytest.mark.parametrize(
    ("reply", "kind", "status", "message"),
    [
        (
            Scripted(400, {"error": {"message": "max_tokens is too large", "type": "BadRequest"}}),
            "invalid_request",
            400,
            "provider fake answered HTTP 400: max_tokens is too large",
        ),
        (
            Scripted(
                400,
                {
                    "object": "error",
                    "message": "This model's maximum context length is 4096 tokens.",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                },
            ),
            "invalid_request",
            400,
            "provider fake answered HTTP 400: This model's maximum context length is 4096 tokens.",
        ),
        (
            Scripted(body={"id": "chatcmpl-x", "object": "chat.completion", "choices": []}),
            "upstream_error",
            502,
            "provider fake answered a chat completion without choices",
        ),
        (Scripted(401), "credentials_rejected", 502, "credentials rejected by provider fake"),
    ],
    ids=["provider-400", "vllm-error-shape", "no-choices", "credentials"],
)
def test_chat_provider_errors_keep_the_proxy_error_kinds(
    make_bridge: MakeBridge,
    upstream: FakeUpstream,
    reply: Scripted,
    kind: str,
    status: int,
    message: str,
) -> None:
    bridge = make_bridge(api="chat_completions")
    assert bridge.endpoint is not None
    upstream.then(reply)
    with pytest.raises(ModelCallError) as failed:
        Context(bridge.endpoint, OPEN_TOKEN, "task").responses_create(input="x")
    assert (failed.value.kind, failed.value.status) == (kind, status)
    assert str(failed.value).startswith(message)
    assert len(upstream.received) == 1
    usage = bridge.take_usage([OPEN_TOKEN])[OPEN_TOKEN]
    assert (usage["calls"], usage["errors"]) == (1, 1)


def test_the_runners_candidate_calls_are_translated_too(
    make_bridge: MakeBridge, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A pod's runner generates candidates through the control listener."""
    bridge = make_bridge(api="chat_completions", control_listen=f"unix:{tmp_path / 'c.sock'}")
    assert bridge.control_endpoint is not None
    status, raw = raw_post(
        bridge.control_endpoint,
        "/v1/responses",
        {"model": "fake:llama", "input": "2+2?", "max_output_tokens": 8, "stream": False},
        {"Content-Type": "application/json", "X-Evalkube-Purpose": "candidate"},
    )
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["output_text"] == "echo: 2+2?"
    assert upstream.received[0].path == "/v1/chat/completions"
    assert upstream.received[0].body == {
        "model": "llama",
        "messages": [{"role": "user", "content": "2+2?"}],
        "max_tokens": 8,
        "stream": False,
    }


JUDGE_TARGET = """
def grade(sample, item, ctx):
    verdict = ctx.responses_create(model="auto", input="Candidate: " + sample["output_text"])
    return {"scores": {"judged": 1.0 if item["target"] in verdict["output_text"] else 0.0},
            "judge": {"response_id": verdict["id"], "text": verdict["output_text"]}}
"""


def test_a_pod_unit_generates_and_judges_through_a_chat_provider(
    make_bridge: MakeBridge, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """``evalkube unit`` as in a pod: candidates through the sidecar's control listener, the
    grader's call through its grader listener, both to the chat-only server."""
    bridge = make_bridge(api="chat_completions", control_listen=f"unix:{tmp_path / 'c.sock'}")
    spec = {
        "tasks": [
            {
                "id": "gen",
                "dataset": {"rows": [{"q": "Say 4", "t": "4"}, {"q": "Say 5", "t": "6"}]},
                "prompt": "{{ item.q }}",
                "target": "{{ item.t }}",
                "grader": {
                    "type": "python",
                    "contract": "model_backed",
                    "maxModelCalls": 1,
                    "metricId": "judged",
                    "source": JUDGE_TARGET,
                },
            }
        ]
    }
    check = check_suite(NS, spec, lambda ns, cm, key: None)
    assert check.ok, check.problems
    run = {
        "metadata": {"namespace": NS, "name": NAME, "uid": UID},
        "spec": {
            "suiteRef": {"name": "qa"},
            "models": ["fake:llama"],
            "judgeModel": "fake:judge-1",
            "providers": {"fake": {"baseURL": upstream.base_url, "api": "chat_completions"}},
        },
    }
    snapshot_path = tmp_path / "snapshot.json"
    snapshot_path.write_text(build_snapshot(run, RUN_ID, "qa", check).to_json())
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        store.create_run(RunRecord(RUN_ID, "qa", "sha256:x", {}, "pod"))
        (unit,) = load_snapshot(snapshot_path).units()
        with ingest_server(store) as ingest:
            run_unit(snapshot_path, unit.unit_id, ingest, bridge)
        samples = sorted(store.iter_samples(RUN_ID), key=lambda s: str(s.output_text))
    finally:
        store.close()

    assert [r.path for r in upstream.received] == ["/v1/chat/completions"] * 4
    models = sorted(r.body["model"] for r in upstream.received)
    assert models == ["judge-1", "judge-1", "llama", "llama"]
    assert [s.output_text for s in samples] == ["echo: Say 4", "echo: Say 5"]
    assert [s.scores for s in samples] == [{"judged": 1.0}, {"judged": 0.0}]
    for sample in samples:
        assert sample.judge["text"] == f"echo: Candidate: {sample.output_text}"
        assert sample.judge["response_id"] in sample.model_calls["response_ids"]
        assert sample.model_calls["judge"] == 1


def test_the_sidecar_reads_the_api_from_the_run_spec(
    tmp_path: Path, upstream: FakeUpstream, key_file: Path, engine: str
) -> None:
    """``evalkube proxy --run-spec`` as a pod runs it (``--engine native`` execs the binary
    with the provider's ``api`` in its configuration)."""
    run = tmp_path / "run.yaml"
    run.write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalRun\nmetadata: {name: r}\nspec:\n"
        "  models: ['fake:m']\n  judgeModel: fake:judge-9\n"
        f"  providers:\n    fake:\n      baseURL: {upstream.base_url}\n"
        "      credentialsSecretRef: {name: s, key: api-key}\n      api: chat_completions\n"
    )
    grader_sock, control_sock = tmp_path / "g" / "model.sock", tmp_path / "c" / "control.sock"
    env = {
        "PATH": "/usr/bin:/bin",
        "EVALKUBE_PROVIDER_KEYS_DIR": str(key_file.parent),
        "PYTHONPATH": ":".join(sys.path),
        **({"EVALKUBE_PROXY_BIN": native_or_skip()} if engine == "native" else {}),
    }
    process = subprocess.Popen(
        [
            sys.executable, "-c", "from evalkube.proxy.cli import main; main()",
            "--listen", f"unix:{grader_sock}", "--control-listen", f"unix:{control_sock}",
            "--run-spec", str(run), "--max-calls", "1", "--planned-executions", "1",
            "--engine", engine,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait_for(control_sock, process)
        _wait_for(grader_sock, process)
        status, _ = _unix_request(
            str(control_sock), "POST", "/evalkube/v1/executions:open", {"tokens": ["s1"]}
        )
        assert status == 200
        answer = Context(f"unix:{grader_sock}", "s1", "t").responses_create(input="hi")
        assert answer["output_text"] == "echo: hi"
        assert answer["id"] == "chatcmpl-0001"
        assert [r.path for r in upstream.received] == ["/v1/chat/completions"]
        assert upstream.received[0].body["messages"] == [{"role": "user", "content": "hi"}]
        assert upstream.received[0].headers["Authorization"] == f"Bearer {KEY}"
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
