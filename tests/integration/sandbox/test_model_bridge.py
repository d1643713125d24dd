"""The model bridge through every backend: a real HTTP server on a host unix socket.

Isolating sandboxes have no network; the proxy's socket is the one host object bound in
(gVisor needs ``--host-uds=open`` for it). The socket lives in a private (0700) directory next
to a file that must stay out of reach: only the socket itself is bound, not its directory.
"""

from __future__ import annotations

import json
import socketserver
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from evalkube.sandbox import SandboxUnavailable, SpawnRequest
from evalkube.sandbox.hostfs import bridge_mount
from tests.integration.sandbox.support import BACKENDS, backend, leftovers, run


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        request = json.loads(self.rfile.read(length))
        text = f"{request['input']}|{self.headers['X-Evalkube-Execution']}"
        body = json.dumps(
            {
                "id": "resp_1",
                "output": [
                    {
                        "type": "message",
                        "content": [{"type": "output_text", "text": text}],
                    }
                ],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def bridge() -> Iterator[tuple[str, Path]]:
    """``(unix:/path endpoint, a secret file beside the socket)``."""
    home = Path(tempfile.mkdtemp(prefix="bridge-"))
    home.chmod(0o700)
    secret = home / "credentials"
    secret.write_text("sk-not-for-graders")
    server = _UnixHTTPServer(str(home / "bridge.sock"), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"unix:{home / 'bridge.sock'}", secret
    finally:
        server.shutdown()
        server.server_close()
        for path in home.iterdir():
            path.unlink()
        home.rmdir()


GRADER = """
import os

def grade(sample, item, ctx):
    if sample.startswith("/"):
        try:
            leaked = open(sample).read()
        except OSError as exc:
            leaked = type(exc).__name__
        listing = sorted(os.listdir("/run/evalkube"))
        return {"scores": {"s": 0.0}, "judge": {"listing": listing, "leaked": leaked}}
    reply = ctx.responses_create(model="auto", input=sample)
    return {"scores": {"s": 1.0}, "judge": {"text": reply["output_text"]}}
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", BACKENDS)
def test_grader_reaches_the_bridge_and_nothing_else(name: str, bridge: tuple[str, Path]) -> None:
    endpoint, _ = bridge
    executions, restarts = run(backend(name), GRADER, ["hello", "world"], model_endpoint=endpoint)

    assert restarts == 0
    assert [e.status for e in executions] == ["returned", "returned"]
    assert [e.value["judge"]["text"] for e in executions] == ["hello|exec-0", "world|exec-1"]
    assert leftovers().empty


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [n for n in BACKENDS if n != "process"])
def test_only_the_socket_is_bound_in(name: str, bridge: tuple[str, Path]) -> None:
    endpoint, secret = bridge
    executions, _ = run(backend(name), GRADER, [str(secret)], model_endpoint=endpoint)

    assert executions[0].status == "returned", executions[0].error
    judge = executions[0].value["judge"]
    assert judge["listing"] == ["model.sock"]
    assert judge["leaked"] == "FileNotFoundError"


def test_network_bridge_is_refused_with_a_clear_reason() -> None:
    with pytest.raises(SandboxUnavailable, match="unix socket"):
        bridge_mount("http://127.0.0.1:8080")


def test_missing_socket_is_refused_with_a_clear_reason(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="is not there"):
        bridge_mount(f"unix:{tmp_path / 'nope.sock'}")


def test_spawn_request_defaults_to_no_model_access() -> None:
    assert SpawnRequest().model_endpoint is None


MODEL_BACKED = """
def grade(sample, item, ctx):
    calls = 0
    while True:
        try:
            reply = ctx.responses_create(model="auto", input=sample)
            calls += 1
        except Exception as exc:
            return {"scores": {"calls": float(calls)}, "judge": {"error": str(exc),
                    "text": reply["output_text"], "id": reply.get("id")}}
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", BACKENDS)
def test_the_real_model_bridge_counts_calls_from_inside_every_sandbox(
    name: str, tmp_path: Path
) -> None:
    from prometheus_client import CollectorRegistry

    from evalkube.proxy.bridge import ModelBridge
    from evalkube.proxy.upstream import Provider
    from tests.integration.proxy.fake_upstream import FakeUpstream

    key = "sk-sandbox-test-0123456789"
    key_file = tmp_path / "key"
    key_file.write_text(key)
    with FakeUpstream() as upstream:
        provider = Provider("fake", upstream.base_url, api_key_file=str(key_file), timeout=10)
        bridge = ModelBridge(
            {"fake": provider},
            retries=0,
            judge_model="fake:judge-1",
            embedding_model="fake:embed-1",
            registry=CollectorRegistry(),
        )
        bridge.start()
        try:
            bridge.configure_unit("u", 3, 2)
            bridge.open_executions(["exec-0", "exec-1"])
            executions, _ = run(
                backend(name), MODEL_BACKED, ["a", "b"], model_endpoint=bridge.endpoint, timeout=30
            )
            usage = bridge.take_usage(["exec-0", "exec-1"])
        finally:
            bridge.stop()

    assert [e.status for e in executions] == ["returned", "returned"], executions
    for execution in executions:
        assert execution.value["scores"] == {"calls": 3.0}
        assert "budget of 3 exhausted" in execution.value["judge"]["error"]
        assert key not in repr(execution)
    assert usage["exec-0"]["calls"] == usage["exec-1"]["calls"] == 3
