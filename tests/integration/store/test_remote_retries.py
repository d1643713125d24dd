"""The runner's view of the store (:class:`RemoteStore`) against a real HTTP server on loopback:
it waits out a replica that does not know the run yet (404) or an operator restarting (503),
and stops at once on a refusal that waiting cannot fix (401)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from evalkube.store.remote import IngestUnreachable, RemoteStore, RemoteStoreError

pytestmark = pytest.mark.timeout(60)


class ScriptedIngest:
    """Answers each POST with the next scripted status (then 200 forever)."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append(self.headers.get("Authorization", ""))
                status = outer.script.pop(0) if outer.script else 200
                body = (
                    {"recorded": 1}
                    if status == 200
                    else {"error": {"message": f"scripted {status}"}}
                )
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ingest(request: pytest.FixtureRequest) -> Iterator[ScriptedIngest]:
    server = ScriptedIngest(request.param)
    yield server
    server.close()


def store(url: str, retry_seconds: float = 30.0) -> RemoteStore:
    return RemoteStore(url, "team-a", "nightly", "tok", retry_seconds=retry_seconds)


@pytest.mark.parametrize("ingest", [[404, 404, 503, 502]], indirect=True)
def test_unknown_run_and_restarting_operator_are_waited_out(ingest: ScriptedIngest) -> None:
    remote = store(ingest.url)
    try:
        remote.mark_unit_done("qa.m.00000", {"samples": 1})
    finally:
        remote.close()
    assert len(ingest.requests) == 5
    assert set(ingest.requests) == {"Bearer tok"}


@pytest.mark.parametrize("ingest", [[401, 401]], indirect=True)
def test_a_wrong_token_fails_at_once(ingest: ScriptedIngest) -> None:
    remote = store(ingest.url)
    try:
        with pytest.raises(RemoteStoreError, match="HTTP 401: scripted 401"):
            remote.mark_unit_done("qa.m.00000", {})
    finally:
        remote.close()
    assert len(ingest.requests) == 1


@pytest.mark.parametrize("ingest", [[404] * 1000], indirect=True)
def test_waiting_ends_at_the_retry_deadline(ingest: ScriptedIngest) -> None:
    remote = store(ingest.url, retry_seconds=1.0)
    try:
        with pytest.raises(IngestUnreachable, match=r"retry window is 1 s.*HTTP 404"):
            remote.mark_unit_done("qa.m.00000", {})
    finally:
        remote.close()
    assert 2 <= len(ingest.requests) < 10


def test_a_server_that_never_answers_is_given_up_within_the_window() -> None:
    """A partition that drops packets answers nothing: no attempt may wait past the window
    (with the 60 s per-request timeout alone, one attempt held the unit for a minute)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts (the kernel does), never reads, never answers
    remote = store(f"http://127.0.0.1:{silent.getsockname()[1]}", retry_seconds=2.0)
    started = time.monotonic()
    try:
        with pytest.raises(IngestUnreachable, match="ReadTimeout"):
            remote.mark_unit_done("qa.m.00000", {})
    finally:
        remote.close()
        silent.close()
    assert time.monotonic() - started < 6.0
