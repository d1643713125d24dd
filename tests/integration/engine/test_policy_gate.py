"""The work-unit runner's wait for an enforced NetworkPolicy (engine/policy_gate.py), against
real sockets on loopback: a listening canary is "policy not enforced yet", a refused one is
"enforced"."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from evalkube.engine.policy_gate import (
    IPv6Present,
    PolicyNotEnforced,
    canary_reachable,
    refuse_ipv6,
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


# -- IPv6 ---------------------------------------------------------------------------------------
PROBE = (
    "import json; from evalkube.engine.policy_gate import ipv6_routes; "
    "print(json.dumps(ipv6_routes()))"
)


def _routes_in_a_fresh_netns(setup: str) -> list[str]:
    """``ipv6_routes()`` in a network namespace of its own after the shell ``setup``."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare (util-linux) for a network namespace")
    script = f'{setup}\nexec "{sys.executable}" -c "{PROBE}"'
    out = subprocess.run(
        ["unshare", "--net", "sh", "-euc", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    routes: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return routes


# a link with IPv6 on it, as a pod's veth has: link-local comes with the link going up
VETH = (
    "ip link set lo up; ip link add evk0 type veth peer name evk1; "
    "ip link set evk0 up; ip link set evk1 up; "
    "for i in $(seq 50); do ip -6 addr show dev evk0 | grep -q 'scope link' && "
    "! ip -6 addr show dev evk0 | grep -q tentative && break; sleep 0.1; done"
)


def test_a_link_local_ipv6_address_is_a_route_the_runner_refuses() -> None:
    routes = _routes_in_a_fresh_netns(VETH)
    assert any(r.startswith("ff02::1%evk0 from fe80:") for r in routes), routes
    with pytest.raises(IPv6Present) as refused:
        # the runner's own check, in the same kind of namespace
        _check_in_netns(VETH)
    assert "allowedUnsafeSysctls" in str(refused.value)


def test_with_ipv6_disabled_there_is_no_route() -> None:
    disabled = VETH + "; sysctl -q -w net.ipv6.conf.all.disable_ipv6=1"
    assert _routes_in_a_fresh_netns(disabled) == []
    assert _routes_in_a_fresh_netns("ip link set lo up") == []  # loopback is never a way out


def _check_in_netns(setup: str) -> None:
    """``refuse_ipv6()`` in a fresh netns: re-raised here with its message."""
    routes = _routes_in_a_fresh_netns(setup)
    if routes:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("evalkube.engine.policy_gate.ipv6_routes", lambda: routes)
            refuse_ipv6()
