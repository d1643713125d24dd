"""The operator's HTTP servers: ingest for work-unit pods; the samples API and metrics.

Two applications on two ports, so NetworkPolicy can tell them apart (work pods may reach the
ingest port only; ``docs/security.md``):

- :attr:`ApiServer.ingest_app`: the runner routes. Each needs the run's bearer token (the
  ``runner`` container's Secret) and pins everything to that run, whatever the body claims.
  A run this replica has not seen yet (a standby replica, a restarted operator) is looked up
  from durable state (the EvalRun and its token Secret) through ``resolve``.
- :attr:`ApiServer.api_app`: ``GET .../samples``, the debugging view
  (``?status=&task=&model=&min_score=M=V&max_score=M=V&search=&limit=&cursor=``, as
  ``evalkube samples`` shows it; ``next_cursor`` pages on; ``metrics=true`` adds the run's
  metric names), and ``GET .../scores``, every sample's scores keyed by dataset row as NDJSON
  (what ``evalkube compare --api`` pairs), both of which always need a token: the operator's
  read token (``EVALKUBE_API_TOKEN``) or that run's own token; plus ``/metrics`` and
  ``/healthz``.

Store calls run in threads so the event loop (shared with kopf) never blocks.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from evalkube import jsonfast, limits
from evalkube._net import bearer_token
from evalkube._wire import BodyError, Shape
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunEntry, RunRegistry
from evalkube.store import ResultStore, TaskResultRecord
from evalkube.store.filters import SampleFilter
from evalkube.store.remote import sample_from_wire
from evalkube.store.store import decode_cursor
from evalkube.store.views import sample_view
from evalkube.store.wire import ANSWER_LOOKUP, KEPT_ANSWERS, SAMPLE_UPDATES, SETTLE, TASK_RESULT

PREFIX = "/api/v1/namespaces/{namespace}/evalruns/{name}"
#: Looks a run up from durable state: ``(namespace, name) -> entry`` or ``None`` (no such run).
RunResolver = Callable[[str, str], Awaitable[RunEntry | None]]
#: Rows a streamed answer reads from the store per step (bounds the handler's memory).
STREAM_BATCH = 2_000
_T = TypeVar("_T")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=jsonfast.dumps(data), status=status, content_type="application/json")


async def _parse(request: web.Request, shape: Shape[_T]) -> _T:
    """The request's body as ``shape``, or a 400 naming the wrong fields and the shape."""
    try:
        return shape.parse(await request.read())
    except BodyError as exc:
        raise web.HTTPBadRequest(
            text=jsonfast.dumps({"error": {"message": str(exc)}}).decode(),
            content_type="application/json",
        ) from None


RunRoute = Callable[["ApiServer", web.Request, RunEntry], Awaitable[web.StreamResponse]]
Route = Callable[["ApiServer", web.Request], Awaitable[web.StreamResponse]]


def _run_route(reading: bool) -> Callable[[RunRoute], Route]:
    """A route of one run. Its pods call a route with the run's token, and the route acts on
    that run only; people and tools ``reading`` a run may also use the operator's read token,
    and learn without a token not even whether the run exists."""

    def decorate(route: RunRoute) -> Route:
        @functools.wraps(route)
        async def authorized(self: ApiServer, request: web.Request) -> web.StreamResponse:
            namespace, name = request.match_info["namespace"], request.match_info["name"]
            entry = await self._entry(namespace, name)
            token = bearer_token(request.headers)
            own_token = self.registry.authorize(namespace, name, token) is not None
            if reading and not (own_token or self._is_read_token(token)):
                return _error(
                    401,
                    "reading a run needs a token: the operator's read token (the chart's "
                    "api-token Secret, EVALKUBE_API_TOKEN) as 'Authorization: Bearer <token>'",
                )
            if entry is None:
                return _error(404, f"EvalRun {namespace}/{name} is not known to this operator")
            if not reading and not own_token:
                return _error(401, "missing or wrong ingest token for this EvalRun")
            return await route(self, request, entry)

        return authorized

    return decorate


_ingest, _reading = _run_route(reading=False), _run_route(reading=True)


