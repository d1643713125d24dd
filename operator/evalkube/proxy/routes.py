"""The aiohttp apps of the proxy's two listeners (each TCP ``host:port`` or ``unix:/path``).

- grader listener (untrusted): ``POST /v1/responses`` and ``POST /v1/embeddings`` (OpenAI
  shapes) and nothing else, so nothing about other executions or the run leaks to graders.
  Each call needs an open execution token (``X-Evalkube-Execution``) and is charged to its
  execution's budget and the unit's total; any other token gets 403 before any charge.
- control listener (the trusted runner): the same model routes unbudgeted (purpose
  ``candidate`` for responses unless ``X-Evalkube-Purpose`` says otherwise), plus
  ``POST /evalkube/v1/executions:open``, ``POST /evalkube/v1/usage:take`` (closes the tokens it
  takes), ``GET|PUT /evalkube/v1/budget``, ``/healthz`` and ``/metrics``; with a control token
  configured, every request but ``/healthz`` must send it in ``X-Evalkube-Control-Token``.
"""

from __future__ import annotations

import hmac
import json

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client.aiohttp import make_aiohttp_handler

from evalkube import limits
from evalkube.proxy.bodies import EXECUTIONS_OPEN, UNIT_BUDGET, USAGE_TAKE
from evalkube.proxy.metrics import PURPOSES
from evalkube.proxy.service import Kind, ProxyService, error_body
from evalkube.proxy.upstream import REQUESTS_HEADER
from evalkube.util.body_shape import BodyError

EXECUTION_HEADER = "X-Evalkube-Execution"
PURPOSE_HEADER = "X-Evalkube-Purpose"
CONTROL_TOKEN_HEADER = "X-Evalkube-Control-Token"


def _json(status: int, payload: bytes) -> web.Response:
    return web.Response(status=status, body=payload, content_type="application/json")


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

    def grader_app(self) -> web.Application:
        app = web.Application(client_max_size=limits.BRIDGE_REQUEST_BODY_BYTES)
        app.router.add_post("/v1/responses", self._model_route("responses", budgeted=True))
        app.router.add_post("/v1/embeddings", self._model_route("embeddings", budgeted=True))
        return app

    def _model_route(self, kind: Kind, *, budgeted: bool) -> Handler:
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
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuses control requests without the control token (when one is configured) and
        answers a body that does not match its route's shape with 400."""
        if self.control_token is not None and request.path != "/healthz":
            sent = request.headers.get(CONTROL_TOKEN_HEADER, "")
            if not hmac.compare_digest(sent.encode(), self.control_token.encode()):
                message = f"control requests need the {CONTROL_TOKEN_HEADER} header"
                return _json(401, error_body("unauthorized", message))
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
