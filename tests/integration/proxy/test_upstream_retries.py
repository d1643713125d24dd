"""The retry policy of :class:`Upstream` itself, against the fake provider on loopback.

The bridge tests (``test_proxy.py``) see retries through the proxy's answers and metrics, for
both engines; these drive the Python :class:`Upstream` directly, so they can check what the
bridge cannot see: the attempt count of a reply, each ``on_retry`` call and its label, which
statuses are never retried, and how long the waits between attempts are.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from evalkube.proxy.egress import EgressGateway
from evalkube.proxy.upstream import Provider, Upstream, UpstreamError, UpstreamReply
from tests.integration.proxy.fake_upstream import FakeUpstream, Scripted
from tests.support.ports import free_port

BODY = {"model": "judge-1", "input": "x"}


def post(fake_url: str, *, timeout: float = 10.0, **options: Any) -> tuple[Any, list[str]]:
    """One ``/responses`` call through a fresh :class:`Upstream`: the reply (or the
    :class:`UpstreamError` it raised) and the ``on_retry`` reasons, in order."""
    reasons: list[str] = []

    def on_retry(provider: str, reason: str) -> None:
        assert provider == "fake"
        reasons.append(reason)

    async def call() -> UpstreamReply:
        provider = Provider("fake", fake_url, timeout=timeout)
        async with Upstream({"fake": provider}, on_retry=on_retry, **options) as upstream:
            path, payload = upstream.responses_call("fake", BODY)
            return await upstream.post("fake", path, payload)

    try:
        return asyncio.run(call()), reasons
    except UpstreamError as exc:
        return exc, reasons


def test_each_retry_is_reported_once_with_its_reason(upstream: FakeUpstream) -> None:
    upstream.then(Scripted(429), Scripted(503), Scripted(500))
    reply, reasons = post(upstream.base_url, retries=3, backoff_base=0.01)
    assert isinstance(reply, UpstreamReply)
    assert reply.attempts == 4
    assert reply.data["output"][0]["content"][0]["text"] == "echo: x"
    assert reasons == ["429", "503", "500"]
    assert len(upstream.received) == 4


def test_a_first_answer_is_one_attempt_and_no_retry(upstream: FakeUpstream) -> None:
    reply, reasons = post(upstream.base_url, retries=3)
    assert isinstance(reply, UpstreamReply)
    assert reply.attempts == 1
    assert reasons == []


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_client_errors_are_never_retried(upstream: FakeUpstream, status: int) -> None:
    upstream.then(Scripted(status, {"error": {"message": "no"}}))
    failure, reasons = post(upstream.base_url, retries=3, backoff_base=0.01)
    assert isinstance(failure, UpstreamError)
    assert failure.status == status
    assert failure.kind == ("credentials" if status in (401, 403) else "http")
    assert "attempts" not in str(failure)
    assert reasons == []
    assert len(upstream.received) == 1


def test_a_final_client_error_after_retries_is_not_counted_as_exhaustion(
    upstream: FakeUpstream,
) -> None:
    upstream.then(Scripted(500), Scripted(400, {"error": {"message": "bad request"}}))
    failure, reasons = post(upstream.base_url, retries=3, backoff_base=0.01)
    assert isinstance(failure, UpstreamError)
    assert str(failure) == "provider fake answered HTTP 400: bad request"
    assert reasons == ["500"]
    assert len(upstream.received) == 2


def test_timeouts_are_retried_and_counted(upstream: FakeUpstream) -> None:
    upstream.then(Scripted(200, delay=2.0), Scripted(200, delay=2.0))
    failure, reasons = post(upstream.base_url, timeout=0.2, retries=1, backoff_base=0.01)
    assert isinstance(failure, UpstreamError)
    assert failure.kind == "timeout"
    assert str(failure) == "provider fake timed out after 0.2 s (after 2 attempts)"
    assert reasons == ["timeout"]


def test_unreachable_is_retried_with_its_kind_as_reason() -> None:
    port = free_port()  # nothing listens; outside the ephemeral range: no self-connection
    failure, reasons = post(f"http://127.0.0.1:{port}/v1", retries=2, backoff_base=0.01)
    assert isinstance(failure, UpstreamError)
    assert failure.kind == "unreachable"
    assert str(failure).endswith("(Connection refused) (after 3 attempts)")
    assert reasons == ["unreachable", "unreachable"]


def test_an_unreadable_egress_grant_is_retried_as_unreachable(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A grant not mounted yet (or being rotated) may be readable at the next attempt."""
    grant = tmp_path / "grant"
    egress = EgressGateway("http://127.0.0.1:9", grant)
    failure, reasons = post(upstream.base_url, retries=1, backoff_base=0.01, egress=egress)
    assert isinstance(failure, UpstreamError)
    assert failure.kind == "unreachable"
    assert str(failure) == (
        f"provider fake is unreachable at http://127.0.0.1:{upstream.port}: connection failed "
        f"(egress grant {grant} unreadable: No such file or directory) (after 2 attempts)"
    )
    assert reasons == ["unreachable"]
    assert upstream.received == []


def test_retry_after_is_honoured_instead_of_the_backoff(upstream: FakeUpstream) -> None:
    upstream.then(Scripted(503, headers={"Retry-After": "0.5"}))
    started = time.monotonic()
    reply, reasons = post(upstream.base_url, retries=1, backoff_base=0.001)
    assert isinstance(reply, UpstreamReply)
    assert time.monotonic() - started >= 0.5
    assert reasons == ["503"]


def test_retry_after_is_capped_at_backoff_max(upstream: FakeUpstream) -> None:
    upstream.then(Scripted(429, headers={"Retry-After": "120"}))
    started = time.monotonic()
    reply, _ = post(upstream.base_url, retries=1, backoff_max=0.1)
    assert isinstance(reply, UpstreamReply)
    assert reply.attempts == 2
    assert time.monotonic() - started < 10


def test_backoff_doubles_from_backoff_base(upstream: FakeUpstream) -> None:
    """Waits of base * 2**n, jittered down to half at most: 0.1 + 0.2 + 0.4 s halved is at
    least 0.35 s (a constant backoff at most 0.3 s)."""
    upstream.then(Scripted(500), Scripted(500), Scripted(500))
    started = time.monotonic()
    reply, _ = post(upstream.base_url, retries=3, backoff_base=0.1)
    assert isinstance(reply, UpstreamReply)
    assert reply.attempts == 4
    assert time.monotonic() - started >= 0.35


def test_backoff_is_capped_at_backoff_max(upstream: FakeUpstream) -> None:
    upstream.then(Scripted(500), Scripted(500))
    started = time.monotonic()
    reply, _ = post(upstream.base_url, retries=2, backoff_base=20.0, backoff_max=0.05)
    assert isinstance(reply, UpstreamReply)
    assert reply.attempts == 3
    assert time.monotonic() - started < 10
