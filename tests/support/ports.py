"""Waiting for a server on a loopback port without taking the port from it.

Tests pick a free port (``bind(("127.0.0.1", 0))``) and poll it until their server listens.
Those ports come from the ephemeral range, so a poll's own connection can be given that very
port as its source: Linux then connects the socket to itself (TCP simultaneous open), the poll
sees a "server", and while that socket lives the real server's ``bind`` fails with
``EADDRINUSE`` (seen in CI: the operator of a test module never listened, every test of the
module failed). :func:`free_port` therefore picks ports outside the ephemeral range, where
no connection's source port can land, and :func:`accepts` refuses a self-connection anyway.

Nor from Kubernetes' NodePort range (:data:`NODE_PORTS`): on the real node, kube-router lets a
pod reach the node's own addresses on those ports before it applies the pod's egress policy
(its "allow LOCAL TCP traffic to node ports" rule), so a control plane whose API server port
landed there (one start in ten) was reachable from every grader pod through the `kubernetes`
Service (docs/security.md, Known gaps).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: The lowest port handed out (below it: well-known and registered services' habits).
LOWEST = 10_000
#: Kubernetes' default NodePort range (``--service-node-port-range``), which kube-router's
#: NetworkPolicy exempts on the node's own addresses: never handed out.
NODE_PORTS = range(30_000, 32_768)
#: Candidates tried before falling back to the kernel's choice.
TRIES = 200


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of source ports (``net.ipv4.ip_local_port_range``)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32_768, 60_999
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, outside the ephemeral range (so polling it before its
    server listens can never connect a socket to itself) and outside :data:`NODE_PORTS`; the
    kernel's choice if none of :data:`TRIES` random candidates binds."""
    low, high = _ephemeral_range()
    outside = [
        port for port in (*range(LOWEST, low), *range(high + 1, 65_536)) if port not in NODE_PORTS
    ]
    for port in random.sample(outside, min(TRIES, len(outside))):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server accepts connections on ``host:port`` (a self-connection is not one)."""
    with socket.socket() as sock:
        if sock.connect_ex((host, port)) != 0:
            return False
        return bool(sock.getsockname() != sock.getpeername())
