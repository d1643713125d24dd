"""One model call through the model bridge proxy, apart from HTTP (that is :mod:`.routes`).

The proxy builds each upstream request itself: ``model`` is resolved (``auto`` or missing ->
the run's judge / embedding model; ``provider:model`` as given; the upstream sees the bare
name), responses are forced to ``stream=false, store=true, background=false`` (and translated
for ``api: chat_completions`` providers, :mod:`.chat`), and no client header is forwarded (a
grader's ``Authorization`` never reaches a provider). Keys are added by
:class:`~evalkube.proxy.upstream.ProviderAuth` and never appear in answers, logs or metrics.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from prometheus_client import CollectorRegistry

from evalkube.proxy.budgets import BudgetExhausted, Budgets, UnknownExecution
from evalkube.proxy.local_embeddings import LOCAL_PROVIDER, LocalEmbeddings, LocalModelError
from evalkube.proxy.metrics import ProxyMetrics
from evalkube.proxy.upstream import Upstream, UpstreamError
from evalkube.proxy.usage import UsageLedger, token_usage

log = logging.getLogger("evalkube.proxy")

Kind = Literal["responses", "embeddings"]
_DEFAULT_PURPOSE: dict[Kind, str] = {"responses": "judge", "embeddings": "embedding"}
_FORCED_RESPONSE_FLAGS = {"stream": False, "store": True, "background": False}


def error_body(kind: str, message: str, **extra: Any) -> bytes:
    """The OpenAI-shaped error document ``{"error": {"type", "message", ...}}``."""
    return json.dumps({"error": {"type": kind, "message": message, **extra}}).encode()


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    requests: int = 0
    """The call's requests that may have reached the provider (0: none was sent)."""


class CallRecorder(Protocol):
    """Keeps the answers of graders' calls and gives them back to a resumed run (the local
    engine's :class:`evalkube.engine.answers.AnswerLog`)."""

    def replay(self, execution_id: str, kind: str, body: Mapping[str, Any]) -> bytes | None: ...

    def keep(
        self, execution_id: str, kind: str, body: Mapping[str, Any], answer: bytes
    ) -> None: ...


