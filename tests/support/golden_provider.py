"""A fake OpenAI server answering the golden cases (stdlib only), for the real-node tier:
``python golden_provider.py GOLDEN_JSON HOST PORT`` on a host outside the cluster.

``POST /v1/responses``: a model under test asked ``golden case <id>`` answers that case's
sample (``output_text``, and its ``output_tools`` as ``function_call`` items); a judge (its
``text.format`` named ``score_model``/``label_model``) asked about ``case <id>:`` answers the
case's ``judge_answer``. ``POST /v1/embeddings`` embeds each text as ``[len(text), 1.0]``.
``GET /_calls`` returns what it received: ``[{path, model, authorization}]``.
"""

from __future__ import annotations

import http.server
import json
import re
import socketserver
import sys
import threading
from typing import Any

CASES: dict[str, dict[str, Any]] = {}
CALLS: list[dict[str, Any]] = []
LOCK = threading.Lock()
_CANDIDATE = re.compile(r"golden case (\S+)")
_JUDGED = re.compile(r"case (\S+):")


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text}]}  # fmt: skip


def _answer(body: dict[str, Any]) -> list[dict[str, Any]]:
    given = body.get("input")
    text = given if isinstance(given, str) else json.dumps(given)
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("name") in ("score_model", "label_model"):
        found = _JUDGED.search(text)
        assert found is not None, text
        answer = CASES[found.group(1)]["judge_answer"]
        return [_message(answer if isinstance(answer, str) else json.dumps(answer))]
    found = _CANDIDATE.search(text)
    assert found is not None, text
    sample = CASES[found.group(1)]["sample"]
    calls = [
        {"type": "function_call", "id": f"fc_{i}", "call_id": call["id"],
         "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        for i, call in enumerate(sample.get("output_tools") or [])
    ]  # fmt: skip
    return [*calls, _message(sample["output_text"])]


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
        with LOCK:
            CALLS.append({"path": self.path, "model": body.get("model", ""),
                          "authorization": self.headers.get("Authorization", "")})  # fmt: skip
            number = len(CALLS)
        if self.path.endswith("/embeddings"):
            texts = body.get("input")
            texts = texts if isinstance(texts, list) else [texts]
            self._reply({"object": "list", "model": body.get("model"),
                         "data": [{"object": "embedding", "index": i,
                                   "embedding": [float(len(str(t))), 1.0]}
                                  for i, t in enumerate(texts)]})  # fmt: skip
            return
        usage = {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}
        self._reply({"id": f"resp_golden_{number:04d}", "object": "response",
                     "model": body.get("model"), "status": "completed", "output": _answer(body),
                     "usage": usage})  # fmt: skip


class Server(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:
        # http.server looks its own address up in DNS here, which hangs where none answers
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "golden-provider", self.server_address[1]


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as golden:
        CASES.update({c["id"]: c for c in json.load(golden)["cases"]})
    Server((sys.argv[2], int(sys.argv[3])), Handler).serve_forever()
