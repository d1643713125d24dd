"""A fake OpenAI-compatible provider for the real-node tier: a real HTTP server (stdlib only),
run as ``python fake_provider.py HOST PORT`` on a host outside the cluster.

The only fake of the tier (paid APIs cannot be called here). ``POST /v1/responses`` answers in
the Responses API shape: for the model ``cand`` (a model under test) the candidate is
``answer: <input>``, or ``WRONG`` when the input contains ``gamma``; for the model ``judge``
the text is the JSON verdict ``correct`` unless the input contains ``WRONG``; a
``score_model`` request (its ``text.format`` named so) gets ``{"steps", "result"}`` with
result 2 when the input contains ``blue``, else 8.
``POST /v1/embeddings`` embeds each input text as ``[len(text), 1.0]``.
``GET /_calls`` returns what it received: ``[{path, model, authorization}]``.
"""

from __future__ import annotations

import http.server
import json
import socketserver
import sys
import threading
from typing import Any

CALLS: list[dict[str, Any]] = []
LOCK = threading.Lock()


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

    def do_GET(self) -> None:
        with LOCK:
            self._reply(list(CALLS))

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        model = body.get("model", "")
        with LOCK:
            CALLS.append(
                {
                    "path": self.path,
                    "model": model,
                    "authorization": self.headers.get("Authorization", ""),
                }
            )
            number = len(CALLS)
        if self.path.endswith("/embeddings"):
            given = body.get("input", "")
            texts = [given] if isinstance(given, str) else list(given)
            data = [
                {"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0]}
                for i, t in enumerate(texts)
            ]
            usage = {"prompt_tokens": len(texts), "total_tokens": len(texts)}
            self._reply({"object": "list", "model": model, "data": data, "usage": usage})
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
        self._reply(
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
            }
        )


class Server(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:
        # http.server looks its own address up in DNS here, which hangs where none answers
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "fake-provider", self.server_address[1]


if __name__ == "__main__":
    server = Server((sys.argv[1], int(sys.argv[2])), Handler)
    server.serve_forever()
