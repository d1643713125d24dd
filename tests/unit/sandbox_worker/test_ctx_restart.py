"""``ctx`` sends a model call again while the proxy sidecar restarts: a real unix-socket
server (as the sidecar listens) that hangs up on the first request unanswered, or that is not
there yet, then answers."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from evalkube_sandbox import ctx as ctx_module
from evalkube_sandbox.ctx import Context, ModelCallError

ANSWER = {"id": "resp_1", "output": [{"type": "message", "content": [
    {"type": "output_text", "text": "yes"}]}]}  # fmt: skip


class Bridge:
    """A unix-socket HTTP server: the first ``drop`` requests are read and hung up on, the
    rest answered; ``requests`` holds each one's headers and body."""

    def __init__(self, path: Path, drop: int) -> None:
        self.path, self.drop = path, drop
        self.requests: list[tuple[str, bytes]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":", 1)[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                )
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests.append((head.decode(), body))
                if len(self.requests) <= self.drop:
                    continue  # read it all, answer nothing: the process was killed
                payload = json.dumps(ANSWER).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                    + payload
                )

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "model.sock"


def test_a_call_the_bridge_hung_up_on_is_sent_again_and_answered(socket_path: Path) -> None:
    bridge = Bridge(socket_path, drop=1)
    try:
        ctx = Context(f"unix:{socket_path}", "exec-1", "task", timeout=10)
        response = ctx.responses_create(model="auto", input="is it?")
    finally:
        bridge.close()
    assert response["output_text"] == "yes"
    (first_head, first_body), (second_head, second_body) = bridge.requests
    assert first_body == second_body == json.dumps({"model": "auto", "input": "is it?"}).encode()
    assert "X-Evalkube-Execution: exec-1" in first_head
    assert "X-Evalkube-Execution: exec-1" in second_head


def test_a_bridge_restarting_is_waited_for(socket_path: Path) -> None:
    """The socket file is left by the killed process (connection refused), then the new
    process binds it again a second later."""
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_path))
    stale.close()  # a socket file nobody listens on: connect() is refused
    bridges: list[Bridge] = []

    def restart() -> None:
        time.sleep(1.0)
        socket_path.unlink()
        bridges.append(Bridge(socket_path, drop=0))

    restarter = threading.Thread(target=restart)
    restarter.start()
    try:
        ctx = Context(f"unix:{socket_path}", "exec-1", "task", timeout=10)
        started = time.monotonic()
        assert ctx.responses_create(input="x")["output_text"] == "yes"
        assert 0.9 < time.monotonic() - started < 5
    finally:
        restarter.join()
        for bridge in bridges:
            bridge.close()
    assert len(bridges[0].requests) == 1


def test_a_bridge_that_stays_down_fails_after_the_bound(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ctx_module, "RESTART_RETRY_SECONDS", 0.5)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_path))
    stale.close()  # killed, never restarted: connect() is refused
    ctx = Context(f"unix:{socket_path}", "exec-1", "task", timeout=10)
    started = time.monotonic()
    with pytest.raises(ModelCallError) as failure:
        ctx.responses_create(input="x")
    assert failure.value.kind == "bridge_unreachable"
    assert "sent again for 0.5 s" in str(failure.value)
    assert time.monotonic() - started < 2


def test_a_stopped_bridge_fails_at_once(socket_path: Path) -> None:
    """A proxy stopped (not killed) removed its socket: nothing restarts, nothing to wait for."""
    ctx = Context(f"unix:{socket_path}", "exec-1", "task", timeout=10)
    started = time.monotonic()
    with pytest.raises(ModelCallError, match="No such file") as failure:
        ctx.responses_create(input="x")
    assert failure.value.kind == "bridge_unreachable"
    assert time.monotonic() - started < 1
