"""A fake OpenAI-compatible provider for the real-node tier: a real HTTP server (stdlib only),
run as ``python fake_provider.py HOST PORT`` on a host outside the cluster.

The only fake of the tier (paid APIs cannot be called here). ``POST /v1/responses`` answers in
the Responses API shape: for the model ``cand`` (a model under test) the candidate is
``answer: <input>``, or ``WRONG`` when the input contains ``gamma``; for the model ``judge``
the text is the JSON verdict ``correct`` unless the input contains ``WRONG``; a
``score_model`` request (its ``text.format`` named so) gets ``{"steps", "result"}`` with
result 2 when the input contains ``blue``, else 8.
``POST /v1/embeddings`` embeds each input text as ``[len(text), 1.0]``.
``GET /_calls`` returns what it received: ``[{path, model, authorization, answer, request}]``
(every model request, whatever it was answered: it is the bill; ``answer`` is ``ok`` or the
misbehaviour it got, ``request`` a digest of path and body, the same for a call sent again;
``delivered``, for a ``slow`` answer, whether its body was all written: ``null`` while it
dribbles, ``false`` when the client hung up first).

Misbehaviour, switched at run time by ``POST /_mode`` with ``{"mode", "times", "rate",
"retry_after", "delay", "status", "clear_calls"}``: a hit request is answered ``storm429``
(429 with ``Retry-After: retry_after``), ``storm5xx`` (``status``, default 503), ``slow``
(headers at once, the body dribbled over ``delay`` seconds) or ``drop`` (the request read,
the connection closed unanswered: the provider may have billed it). A request is hit its
first ``times`` times (default 1, counted by path and body, so a retry of the same call is
hit until then and answered after), and only when it falls in the share ``rate`` (default 1,
chosen by a digest of the request, so the same requests are hit in every run). ``ok`` (the
default) answers everything. Each ``/_mode`` forgets which requests were hit;
``clear_calls`` also empties ``/_calls``.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import socketserver
import sys
import threading
import time
from typing import Any

CALLS: list[dict[str, Any]] = []
LOCK = threading.Lock()
#: The misbehaviour ``POST /_mode`` set, and how often each request (path and body) was hit.
MODE: dict[str, Any] = {"mode": "ok"}
HITS: dict[str, int] = {}
MODES = ("ok", "storm429", "storm5xx", "slow", "drop")


def _key(path: str, raw: bytes) -> str:
    """Which request this is: the same call sent again has the same key."""
    return hashlib.sha256(path.encode() + b"\0" + raw).hexdigest()


def _fault(key: str) -> str:
    """The misbehaviour this request gets (``ok``: none), counting the hit (under LOCK)."""
    mode = str(MODE.get("mode", "ok"))
    if mode == "ok":
        return mode
    if int(key[:8], 16) / 0x100000000 >= float(MODE.get("rate", 1.0)):
        return "ok"
    hits = HITS.get(key, 0)
    if hits >= int(MODE.get("times", 1)):
        return "ok"
    HITS[key] = hits + 1
    return mode


def _text(body: dict[str, Any]) -> str:
    given = body.get("input", "")
    if isinstance(given, str):
        return given
    return json.dumps(given)


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, fault: str, payload: Any, number: int = 0) -> None:
        if fault == "slow":
            self._misbehave(fault, json.dumps(payload).encode(), number)
        else:
            self._reply(payload)

    def do_GET(self) -> None:
        with LOCK:
            self._reply(list(CALLS))

    def _set_mode(self, body: dict[str, Any]) -> None:
        if body.get("mode", "ok") not in MODES:
            self.send_error(400, f"mode must be one of {', '.join(MODES)}")
            return
        with LOCK:
            MODE.clear()
            MODE.update(body)
            HITS.clear()
            if body.get("clear_calls"):
                CALLS.clear()
            self._reply(dict(MODE))

    def _misbehave(self, fault: str, answer: bytes, number: int = 0) -> None:
        """Answer as ``fault`` says instead of with ``answer``."""
        if fault == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # read it all, answer nothing
            return
        if fault == "slow":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            pause = float(MODE.get("delay", 5.0)) / max(len(answer), 1)
            delivered = True
            try:
                for byte in answer:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(pause)
            except OSError:
                self.close_connection = True  # the client gave up waiting
                delivered = False
            if number:
                with LOCK:
                    if len(CALLS) >= number:  # not cleared by /_mode meanwhile
                        CALLS[number - 1]["delivered"] = delivered
            return
        status = 429 if fault == "storm429" else int(MODE.get("status", 503))
        data = json.dumps({"error": {"message": f"fake {fault}", "type": fault}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if fault == "storm429":
            self.send_header("Retry-After", str(MODE.get("retry_after", 1)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = json.loads(raw or b"{}")
        if self.path == "/_mode":
            self._set_mode(body)
            return
        model = body.get("model", "")
        key = _key(self.path, raw)
        with LOCK:
            fault = _fault(key)
            CALLS.append(
                {
                    "path": self.path,
                    "model": model,
                    "authorization": self.headers.get("Authorization", ""),
                    "answer": fault,
                    "request": key[:16],
                    "delivered": None if fault == "slow" else True,
                }
            )
            number = len(CALLS)
        if fault not in ("ok", "slow"):
            self._misbehave(fault, b"")
            return
        if self.path.endswith("/embeddings"):
            given = body.get("input", "")
            texts = [given] if isinstance(given, str) else list(given)
            data = [
                {"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0]}
                for i, t in enumerate(texts)
            ]
            usage = {"prompt_tokens": len(texts), "total_tokens": len(texts)}
            answer = {"object": "list", "model": model, "data": data, "usage": usage}
            self._answer(fault, answer, number)
            return
        text = _text(body)
        schema = (body.get("text") or {}).get("format") or {}
        if schema.get("name") == "score_model":  # a score_model built-in's strict JSON
            answer = json.dumps({"steps": ["fake score"], "result": 2 if "blue" in text else 8})
        elif model == "judge":
            verdict = "incorrect" if "WRONG" in text else "correct"
            answer = json.dumps({"verdict": verdict, "rationale": "fake judge"})
        else:
            answer = "WRONG" if "gamma" in text else f"answer: {text}"
        self._answer(
            fault,
            {
                "id": f"resp_fake_{number:04d}",
                "object": "response",
                "model": model,
                "status": "completed",
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": answer}],
                    }
                ],
                "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
            },
            number,
        )


class Server(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:
        # http.server looks its own address up in DNS here, which hangs where none answers
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "fake-provider", self.server_address[1]


if __name__ == "__main__":
    server = Server((sys.argv[1], int(sys.argv[2])), Handler)
    server.serve_forever()
