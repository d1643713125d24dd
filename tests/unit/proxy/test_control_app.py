"""The bridge's control listener in process (aiohttp's test server on loopback): its bodies
are validated by declared shapes and ``/metrics`` is prometheus_client's handler."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from evalkube.proxy.routes import ProxyApps
from evalkube.proxy.service import ProxyService
from evalkube.proxy.upstream import Provider, Upstream

pytestmark = pytest.mark.timeout(20)

Body = Callable[[TestClient[Any, Any]], Awaitable[None]]


def serve(body: Body) -> None:
    async def main() -> None:
        service = ProxyService(
            Upstream({"openai": Provider("openai", "http://127.0.0.1:9")}),
            judge_model="openai:judge",
            embedding_model=None,
            registry=CollectorRegistry(),
            max_calls_per_execution=0,
            planned_executions=0,
        )
        service.metrics.call("judge", "openai", "ok", 0.01)
        try:
            async with TestClient(TestServer(ProxyApps(service).control_app())) as client:
                await body(client)
        finally:
            await service.aclose()

    asyncio.run(main())


async def error(response: Any) -> str:
    assert response.status == 400
    payload = await response.json()
    assert payload["error"]["type"] == "invalid_request"
    return str(payload["error"]["message"])


def test_a_bad_budget_names_each_wrong_field_and_the_shape() -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        sent = {"unit_id": "u", "max_calls_per_execution": True, "planned_executions": -1}
        message = await error(await client.put("/evalkube/v1/budget", json=sent))
        assert message.startswith(
            "max_calls_per_execution: Input should be a valid integer; "
            "planned_executions: Input should be greater than or equal to 0; send {"
        )
        message = await error(await client.put("/evalkube/v1/budget", data=b"{"))
        assert message.startswith("body: Invalid JSON")
        good = {"unit_id": "u", "max_calls_per_execution": 2, "planned_executions": 3}
        answer = await client.put("/evalkube/v1/budget", json=good)
        assert answer.status == 200
        assert (await answer.json())["max_calls_per_execution"] == 2

    serve(body)


def test_a_bad_token_is_named_by_its_position() -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        sent = {"tokens": ["ok", "", "x" * 257, "bad\n"]}
        message = await error(await client.post("/evalkube/v1/executions:open", json=sent))
        assert "tokens[1]: String should have at least 1 character" in message
        assert "tokens[2]: String should have at most 256 characters" in message
        assert "tokens[3]: Value error, must be printable" in message
        assert "tokens[0]" not in message
        opened = await client.post("/evalkube/v1/executions:open", json={"tokens": ["a", "b"]})
        assert await opened.json() == {"opened": 2}

    serve(body)


def test_usage_take_accepts_ids_or_star_only() -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        message = await error(await client.post("/evalkube/v1/usage:take", json={"ids": []}))
        assert message.startswith("execution_ids: Field required; send {")
        every = await client.post("/evalkube/v1/usage:take", json={"execution_ids": "*"})
        assert (every.status, await every.json()) == (200, {})
        some = await client.post("/evalkube/v1/usage:take", json={"execution_ids": ["a"]})
        assert (some.status, await some.json()) == (200, {})

    serve(body)


def test_metrics_speak_prometheus_negotiation() -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        name = "evalkube_proxy_model_calls_total"
        text = await (await client.get("/metrics", params={"name[]": name})).text()
        assert 'evalkube_proxy_model_calls_total{outcome="ok",provider="openai"' in text
        assert "evalkube_proxy_model_call_duration_seconds" not in text
        openmetrics = await client.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        assert openmetrics.headers["Content-Type"].startswith("application/openmetrics-text")

    serve(body)
