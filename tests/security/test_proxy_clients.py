"""A hostile grader talking raw HTTP to the model bridge: both proxies must stay up and strict.

The grader's socket is the only way out of its sandbox, so whatever a grader sends there is an
attack surface: oversized bodies and headers, half-sent requests that never finish, smuggling
attempts with conflicting lengths, control characters in the execution id, hundreds of idle
connections. Each attack runs against the Python and the native proxy; after each, an honest
call must still work, and nothing may reach the provider that the budgets did not count.
"""

from __future__ import annotations

import contextlib
import socket
import time

import pytest

from evalkube_sandbox.ctx import Context
from tests.integration.proxy.conftest import OPEN_TOKEN, MakeBridge
from tests.integration.proxy.fake_upstream import FakeUpstream

pytestmark = pytest.mark.timeout(60)


def connect(endpoint: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # A blocking connect waits for room in the listen backlog (a non-blocking one on a unix
    # socket fails with EAGAIN instead: a client artifact, not the proxy's).
    sock.connect(endpoint.removeprefix("unix:"))
    sock.settimeout(10)
    return sock


def exchange(endpoint: str, raw: bytes) -> bytes:
    """Send ``raw`` and read until the proxy answers and closes or goes quiet."""
    with connect(endpoint) as sock:
        # It may close on us before reading everything: that is a refusal too.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(raw)
        chunks = []
        sock.settimeout(3)
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0


def still_serves(endpoint: str) -> None:
    answer = Context(endpoint, OPEN_TOKEN, "task").responses_create(input="still there?")
    assert answer["output_text"] == "echo: still there?"


def request(body: bytes, *headers: str) -> bytes:
    head = "POST /v1/responses HTTP/1.1\r\nHost: bridge\r\nContent-Type: application/json\r\n"
    head += "".join(f"{h}\r\n" for h in headers)
    return head.encode() + b"\r\n" + body


def test_oversized_body_is_refused(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    bridge = make_bridge()
    assert bridge.endpoint is not None
    body = b'{"input": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    answer = exchange(
        bridge.endpoint,
        request(body, "X-Evalkube-Execution: big", f"Content-Length: {len(body)}"),
    )
    assert status_of(answer) == 413
    assert upstream.received == []
    still_serves(bridge.endpoint)


def test_oversized_headers_are_refused(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    bridge = make_bridge()
    assert bridge.endpoint is not None
    answer = exchange(
        bridge.endpoint,
        request(b"{}", "X-Evalkube-Execution: h", "X-Pad: " + "a" * 200_000, "Content-Length: 2"),
    )
    assert status_of(answer) in (400, 431) or answer == b""
    assert upstream.received == []
    still_serves(bridge.endpoint)


def test_half_sent_requests_do_not_block_others(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    bridge = make_bridge()
    assert bridge.endpoint is not None
    with contextlib.ExitStack() as held:
        for n in range(50):
            sock = held.enter_context(connect(bridge.endpoint))
            sock.sendall(
                request(b'{"inp', f"X-Evalkube-Execution: slow-{n}", "Content-Length: 500")
            )
        for _ in range(200):
            held.enter_context(connect(bridge.endpoint))
        started = time.monotonic()
        still_serves(bridge.endpoint)
        assert time.monotonic() - started < 5
    assert len(upstream.received) == 1  # only the honest call


def test_conflicting_lengths_are_not_smuggled(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    """Content-Length plus chunked is ambiguous framing (RFC 9112 6.3). aiohttp refuses it
    (400). Go's server would let Transfer-Encoding win and read what follows the chunks as
    the next request, so the native grader listener refuses chunked bodies (411) and closes
    the connection. Either way the hidden request is never served."""
    bridge = make_bridge()
    bridge.configure_unit("u", 64, 1)
    # both tokens open, so only the framing can keep the hidden request from being served
    bridge.open_executions([OPEN_TOKEN, "outer", "smuggled"])
    assert bridge.endpoint is not None
    hidden = request(b"{}", "X-Evalkube-Execution: smuggled", "Content-Length: 2")
    body = b"0\r\n\r\n" + hidden
    answer = exchange(
        bridge.endpoint,
        request(
            body,
            "X-Evalkube-Execution: outer",
            f"Content-Length: {len(body)}",
            "Transfer-Encoding: chunked",
        ),
    )
    assert status_of(answer) in (400, 411)
    time.sleep(0.2)  # a served hidden request would have been recorded by now
    assert bridge.take_usage(["smuggled"]) == {}
    assert all(r.body.get("input") != "smuggled" for r in upstream.received)
    still_serves(bridge.endpoint)


@pytest.mark.parametrize("execution_id", ["tab\there", "x" * 300])
def test_unusable_execution_ids_are_refused(
    make_bridge: MakeBridge, upstream: FakeUpstream, execution_id: str
) -> None:
    bridge = make_bridge()
    assert bridge.endpoint is not None
    answer = exchange(
        bridge.endpoint,
        request(b"{}", f"X-Evalkube-Execution: {execution_id}", "Content-Length: 2"),
    )
    assert status_of(answer) == 400
    assert b"missing_execution_id" in answer
    assert upstream.received == []
