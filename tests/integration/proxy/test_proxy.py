"""The model bridge proxy end to end over loopback: ctx -> proxy -> a real fake provider.

Covers credentials (the key reaches the provider and nothing else), forced flags, ``auto``
model resolution, budgets per execution and per unit, usage audit, retries, each upstream
failure's clear error, and key rotation.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from evalkube_sandbox.ctx import Context, ModelCallError
from tests.integration.proxy.conftest import KEY, MakeBridge
from tests.integration.proxy.fake_upstream import FakeUpstream, Scripted
from tests.support.ports import free_port

pytestmark = pytest.mark.timeout(60)


def raw_request(
    endpoint: str, method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes]:
    """A plain HTTP request to a proxy endpoint (what a hostile grader could send)."""
    assert endpoint.startswith("unix:")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(endpoint[len("unix:") :])
    conn = http.client.HTTPConnection("localhost", timeout=10)
    conn.sock = sock
    conn.request(method, path, body=body, headers=headers)
    reply = conn.getresponse()
    data = reply.read()
    conn.close()
    return reply.status, data


def raw_post(endpoint: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, bytes]:
    return raw_request(endpoint, "POST", path, json.dumps(body).encode(), headers)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` with exactly ``labels`` in a Prometheus exposition (both
    proxies' formats: Python prints ``1.0``, Go ``1``)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


# -- credentials ---------------------------------------------------------------------------------
def test_key_reaches_the_provider_and_nothing_else(
    make_bridge: MakeBridge,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    proxy_log: Path,
) -> None:
    caplog.set_level(logging.DEBUG)
    bridge = make_bridge()
    assert bridge.endpoint is not None
    ctx = Context(bridge.endpoint, "exec-1", "task")
    answer = ctx.responses_create(input="hello")
    embedded = ctx.embeddings_create(input=["a", "bb"])
    # A provider error text echoing the key must come back scrubbed.
    upstream.then(Scripted(400, {"error": {"message": f"Incorrect API key provided: {KEY}"}}))
    with pytest.raises(ModelCallError) as failed:
        ctx.responses_create(input="again")

    sent = [r.headers.get("Authorization") for r in upstream.received]
    assert sent == [f"Bearer {KEY}"] * 3
    assert all(r.headers.get("X-Org") == "evalkube-tests" for r in upstream.received)
    assert KEY not in json.dumps(answer) + json.dumps(embedded)
    assert KEY not in str(failed.value)
    assert "[redacted]" in str(failed.value)
    assert failed.value.status == 400
    assert KEY not in caplog.text
    assert KEY not in (proxy_log.read_text() if proxy_log.exists() else "")
    assert KEY not in bridge.metrics()
    assert KEY not in json.dumps(bridge.take_usage(["exec-1"]))


def test_client_headers_are_not_forwarded(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    bridge = make_bridge()
    assert bridge.endpoint is not None
    status, _ = raw_post(
        bridge.endpoint,
        "/v1/responses",
        {"input": "hi"},
        {
            "Content-Type": "application/json",
            "X-Evalkube-Execution": "exec-1",
            "Authorization": "Bearer sk-grader-forged-000000",
            "X-Api-Key": "grader",
            "Cookie": "session=1",
        },
    )
    assert status == 200
    headers = {k.lower(): v for k, v in upstream.received[-1].headers.items()}
    assert headers["authorization"] == f"Bearer {KEY}"
    assert "x-api-key" not in headers
    assert "cookie" not in headers
    assert "x-evalkube-execution" not in headers


def test_missing_key_is_a_clear_error(make_bridge: MakeBridge, key_file: Path) -> None:
    key_file.unlink()
    bridge = make_bridge()
    assert bridge.endpoint is not None
    with pytest.raises(ModelCallError, match=r"no API key for provider fake: key file .* missing"):
        Context(bridge.endpoint, "exec-1", "task").responses_create(input="x")


def test_rotated_key_file_is_used_by_the_next_call(
    make_bridge: MakeBridge, upstream: FakeUpstream, key_file: Path
) -> None:
    bridge = make_bridge()
    assert bridge.endpoint is not None
    ctx = Context(bridge.endpoint, "exec-1", "task")
    ctx.responses_create(input="before")
    # Kubernetes swaps a new file in (atomic rename), as a rotated Secret does.
    replacement = key_file.with_name("fake.new")
    replacement.write_text("sk-rotated-key-fedcba9876543210\n")
    os.replace(replacement, key_file)
    ctx.responses_create(input="after")
    assert [r.headers["Authorization"] for r in upstream.received] == [
        f"Bearer {KEY}",
        "Bearer sk-rotated-key-fedcba9876543210",
    ]


# -- request shaping -----------------------------------------------------------------------------
def test_responses_are_forced_to_sync_and_stored(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    bridge = make_bridge()
    assert bridge.endpoint is not None
    Context(bridge.endpoint, "exec-1", "task").responses_create(
        model="fake:judge-2", input="x", stream=True, store=False, background=True, temperature=0
    )
    body = upstream.received[-1].body
    assert (body["stream"], body["store"], body["background"]) == (False, True, False)
    assert body["temperature"] == 0
    assert upstream.received[-1].path == "/v1/responses"


@pytest.mark.parametrize(
    ("kind", "request_model", "upstream_model"),
    [
        ("responses", "auto", "judge-1"),
        ("responses", None, "judge-1"),
        ("responses", "fake:gpt-4.1-mini", "gpt-4.1-mini"),
        ("responses", "gpt-4.1-nano", "gpt-4.1-nano"),
        ("embeddings", "auto", "embed-1"),
        ("embeddings", None, "embed-1"),
        ("embeddings", "fake:text-embedding-3-large", "text-embedding-3-large"),
    ],
)
def test_model_resolution(
    make_bridge: MakeBridge,
    upstream: FakeUpstream,
    kind: str,
    request_model: str | None,
    upstream_model: str,
) -> None:
    bridge = make_bridge()
    assert bridge.endpoint is not None
    ctx = Context(bridge.endpoint, "exec-1", "task")
    request: dict[str, Any] = {"input": ["text"]}
    if request_model is not None:
        request["model"] = request_model
    if kind == "responses":
        result = ctx.responses_create(**request)
        assert result["output_text"] == "echo: ['text']"
        assert result.get("id") == "resp_0001"
    else:
        result = ctx.embeddings_create(**request)
        assert result["data"][0]["embedding"] == [4.0, 1.0]
        assert result.get("model") == upstream_model
    assert upstream.received[-1].body["model"] == upstream_model


def test_unusable_models_are_rejected_before_any_call(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    bridge = make_bridge(judge_model=None)
    assert bridge.endpoint is not None
    ctx = Context(bridge.endpoint, "exec-1", "task")
    with pytest.raises(ModelCallError, match=r"model='auto' needs the run's judgeModel") as e1:
        ctx.responses_create(input="x")
    with pytest.raises(ModelCallError, match=r"provider 'openai' is not configured"):
        ctx.responses_create(model="openai:gpt-4.1", input="x")
    with pytest.raises(ModelCallError, match="local provider serves embeddings only"):
        ctx.responses_create(model="local:all-minilm-l6-v2", input="x")
    assert e1.value.kind == "invalid_request"
    assert e1.value.status == 400
    assert upstream.received == []
    assert bridge.take_usage(["exec-1"]) == {}


def test_calls_without_execution_id_are_refused(make_bridge: MakeBridge) -> None:
    bridge = make_bridge()
    assert bridge.endpoint is not None
    status, body = raw_post(
        bridge.endpoint, "/v1/responses", {"input": "x"}, {"Content-Type": "application/json"}
    )
    assert status == 400
    assert json.loads(body)["error"]["type"] == "missing_execution_id"
    status, _ = raw_post(bridge.endpoint, "/evalkube/v1/usage:take", {"execution_ids": "*"}, {})
    assert status == 404  # control routes do not exist on the grader listener


def test_grader_listener_serves_the_model_routes_only(make_bridge: MakeBridge) -> None:
    """Metrics, health and control routes would tell a grader about other executions."""
    bridge = make_bridge()
    assert bridge.endpoint is not None
    for method, path in [
        ("GET", "/metrics"),
        ("GET", "/healthz"),
        ("GET", "/evalkube/v1/budget"),
        ("PUT", "/evalkube/v1/budget"),
        ("POST", "/evalkube/v1/executions:open"),
        ("POST", "/evalkube/v1/usage:take"),
    ]:
        status, _ = raw_request(bridge.endpoint, method, path, b"{}", {})
        assert status in (404, 405), (method, path, status)
    assert "evalkube_proxy_model_call_duration_seconds" in bridge.metrics()  # the trusted side


def test_forged_tokens_are_refused_and_cost_the_honest_execution_nothing(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    """A grader that knows (or guesses) sample ids, unit ids or stale tokens gains nothing."""
    bridge = make_bridge()
    bridge.configure_unit("unit-f", 2, 1)
    bridge.open_executions(["honest-token"])
    assert bridge.endpoint is not None
    for forged in ["s_0011223344_0000000000001", "unit-f", "exec-1", "honest-token2", ""]:
        status, body = raw_post(
            bridge.endpoint,
            "/v1/responses",
            {"input": "steal"},
            {"Content-Type": "application/json", "X-Evalkube-Execution": forged},
        )
        assert status in (400, 403), (forged, status)
        if status == 403:
            assert json.loads(body)["error"]["type"] == "unknown_execution"
    assert upstream.received == []
    honest = Context(bridge.endpoint, "honest-token", "task")
    honest.responses_create(input="1")
    honest.responses_create(input="2")  # its whole budget is still there
    assert len(upstream.received) == 2
    usage = bridge.take_usage(["honest-token"])
    assert usage["honest-token"]["calls"] == 2
    # taking the usage closed the token: a grader that kept it cannot spend with it again
    with pytest.raises(ModelCallError) as reused:
        honest.responses_create(input="3")
    assert reused.value.status == 403
    assert reused.value.kind == "unknown_execution"
    assert len(upstream.received) == 2
    assert (
        metric(
            bridge.metrics(), "evalkube_proxy_budget_rejections_total", scope="unknown_execution"
        )
        == 5
    )


# -- budgets -------------------------------------------------------------------------------------
def test_the_65th_call_of_an_execution_fails_while_others_continue(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    bridge = make_bridge()
    bridge.configure_unit("unit-1", 64, 10)
    bridge.open_executions(["sample-1", "sample-2"])
    assert bridge.endpoint is not None
    greedy = Context(bridge.endpoint, "sample-1", "task")
    for _ in range(64):
        greedy.responses_create(input="x")
    with pytest.raises(ModelCallError) as exhausted:
        greedy.responses_create(input="x")
    assert str(exhausted.value) == "model call budget of 64 exhausted for this execution"
    assert exhausted.value.kind == "budget_exhausted"
    assert exhausted.value.status == 429
    assert len(upstream.received) == 64
    other = Context(bridge.endpoint, "sample-2", "task")
    assert other.responses_create(input="y")["output_text"] == "echo: y"
    assert bridge.take_usage(["sample-1"])["sample-1"]["calls"] == 64
    text = bridge.metrics()
    assert metric(text, "evalkube_proxy_budget_rejections_total", scope="execution") == 1


def test_calls_spread_over_tokens_hit_the_unit_budget(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    bridge = make_bridge()
    bridge.configure_unit("unit-7", 2, 3)
    bridge.open_executions([f"forged-{n}" for n in range(10)])
    assert bridge.endpoint is not None
    outcomes = []
    for n in range(10):
        try:
            Context(bridge.endpoint, f"forged-{n}", "task").responses_create(input="x")
            outcomes.append("ok")
        except ModelCallError as exc:
            outcomes.append(str(exc))
    assert outcomes[:6] == ["ok"] * 6
    assert set(outcomes[6:]) == {
        "model call budget of 6 exhausted for this work unit (2 calls x 3 executions)"
    }
    assert len(upstream.received) == 6
    assert bridge.budget()["used"] == 6
    # The next unit starts with fresh counters.
    bridge.configure_unit("unit-8", 2, 1)
    bridge.open_executions(["forged-0"])
    Context(bridge.endpoint, "forged-0", "task").responses_create(input="x")


def test_zero_budget_refuses_every_call(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    bridge = make_bridge()
    bridge.configure_unit("unit-0", 0, 100)
    bridge.open_executions(["s"])
    assert bridge.endpoint is not None
    with pytest.raises(ModelCallError, match="budget of 0 exhausted for this execution"):
        Context(bridge.endpoint, "s", "task").embeddings_create(input="x")
    assert upstream.received == []


# -- usage audit ---------------------------------------------------------------------------------
def test_usage_is_taken_per_execution(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    bridge = make_bridge()
    bridge.configure_unit("unit-1", 64, 2)
    bridge.open_executions(["sample-a", "sample-b"])
    assert bridge.endpoint is not None
    a = Context(bridge.endpoint, "sample-a", "task")
    b = Context(bridge.endpoint, "sample-b", "task")
    ids_a = [a.responses_create(input="1")["id"], a.responses_create(input="2")["id"]]
    a.embeddings_create(input=["x", "y", "z"])
    ids_b = [b.responses_create(input="3")["id"]]

    usage = bridge.take_usage(["sample-a", "sample-b", "never-called"])
    assert set(usage) == {"sample-a", "sample-b"}
    assert usage["sample-a"]["calls"] == 3
    assert usage["sample-a"]["response_ids"] == ids_a
    assert usage["sample-a"]["by_purpose"] == {"judge": 2, "embedding": 1}
    assert usage["sample-a"]["usage"] == {
        "input_tokens": 10,
        "output_tokens": 4,
        "total_tokens": 17,
        "prompt_tokens": 3,
    }
    assert len(usage["sample-a"]["latency_ms"]) == 3
    assert all(ms > 0 for ms in usage["sample-a"]["latency_ms"])
    assert usage["sample-b"]["response_ids"] == ids_b
    assert bridge.take_usage(["sample-a", "sample-b"]) == {}

    text = bridge.metrics()
    calls = "evalkube_proxy_model_calls_total"
    assert metric(text, calls, outcome="ok", provider="fake", purpose="judge") == 3
    assert metric(text, calls, outcome="ok", provider="fake", purpose="embedding") == 1
    assert metric(text, "evalkube_proxy_tokens_total", kind="output", purpose="judge") == 6


# -- resilience ----------------------------------------------------------------------------------
def test_429_is_retried_after_retry_after(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    bridge = make_bridge(retries=3)
    assert bridge.endpoint is not None
    upstream.then(
        Scripted(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0.4"}),
        Scripted(500),
    )
    started = time.monotonic()
    answer = Context(bridge.endpoint, "exec-1", "task").responses_create(input="x")
    assert time.monotonic() - started >= 0.4
    assert answer["output_text"] == "echo: x"
    assert len(upstream.received) == 3
    text = bridge.metrics()
    retries = "evalkube_proxy_upstream_retries_total"
    assert metric(text, retries, provider="fake", reason="429") == 1
    assert metric(text, retries, provider="fake", reason="500") == 1
    # Retries are one call for the budget and the audit.
    assert bridge.take_usage(["exec-1"])["exec-1"]["calls"] == 1


def test_persistent_500_fails_after_the_retries(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    bridge = make_bridge(retries=2)
    assert bridge.endpoint is not None
    upstream.then(*[Scripted(500, {"error": {"message": "upstream exploded"}})] * 3)
    with pytest.raises(ModelCallError) as failed:
        Context(bridge.endpoint, "exec-1", "task").responses_create(input="x")
    assert str(failed.value) == (
        "provider fake answered HTTP 500: upstream exploded (after 3 attempts)"
    )
    assert failed.value.kind == "upstream_error"
    assert failed.value.status == 502
    assert len(upstream.received) == 3
    assert bridge.take_usage(["exec-1"])["exec-1"]["errors"] == 1


def test_401_is_credentials_rejected_without_retry(
    make_bridge: MakeBridge, upstream: FakeUpstream, key_file: Path
) -> None:
    bridge = make_bridge(retries=3)
    assert bridge.endpoint is not None
    upstream.then(Scripted(401, {"error": {"message": f"bad key {KEY}"}}))
    with pytest.raises(ModelCallError) as failed:
        Context(bridge.endpoint, "exec-1", "task").responses_create(input="x")
    assert str(failed.value) == (
        f"credentials rejected by provider fake (HTTP 401); check its key file {key_file}"
    )
    assert failed.value.kind == "credentials_rejected"
    assert len(upstream.received) == 1


def test_upstream_timeout_is_a_clear_error(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    bridge = make_bridge(timeout=0.3, retries=0)
    assert bridge.endpoint is not None
    upstream.then(Scripted(200, delay=3.0))
    started = time.monotonic()
    with pytest.raises(ModelCallError) as failed:
        Context(bridge.endpoint, "exec-1", "task").responses_create(input="x")
    assert time.monotonic() - started < 2.5
    assert str(failed.value) == "provider fake timed out after 0.3 s"
    assert failed.value.kind == "upstream_timeout"
    assert failed.value.status == 504


def test_connection_refused_fails_fast(make_bridge: MakeBridge) -> None:
    port = free_port()  # nothing listens; outside the ephemeral range: no self-connection
    bridge = make_bridge(base_url=f"http://127.0.0.1:{port}/v1", retries=1)
    assert bridge.endpoint is not None
    started = time.monotonic()
    with pytest.raises(ModelCallError) as failed:
        Context(bridge.endpoint, "exec-1", "task").embeddings_create(input="x")
    assert time.monotonic() - started < 5
    assert str(failed.value) == (
        f"provider fake is unreachable at http://127.0.0.1:{port}: connection failed "
        "(Connection refused) (after 2 attempts)"
    )
    assert failed.value.kind == "upstream_unreachable"


def test_invalid_json_from_the_provider(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    bridge = make_bridge()
    assert bridge.endpoint is not None
    upstream.then(Scripted(299, "<html>gateway</html>"))  # a success status, not JSON
    with pytest.raises(ModelCallError, match="provider fake answered with invalid JSON"):
        Context(bridge.endpoint, "exec-1", "task").responses_create(input="x")


def test_bridge_down_is_a_clear_ctx_error(make_bridge: MakeBridge) -> None:
    bridge = make_bridge()
    endpoint = bridge.endpoint
    assert endpoint is not None
    bridge.stop()
    with pytest.raises(ModelCallError, match="model bridge unreachable") as failed:
        Context(endpoint, "exec-1", "task").responses_create(input="x")
    assert failed.value.kind == "bridge_unreachable"


def test_tcp_listener(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    bridge = make_bridge(socket_path="127.0.0.1:0")
    assert bridge.endpoint is not None
    assert bridge.endpoint.startswith("http://127.0.0.1:")
    answer = Context(bridge.endpoint, "exec-1", "task").responses_create(input="tcp")
    assert answer["output_text"] == "echo: tcp"