class ApiServer:
    """aiohttp application over the store, the run registry and the metrics."""

    def __init__(
        self,
        store: ResultStore,
        registry: RunRegistry,
        metrics: OperatorMetrics,
        on_unit_done: Callable[[RunEntry, str], None] | None = None,
        read_token: str | None = None,
        resolve: RunResolver | None = None,
    ) -> None:
        self.read_token = read_token
        self.store = store
        self.registry = registry
        self.metrics = metrics
        self.on_unit_done = on_unit_done
        self.resolve = resolve
        self.ingest_app = web.Application(client_max_size=limits.INGEST_BODY_BYTES)
        self.ingest_app.add_routes(self.ingest_routes())
        self.api_app = web.Application()
        self.api_app.add_routes(self.api_routes())

    def ingest_routes(self) -> list[web.RouteDef]:
        """What work-unit pods call, each with their run's token."""
        return [
            web.post(PREFIX + "/samples", self.ingest),
            web.get(PREFIX + "/sample-ids", self.sample_ids),
            web.get(PREFIX + "/samples:export", self.export),
            web.post(PREFIX + "/samples:update", self.update),
            web.post(PREFIX + "/samples:settle", self.settle),
            web.post(PREFIX + "/task-results", self.task_result),
            web.post(PREFIX + "/answers", self.record_answers),
            web.post(PREFIX + "/answers:lookup", self.recorded_answers),
            web.get(PREFIX + "/generation-errored-ids", self.generation_errored_ids),
            web.post(PREFIX + "/units/{unit}:done", self.unit_done),
        ]

    def api_routes(self) -> list[web.RouteDef]:
        """What people, dashboards and probes call: the samples view, metrics, health."""
        return [
            web.get("/healthz", self.healthz),
            web.get(
                "/metrics", make_aiohttp_handler(self.metrics.registry, disable_compression=True)
            ),
            web.get(PREFIX + "/samples", self.list_samples),
            web.get(PREFIX + "/scores", self.keyed_scores),
        ]

    # -- helpers ---------------------------------------------------------------------------
    async def _entry(self, namespace: str, name: str) -> RunEntry | None:
        """The run from the registry, else from durable state (then remembered)."""
        entry = self.registry.get(namespace, name)
        if entry is None and self.resolve is not None:
            entry = await self.resolve(namespace, name)
            if entry is not None:
                self.registry.register(entry)
        return entry

    @staticmethod
    async def _body(request: web.Request) -> Any:
        try:
            return jsonfast.loads(await request.read())
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"body is not JSON: {exc}") from None

    # -- routes ----------------------------------------------------------------------------
    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    @_ingest
    async def ingest(self, request: web.Request, entry: RunEntry) -> web.Response:
        body = await self._body(request)
        raw = body.get("samples") if isinstance(body, dict) else None
        if not isinstance(raw, list):
            return _error(400, 'body must be {"samples": [...]}')
        try:
            records = [sample_from_wire(item, entry.run_id) for item in raw]
        except (TypeError, ValueError) as exc:
            return _error(400, f"invalid sample: {exc}")
        await asyncio.to_thread(self.store.record_samples, records)
        return _json({"recorded": len(records)})

    def _is_read_token(self, token: str | None) -> bool:
        """The operator's read token (constant-time compare) opens every run to reading."""
        read = self.read_token
        return bool(token and read and hmac.compare_digest(token.encode(), read.encode()))

    @_reading
    async def list_samples(self, request: web.Request, entry: RunEntry) -> web.Response:
        query = request.query
        try:
            where = SampleFilter.parse(
                task=query.get("task"),
                model=query.get("model"),
                status=query.get("status"),
                min_score=query.getall("min_score", []),
                max_score=query.getall("max_score", []),
                search=query.get("search"),
                prefix="",
            )
        except ValueError as exc:
            return _error(400, str(exc))
        try:
            limit = int(query.get("limit", "10"))
            if not 1 <= limit <= 1000:
                raise ValueError
        except ValueError:
            return _error(400, "limit must be an integer between 1 and 1000")
        cursor = query.get("cursor")
        if cursor:
            try:
                decode_cursor(cursor)
            except ValueError as exc:
                return _error(400, str(exc))
        if where.status == "wrong":
            record = await asyncio.to_thread(self.store.get_run, entry.run_id)
            where = where.for_run(record.spec if record else None)
        page, next_cursor = await asyncio.to_thread(
            self.store.page_samples, entry.run_id, cursor=cursor, limit=limit, where=where
        )
        answer: dict[str, Any] = {
            "samples": [sample_view(r) for r in page],
            "next_cursor": next_cursor,
        }
        if query.get("metrics") in ("1", "true"):
            answer["metrics"] = await asyncio.to_thread(self.store.score_names, entry.run_id)
        return _json(answer)

    @_reading
    async def keyed_scores(self, request: web.Request, entry: RunEntry) -> web.StreamResponse:
        """Every sample's ``{task, model, key, status, scores}``, one JSON object per line,
        ordered by task, model: the paired comparison's input."""
        return await _stream_ndjson(
            request,
            lambda: self.store.iter_keyed_scores(entry.run_id),
            lambda row: dict(zip(("task", "model", "key", "status", "scores"), row, strict=True)),
        )

    @_ingest
    async def sample_ids(self, request: web.Request, entry: RunEntry) -> web.Response:
        return await _task_model_ids(request, entry, self.store.recorded_sample_ids)

    @_ingest
    async def export(self, request: web.Request, entry: RunEntry) -> web.StreamResponse:
        return await _stream_ndjson(
            request,
            lambda: self.store.iter_samples(
                entry.run_id, task_id=request.query.get("task"), model=request.query.get("model")
            ),
            lambda record: {name: getattr(record, name) for name in record.__slots__},
        )

    @_ingest
    async def update(self, request: web.Request, entry: RunEntry) -> web.Response:
        body = await _parse(request, SAMPLE_UPDATES)
        updates = [u.model_dump(exclude_unset=True) for u in body.updates]
        await asyncio.to_thread(self.store.apply_sample_updates, entry.run_id, updates)
        return _json({"updated": len(updates)})

    @_ingest
    async def settle(self, request: web.Request, entry: RunEntry) -> web.Response:
        body = await _parse(request, SETTLE)
        settled = await asyncio.to_thread(
            self.store.settle_pending,
            entry.run_id,
            body.task,
            body.model,
            body.status,
            body.values.model_dump(exclude_unset=True),
        )
        return _json({"settled": settled})

    @_ingest
    async def record_answers(self, request: web.Request, entry: RunEntry) -> web.Response:
        """Model answers a pod keeps as they arrive: a retried Job takes them back."""
        body = await _parse(request, KEPT_ANSWERS)
        answers = [(sample_id, answer) for sample_id, answer in body.answers]
        await asyncio.to_thread(self.store.record_answers, entry.run_id, body.purpose, answers)
        return _json({"recorded": len(answers)})

    @_ingest
    async def recorded_answers(self, request: web.Request, entry: RunEntry) -> web.Response:
        body = await _parse(request, ANSWER_LOOKUP)
        found = await asyncio.to_thread(
            self.store.recorded_answers, entry.run_id, body.purpose, body.sample_ids
        )
        return _json({"answers": found})

    @_ingest
    async def generation_errored_ids(self, request: web.Request, entry: RunEntry) -> web.Response:
        return await _task_model_ids(request, entry, self.store.generation_errored_ids)

    @_ingest
    async def task_result(self, request: web.Request, entry: RunEntry) -> web.Response:
        body = await _parse(request, TASK_RESULT)
        record = TaskResultRecord(
            entry.run_id,
            body.task,
            body.model,
            body.metrics,
            body.error,
            body.problems,
            body.model_calls,
        )
        await asyncio.to_thread(self.store.save_task_result, record)
        return _json({"saved": True})

    @_ingest
    async def unit_done(self, request: web.Request, entry: RunEntry) -> web.Response:
        unit = request.match_info["unit"]
        body = await self._body(request)
        info = body if isinstance(body, dict) else {}
        await asyncio.to_thread(self.store.mark_unit_done, entry.run_id, unit, info)
        seconds = info.get("seconds")
        if isinstance(seconds, int | float):
            self.metrics.unit_duration.labels(info.get("kind", "shard")).observe(seconds)
        if self.on_unit_done is not None:
            self.on_unit_done(entry, unit)
        return _json({"done": unit})


