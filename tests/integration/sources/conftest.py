"""Fixtures of the sources tests: a relay that counts what an S3 server really sends."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.support.s3_server import S3Server


class CountingRelay:
    """A TCP relay on loopback in front of the server, counting the bytes the server sends:
    what a client really downloaded, whatever the client library says."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.downloaded = 0
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self._spawn(self._accept)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self.threads.append(thread)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(self.target)
            self._spawn(self._pipe, client, upstream, False)
            self._spawn(self._pipe, upstream, client, True)

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        with src, dst:
            while chunk := _recv(src):
                if count:
                    with self.lock:
                        self.downloaded += len(chunk)
                try:
                    dst.sendall(chunk)
                except OSError:
                    return
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


@pytest.fixture
def relay(s3_server: S3Server) -> Iterator[CountingRelay]:
    relay = CountingRelay(s3_server.port)
    try:
        yield relay
    finally:
        relay.close()
