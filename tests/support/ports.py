"""Waiting for a server on a loopback port without taking the port from it.

Tests pick a free port (``bind(("127.0.0.1", 0))``) and poll it until their server listens.
Those ports come from the ephemeral range, so a poll's own connection can be given that very
port as its source: Linux then connects the socket to itself (TCP simultaneous open), the poll
sees a "server", and while that socket lives the real server's ``bind`` fails with
``EADDRINUSE`` (seen in CI: the operator of a test module never listened, every test of the
module failed). :func:`accepts` refuses such a connection.
"""

from __future__ import annotations

import socket


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server accepts connections on ``host:port`` (a self-connection is not one)."""
    with socket.socket() as sock:
        if sock.connect_ex((host, port)) != 0:
            return False
        return bool(sock.getsockname() != sock.getpeername())
