"""The model bridge proxy: an aiohttp server between graders and model providers.

Two listeners, each TCP (``host:port``) or a unix socket (``unix:/path``):

- the **grader listener** serves the untrusted side: ``POST /v1/responses`` and
  ``POST /v1/embeddings`` (OpenAI API shapes) and nothing else (no health, no metrics: nothing
  about other executions or the run leaks to graders). Every model call must carry an open
  execution token in ``X-Evalkube-Execution`` and is charged to that execution's budget and
  to the unit's total; any other token is refused with 403 before anything is charged.
- the **control listener** serves the trusted runner: the same model routes without budgets
  (purpose ``candidate`` for responses unless ``X-Evalkube-Purpose`` says otherwise) plus
  ``POST /evalkube/v1/executions:open``, ``POST /evalkube/v1/usage:take`` (which closes the
  tokens it takes), ``GET|PUT /evalkube/v1/budget``, ``/healthz`` and ``/metrics``. Control
  routes exist on this listener only; with a control token configured, every control request
  must also send it in ``X-Evalkube-Control-Token``.

The proxy builds each upstream request itself: the body's ``model`` is resolved (``auto`` or
missing -> the run's judge / embedding model; ``provider:model`` as given; the upstream sees the
bare model name), responses are forced to ``stream=false, store=true, background=false`` (and
translated to Chat Completions for ``api: chat_completions`` providers, :mod:`.chat`), and
no client header is forwarded (a grader's ``Authorization`` never reaches a provider). Keys are
added by :class:`~evalkube.proxy.upstream.ProviderAuth` and never appear in answers, logs or
metrics.

Who uses it: ``evalkube proxy`` (:func:`serve_forever`, the pod sidecar) and
:class:`evalkube.proxy.bridge.ModelBridge` (the local engine, in a background thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from evalkube import limits
from evalkube.proxy.bodies import EXECUTIONS_OPEN, UNIT_BUDGET, USAGE_TAKE
from evalkube.proxy.budgets import BudgetExhausted, Budgets, UnknownExecution
from evalkube.proxy.local_embeddings import LOCAL_PROVIDER, LocalEmbeddings, LocalModelError
from evalkube.proxy.metrics import PURPOSES, ProxyMetrics
from evalkube.proxy.settings import ProxySettings
from evalkube.proxy.upstream import REQUESTS_HEADER, Provider, Upstream, UpstreamError
from evalkube.proxy.usage import UsageLedger, token_usage
from evalkube.util.body_shape import BodyError
from evalkube.util.gctune import relaxed_gc
from evalkube.util.net import parse_listen

log = logging.getLogger("evalkube.proxy")

EXECUTION_HEADER = "X-Evalkube-Execution"
PURPOSE_HEADER = "X-Evalkube-Purpose"
CONTROL_TOKEN_HEADER = "X-Evalkube-Control-Token"
#: Pending connections each listener queues (a grader opening many at once must not make
#: the next honest connect fail: unix sockets refuse at once when the queue is full).
LISTEN_BACKLOG = 1024

Kind = Literal["responses", "embeddings"]
_DEFAULT_PURPOSE: dict[Kind, str] = {"responses": "judge", "embeddings": "embedding"}
_PATHS: dict[Kind, str] = {"responses": "/responses", "embeddings": "/embeddings"}
_FORCED_RESPONSE_FLAGS = {"stream": False, "store": True, "background": False}
_JSON = "application/json"


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
    """What the proxy does for one model call, independent of HTTP plumbing: fresh budgets,
    usage and metrics (on ``registry``) over ``upstream``."""

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
        path, payload = _PATHS[kind], b""
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
    if exc.kind == "credentials":
        return 502, "credentials_rejected"
    if exc.kind == "no_credentials":
        return 502, "credentials_missing"
    if exc.kind == "timeout":
        return 504, "upstream_timeout"
    if exc.kind == "unreachable":
        return 502, "upstream_unreachable"
    if exc.kind == "configuration":
        return 400, "invalid_request"
    if exc.status == 429:
        return 429, "rate_limited"
    if exc.status is not None and 400 <= exc.status < 500:
        return exc.status, "invalid_request"
    return 502, "upstream_error"


def _json(status: int, payload: bytes) -> web.Response:
    return web.Response(status=status, body=payload, content_type=_JSON)


def _valid_execution_id(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= limits.EXECUTION_ID_CHARS
        and value.isprintable()
    )


def _header_problem(execution_id: str | None, purpose: str | None, budgeted: bool) -> bytes | None:
    """The error body for a model call's bad headers, else None."""
    if budgeted and not _valid_execution_id(execution_id):
        return error_body(
            "missing_execution_id",
            f"model calls need the {EXECUTION_HEADER} header (set by the grader worker's ctx); "
            "call models through ctx.responses_create / ctx.embeddings_create",
        )
    if execution_id is not None and not _valid_execution_id(execution_id):  # optional here
        return error_body("invalid_request", f"bad {EXECUTION_HEADER} header")
    if purpose is not None and purpose not in PURPOSES:
        return error_body(
            "invalid_request", f"{PURPOSE_HEADER} must be candidate, judge or embedding"
        )
    return None


