"""The work-unit runner's wait for an enforced NetworkPolicy (engine/policy_gate.py), against
real sockets on loopback: a listening canary is "policy not enforced yet", a refused one is
"enforced"."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from evalkube.engine.policy_gate import (
    PolicyNotEnforced,
    canary_reachable,
    wait_for_enforced_policy,
)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield server
    finally:
        server.close()


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port: int = server.getsockname()[1]
    return port


def test_a_refused_canary_means_the_policy_is_enforced() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    assert not canary_reachable(url)
    assert wait_for_enforced_policy(url, timeout=5) < 5


def test_a_canary_that_stays_reachable_fails_with_what_to_do(listener: socket.socket) -> None:
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with pytest.raises(PolicyNotEnforced) as raised:
        wait_for_enforced_policy(url, timeout=1, interval=0.1)
    message = str(raised.value)
    assert url in message
    assert "NetworkPolicy is not enforced" in message
    assert "egress.verifyPolicy=false" in message


def test_the_runner_goes_on_once_the_policy_takes_effect(listener: socket.socket) -> None:
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    attempts_before_close = 3
    seen = threading.Event()

    def accept_then_close() -> None:
        # the "CNI" programs the policy after a few connections got through
        for _ in range(attempts_before_close):
            conn, _ = listener.accept()
            conn.close()
        listener.close()
        seen.set()

    thread = threading.Thread(target=accept_then_close, daemon=True)
    thread.start()
    waited = wait_for_enforced_policy(url, timeout=60, interval=0.05)
    assert seen.is_set()
    assert waited > 0
    thread.join(timeout=5)


def test_a_canary_without_a_port_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="needs a host and a port"):
        canary_reachable("http://10.96.0.40")