async def _task_model_ids(
    request: web.Request, entry: RunEntry, read: Callable[[str, str, str], Iterable[str]]
) -> web.Response:
    """``{"sample_ids": [...]}`` of the run's ``?task=&model=``, as ``read`` finds them."""
    task, model = request.query.get("task", ""), request.query.get("model", "")
    ids = await asyncio.to_thread(read, entry.run_id, task, model)
    return _json({"sample_ids": sorted(ids)})


async def _stream_ndjson(
    request: web.Request, source: Callable[[], Iterator[_T]], shape: Callable[[_T], Any]
) -> web.StreamResponse:
    """Write ``shape(row)`` for each row of ``source`` as NDJSON. The store is read a batch at
    a time on one thread of its own (a store cursor stays on the thread that opened it, and is
    closed there even when the client goes away), so neither the event loop blocks nor a large
    run is held in memory."""
    loop = asyncio.get_running_loop()
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="evalkube-stream") as reader:
        rows = await loop.run_in_executor(reader, source)

        def batch() -> bytes:
            return b"".join(
                jsonfast.dumps(shape(row)) + b"\n" for row in islice(rows, STREAM_BATCH)
            )

        try:
            await response.prepare(request)
            while chunk := await loop.run_in_executor(reader, batch):
                await response.write(chunk)
        finally:
            await loop.run_in_executor(reader, getattr(rows, "close", lambda: None))
    await response.write_eof()
    return response
