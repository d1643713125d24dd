"""A fake OpenAI-compatible provider: a real aiohttp server on loopback, in its own thread.

It speaks the Responses, Chat Completions and Embeddings API shapes; ``chat_only=True`` makes
it a server without ``/v1/responses`` (404), as many vLLM, llama.cpp and Ollama setups are.

The only fake of the proxy tests (paid APIs cannot be called here). It records every
request it receives (path, headers, JSON body) and answers from a script of canned replies
(status, headers, body, delay) before falling back to a normal answer, so tests can ask for
429s with Retry-After, 500s, 401s, slow answers or error texts that echo the key.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Scripted:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class FakeUpstream:
    """``with FakeUpstream() as up: up.base_url`` -> ``http://127.0.0.1:PORT/v1``."""

    def __init__(
        self, ssl_context: ssl.SSLContext | None = None, *, chat_only: bool = False
    ) -> None:
        """``ssl_context``: serve https (the egress tests tunnel through the gateway);
        ``chat_only``: no ``/v1/responses`` route."""
        self.ssl_context = ssl_context
        self.chat_only = chat_only
        self.received: list[Received] = []
        self.script: deque[Scripted] = deque()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application()
        if not self.chat_only:
            app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}/v1"

    # -- behaviour ---------------------------------------------------------------------------
    def then(self, *replies: Scripted) -> None:
        """Answer the next requests with ``replies`` (in order), then normally again."""
        with self._lock:
            self.script.extend(replies)

    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.received]

    async def _record(self, request: web.Request) -> Scripted | None:
        body = await request.json()
        with self._lock:
            self.received.append(Received(request.path, dict(request.headers), body))
            scripted = self.script.popleft() if self.script else None
        if scripted is not None and scripted.delay:
            await asyncio.sleep(scripted.delay)
        return scripted

    async def _responses(self, request: web.Request) -> web.Response:
        scripted = await self._record(request)
        if scripted is not None and (scripted.status != 200 or scripted.body is not None):
            return _reply(scripted)
        body = await request.json()  # this request's (others may have arrived meanwhile)
        number = next(self._ids)
        return web.json_response(
            {
                "id": f"resp_{number:04d}",
                "object": "response",
                "model": body.get("model"),
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": f"echo: {body.get('input')}"}],
                    }
                ],
                "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
            }
        )

    async def _chat(self, request: web.Request) -> web.Response:
        """Chat Completions: ``messages`` required (400 otherwise, as OpenAI and vLLM answer);
        the answer echoes the last message's content."""
        scripted = await self._record(request)
        if scripted is not None and (scripted.status != 200 or scripted.body is not None):
            return _reply(scripted)
        body = await request.json()  # this request's (others may have arrived meanwhile)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return web.json_response(
                {
                    "error": {
                        "message": "'messages' is a required property",
                        "type": "invalid_request_error",
                    }
                },
                status=400,
            )
        number = next(self._ids)
        return web.json_response(
            {
                "id": f"chatcmpl-{number:04d}",
                "object": "chat.completion",
                "created": 1764720000 + number,
                "model": body.get("model"),
                "system_fingerprint": "fp_fake",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": f"echo: {messages[-1].get('content')}",
                        },
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            }
        )

    async def _embeddings(self, request: web.Request) -> web.Response:
        scripted = await self._record(request)
        if scripted is not None and scripted.status != 200:
            return _reply(scripted)
        body = await request.json()  # this request's (others may have arrived meanwhile)
        inputs = body.get("input")
        texts = inputs if isinstance(inputs, list) else [inputs]
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": [float(len(str(t))), 1.0]}
                    for i, t in enumerate(texts)
                ],
                "model": body.get("model"),
                "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)},
            }
        )


def _reply(scripted: Scripted) -> web.Response:
    payload = scripted.body if scripted.body is not None else {"error": {"message": "scripted"}}
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return web.Response(
        status=scripted.status,
        text=text,
        content_type="application/json",
        headers=scripted.headers,
    )