class ProxyService:
    """Model calls over ``upstream``, with fresh budgets, usage and metrics (on ``registry``)."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        judge_model: str | None,
        embedding_model: str | None,
        registry: CollectorRegistry | None = None,
        max_calls_per_execution: int,
        planned_executions: int | None,
        unit_id: str = "default",
    ) -> None:
        self.upstream = upstream
        self.default_models: dict[Kind, str | None] = {
            "responses": judge_model,
            "embeddings": embedding_model,
        }
        self.budgets = Budgets(max_calls_per_execution, planned_executions, unit_id)
        self.metrics = ProxyMetrics(registry if registry is not None else CollectorRegistry())
        self.usage = UsageLedger()
        self.local_embeddings: LocalEmbeddings | None = None
        #: Set by a local run: answers kept as they arrive, kept ones replayed on resume.
        self.recorder: CallRecorder | None = None
        if upstream.on_retry is None:
            upstream.on_retry = self.metrics.retry

    def resolve_model(self, kind: Kind, model: Any) -> tuple[str, str]:
        """``(provider, bare model)`` for the request's ``model`` field; ValueError if unusable."""
        default = self.default_models[kind]
        field = "judgeModel" if kind == "responses" else "embeddingModel"
        if model is None or model == "auto":
            if not default:
                raise ValueError(
                    f"model='auto' needs the run's {field}; set spec.{field} on the EvalRun "
                    "or pass model='provider:model'"
                )
            model = default
        if not isinstance(model, str) or not model.strip():
            raise ValueError("`model` must be a string such as 'openai:gpt-4.1-mini' or 'auto'")
        provider, sep, name = model.partition(":")
        if sep and provider and name:
            if provider != LOCAL_PROVIDER and provider not in self.upstream.providers:
                known = ", ".join(sorted(self.upstream.providers)) or "none"
                raise ValueError(
                    f"model {model!r}: provider {provider!r} is not configured for this run "
                    f"(configured: {known}); declare it under spec.providers"
                )
            return provider, name
        # A bare model name (as OpenAI-hosted graders pass) goes to the provider of the run's
        # default model for this kind, or to the only configured provider.
        if default and ":" in default:
            return default.split(":", 1)[0], model
        if len(self.upstream.providers) == 1:
            return next(iter(self.upstream.providers)), model
        raise ValueError(
            f"model {model!r} names no provider; pass 'provider:{model}' "
            f"(configured: {', '.join(sorted(self.upstream.providers)) or 'none'})"
        )

    async def model_call(
        self,
        kind: Kind,
        raw: bytes,
        execution_id: str | None,
        purpose: str | None,
        *,
        budgeted: bool,
    ) -> Answer:
        purpose = purpose or _DEFAULT_PURPOSE[kind]
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return Answer(400, error_body("invalid_request", "the request body is not valid JSON"))
        if not isinstance(body, dict):
            return Answer(
                400, error_body("invalid_request", "the request body must be a JSON object")
            )
        try:
            provider, model = self.resolve_model(kind, body.get("model"))
        except ValueError as exc:
            return Answer(400, error_body("invalid_request", str(exc)))
        if provider == LOCAL_PROVIDER and kind != "embeddings":
            return Answer(
                400, error_body("invalid_request", "the local provider serves embeddings only")
            )
        body["model"] = model
        if kind == "responses":
            body.update(_FORCED_RESPONSE_FLAGS)
        path, payload = f"/{kind}", b""
        if provider != LOCAL_PROVIDER:
            try:
                if kind == "responses":
                    # Translated here, before any budget is charged: a request that a chat
                    # provider cannot take is refused like any other bad request.
                    path, payload = self.upstream.responses_call(provider, body)
                else:
                    payload = json.dumps(body).encode()
            except UpstreamError as exc:
                return Answer(400, error_body("invalid_request", str(exc), provider=provider))
        if budgeted:
            assert execution_id is not None
            try:
                self.budgets.acquire(execution_id)
            except UnknownExecution as exc:
                self.metrics.rejected("unknown_execution")
                self.metrics.call(purpose, provider, "unknown_execution", None)
                return Answer(403, error_body("unknown_execution", str(exc)))
            except BudgetExhausted as exc:
                self.metrics.rejected(exc.scope)
                self.metrics.call(purpose, provider, "budget_exhausted", None)
                return Answer(429, error_body("budget_exhausted", str(exc), scope=exc.scope))
        if self.recorder is not None and execution_id is not None:
            kept = self.recorder.replay(execution_id, kind, body)
            if kept is not None:  # paid for by this run before it was interrupted
                return self._replayed(kind, execution_id, purpose, kept)
        started = time.perf_counter()
        try:
            if provider == LOCAL_PROVIDER:
                data = await self._local(model, body)
                out, requests = json.dumps(data).encode(), 0
            else:
                reply = await self.upstream.post_call(provider, path, payload)
                data, out, requests = reply.data, reply.raw, reply.requests
        except (UpstreamError, LocalModelError) as exc:
            seconds = time.perf_counter() - started
            status, error_kind = _error_status(exc)
            log.warning(
                "model call failed: %s (execution %s, purpose %s)", exc, execution_id, purpose
            )
            self.metrics.call(purpose, provider, "error", seconds)
            requests = exc.requests if isinstance(exc, UpstreamError) else 0
            if execution_id is not None:
                self.usage.record(
                    execution_id, purpose, latency_ms=seconds * 1000, ok=False, requests=requests
                )
            return Answer(status, error_body(error_kind, str(exc), provider=provider), requests)
        seconds = time.perf_counter() - started
        tokens = token_usage(data)
        response_id = data.get("id") if kind == "responses" else None
        self.metrics.call(purpose, provider, "ok", seconds)
        if tokens:
            self.metrics.add_tokens(purpose, tokens)
        if execution_id is not None:
            if self.recorder is not None:
                self.recorder.keep(execution_id, kind, body, out)
            self.usage.record(
                execution_id,
                purpose,
                latency_ms=seconds * 1000,
                response_id=response_id if isinstance(response_id, str) else None,
                tokens=tokens,
                requests=requests,
            )
        return Answer(200, out, requests)

    def _replayed(self, kind: Kind, execution_id: str, purpose: str, answer: bytes) -> Answer:
        """A kept answer, counted on its execution like the call it answered."""
        try:
            data = json.loads(answer)
        except ValueError:
            data = {}
        data = data if isinstance(data, dict) else {}
        response_id = data.get("id") if kind == "responses" else None
        self.usage.record(
            execution_id,
            purpose,
            latency_ms=0.0,
            response_id=response_id if isinstance(response_id, str) else None,
            tokens=token_usage(data),
        )
        return Answer(200, answer)

    def take_usage(self, execution_ids: list[str] | None) -> dict[str, dict[str, Any]]:
        """Remove and return the usage of ``execution_ids`` (``None``: of every execution) and
        close those tokens: an execution whose usage was taken can call no more."""
        self.budgets.close(
            list(self.budgets.unit.per_execution) if execution_ids is None else execution_ids
        )
        return self.usage.take(execution_ids)

    async def _local(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.local_embeddings is None:
            self.local_embeddings = LocalEmbeddings()
        data = await self.local_embeddings.create(model, body)
        data["model"] = f"{LOCAL_PROVIDER}:{data['model']}"
        return data

    async def aclose(self) -> None:
        await self.upstream.aclose()
        if self.local_embeddings is not None:
            self.local_embeddings.close()
            self.local_embeddings = None


def _error_status(exc: UpstreamError | LocalModelError) -> tuple[int, str]:
    if isinstance(exc, LocalModelError):
        return exc.status, "invalid_request" if exc.status == 400 else "local_model_unavailable"
    known = {
        "credentials": (502, "credentials_rejected"),
        "no_credentials": (502, "credentials_missing"),
        "timeout": (504, "upstream_timeout"),
        "unreachable": (502, "upstream_unreachable"),
        "configuration": (400, "invalid_request"),
    }.get(exc.kind)
    if known is not None:
        return known
    if exc.status == 429:
        return 429, "rate_limited"
    if exc.status is not None and 400 <= exc.status < 500:
        return exc.status, "invalid_request"
    return 502, "upstream_error"