class ProxyApps:
    """The aiohttp applications of the two listeners, over one :class:`ProxyService`."""

    def __init__(self, service: ProxyService, control_token: str | None = None) -> None:
        self.service = service
        self.control_token = control_token

    # -- grader listener ---------------------------------------------------------------------
    def grader_app(self) -> web.Application:
        app = web.Application(client_max_size=limits.BRIDGE_REQUEST_BODY_BYTES)
        app.router.add_post("/v1/responses", self._model_route("responses", budgeted=True))
        app.router.add_post("/v1/embeddings", self._model_route("embeddings", budgeted=True))
        return app

    def _model_route(
        self, kind: Kind, *, budgeted: bool
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """A model route: budgeted on the grader listener (an execution token is required),
        unbudgeted on the control listener (the token is optional, a purpose may be sent)."""
        service = self.service
        control_purpose = "candidate" if kind == "responses" else "embedding"

        async def handle(request: web.Request) -> web.Response:
            execution_id = request.headers.get(EXECUTION_HEADER)
            purpose = None if budgeted else request.headers.get(PURPOSE_HEADER) or control_purpose
            problem = _header_problem(execution_id, purpose, budgeted)
            if problem is not None:
                return _json(400, problem)
            answer = await service.model_call(
                kind, await request.read(), execution_id, purpose, budgeted=budgeted
            )
            response = _json(answer.status, answer.body)
            if not budgeted:  # the runner's own calls: it counts their retries itself
                response.headers[REQUESTS_HEADER] = str(answer.requests)
            return response

        return handle

    async def _healthz(self, request: web.Request) -> web.Response:
        return _json(200, b'{"status":"ok"}')

    # -- control listener --------------------------------------------------------------------
    def control_app(self) -> web.Application:
        app = web.Application(
            client_max_size=limits.BRIDGE_REQUEST_BODY_BYTES, middlewares=[self._guard]
        )
        app.router.add_post("/v1/responses", self._model_route("responses", budgeted=False))
        app.router.add_post("/v1/embeddings", self._model_route("embeddings", budgeted=False))
        app.router.add_post("/evalkube/v1/executions:open", self._executions_open)
        app.router.add_post("/evalkube/v1/usage:take", self._usage_take)
        app.router.add_get("/evalkube/v1/budget", self._budget_get)
        app.router.add_put("/evalkube/v1/budget", self._budget_put)
        app.router.add_get("/healthz", self._healthz)
        metrics = make_aiohttp_handler(self.service.metrics.registry, disable_compression=True)
        app.router.add_get("/metrics", metrics)
        return app

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Refuses control requests without the control token (when one is configured) and
        answers a body that does not match its route's shape with 400."""
        if self.control_token is not None and request.path != "/healthz":
            sent = request.headers.get(CONTROL_TOKEN_HEADER, "")
            if not hmac.compare_digest(sent.encode(), self.control_token.encode()):
                return _json(
                    401,
                    error_body(
                        "unauthorized", f"control requests need the {CONTROL_TOKEN_HEADER} header"
                    ),
                )
        try:
            return await handler(request)
        except BodyError as exc:
            return _json(400, error_body("invalid_request", str(exc)))

    async def _usage_take(self, request: web.Request) -> web.Response:
        body = USAGE_TAKE.parse(await request.read())
        ids = None if body.execution_ids == "*" else body.execution_ids
        return _json(200, json.dumps(self.service.take_usage(ids)).encode())

    async def _executions_open(self, request: web.Request) -> web.Response:
        tokens = EXECUTIONS_OPEN.parse(await request.read()).tokens
        try:
            self.service.budgets.open(tokens)
        except ValueError as exc:
            return _json(409, error_body("invalid_request", str(exc)))
        return _json(200, json.dumps({"opened": len(tokens)}).encode())

    async def _budget_get(self, request: web.Request) -> web.Response:
        return _json(200, json.dumps(self.service.budgets.snapshot()).encode())

    async def _budget_put(self, request: web.Request) -> web.Response:
        body = UNIT_BUDGET.parse(await request.read())
        self.service.budgets.configure_unit(
            body.unit_id, body.max_calls_per_execution, body.planned_executions
        )
        return _json(200, json.dumps(self.service.budgets.snapshot()).encode())


# -- listening ---------------------------------------------------------------------------------
def bind_socket(address: str, *, mode: int = 0o600) -> tuple[socket.socket, str]:
    """A listening socket for ``address`` and the endpoint clients use to reach it."""
    target = parse_listen(address)
    if isinstance(target, str):
        path = Path(target)
        if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        os.chmod(path, mode)
        sock.listen(LISTEN_BACKLOG)
        return sock, f"unix:{path}"
    host, port = target
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if family == socket.AF_INET6 else bound[0]
    return sock, f"http://{shown}:{bound[1]}"


class ProxyServer:
    """Runs the grader and control listeners of one :class:`ProxyService` on the current loop."""

    def __init__(
        self,
        service: ProxyService,
        *,
        listen: str | None,
        control_listen: str | None = None,
        control_token: str | None = None,
    ) -> None:
        self.service = service
        self.apps = ProxyApps(service, control_token)
        self.listen = listen
        self.control_listen = control_listen
        self.endpoint: str | None = None
        self.control_endpoint: str | None = None
        self._runners: list[web.AppRunner] = []

    async def start(self) -> None:
        if self.listen:
            self.endpoint = await self._serve(self.apps.grader_app(), self.listen, 0o666)
        if self.control_listen:
            self.control_endpoint = await self._serve(
                self.apps.control_app(), self.control_listen, 0o600
            )

    async def _serve(self, app: web.Application, address: str, mode: int) -> str:
        sock, endpoint = bind_socket(address, mode=mode)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await runner.setup()
        # SockSite would otherwise listen() again with aiohttp's backlog of 128.
        site = web.SockSite(runner, sock, backlog=LISTEN_BACKLOG)
        await site.start()
        self._runners.append(runner)
        return endpoint

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        for endpoint in (self.endpoint, self.control_endpoint):
            if endpoint is not None and endpoint.startswith("unix:"):
                Path(endpoint.removeprefix("unix:")).unlink(missing_ok=True)
        await self.service.aclose()


#: ``asyncio`` forces the standard library's event loop even where uvloop is installed.
EVENT_LOOP_ENV = "EVALKUBE_EVENT_LOOP"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (the proxy's hot path is event-loop and
    transport work: 16% fewer instructions per proxied call, counted with callgrind),
    else asyncio's."""
    if os.environ.get(EVENT_LOOP_ENV, "").lower() != "asyncio":
        with contextlib.suppress(ImportError):
            import uvloop

            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run`` on :func:`new_event_loop`, with the collector tuned for the hot path."""
    with relaxed_gc(), asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main)


async def run_until_stopped(server: ProxyServer, stop: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set), then shut down cleanly."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        # no handler off the main thread (ValueError, RuntimeError) or on Windows
        # (NotImplementedError): the caller that runs it there stops it through ``stop``
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)
            installed.append(signum)
    await server.start()
    log.info(
        "model bridge proxy listening: graders %s, control %s",
        server.endpoint or "-",
        server.control_endpoint or "-",
    )
    try:
        await stop.wait()
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
        await server.stop()


def serve_forever(settings: ProxySettings, registry: CollectorRegistry | None = None) -> None:
    """Run ``evalkube proxy`` until SIGTERM/SIGINT (the pod sidecar entry point).

    With the native engine this process becomes ``evalkube-proxy`` (``exec``), configured
    from the same settings and run spec.
    """
    from evalkube.proxy import native
    from evalkube.proxy.providers import load_run_spec, providers_from_spec

    providers: dict[str, Provider] = {}
    judge_model = settings.judge_model
    embedding_model = settings.embedding_model
    retries = settings.retries
    if settings.run_spec is not None:
        spec = load_run_spec(settings.run_spec)
        providers = providers_from_spec(spec)
        judge_model = judge_model or spec.judge_model
        embedding_model = embedding_model or spec.embedding_model
        retries = spec.generation.retries if retries is None else retries
    retries = limits.GENERATION_RETRIES_DEFAULT if retries is None else retries
    token = settings.control_token()

    binary = _native_engine(settings.engine, judge_model, embedding_model)
    if binary is not None:
        log.info("model bridge proxy: native engine %s", binary)
        native.exec_native(
            binary,
            native.native_config(
                providers,
                listen=settings.listen,
                control_listen=settings.control_listen,
                control_token_file=settings.control_token_file,
                judge_model=judge_model,
                embedding_model=embedding_model,
                max_calls=settings.max_calls,
                planned_executions=settings.planned_executions,
                unit_id=settings.unit_id,
                retries=retries,
                log_level=settings.log_level,
                egress_proxy=settings.egress_proxy,
                egress_grant_file=settings.egress_grant_file,
                state_dir=settings.state_dir,
            ),
        )
    if settings.state_dir is not None:
        log.warning(
            "model bridge proxy: the python engine keeps no journal (--state-dir %s is ignored): "
            "if this process is killed, its budgets, tokens and usage are lost",
            settings.state_dir,
        )

    service = ProxyService(
        Upstream(providers, retries=retries, egress=settings.egress()),
        judge_model=judge_model,
        embedding_model=embedding_model,
        registry=registry,
        max_calls_per_execution=settings.max_calls,
        planned_executions=settings.planned_executions,
        unit_id=settings.unit_id,
    )
    server = ProxyServer(
        service, listen=settings.listen, control_listen=settings.control_listen, control_token=token
    )
    run(run_until_stopped(server))


def _native_engine(engine: str, judge_model: str | None, embedding_model: str | None) -> str | None:
    """The native binary to exec for ``engine``, or None to serve from Python."""
    from evalkube.proxy import native

    if engine == "python":
        return None
    local = native.uses_local_provider(judge_model, embedding_model)
    if engine == "native":
        if local:
            raise ValueError(
                "the run's judge or embedding model uses the local: provider, which only the "
                "Python proxy serves; use --engine python (or auto)"
            )
        return native.require_native_binary()
    if local:
        log.info("model bridge proxy: python engine (the run uses the local: provider)")
        return None
    binary = native.native_binary()
    if binary is None:
        log.info("model bridge proxy: python engine (%s not found)", native.BINARY_NAME)
    return binary
