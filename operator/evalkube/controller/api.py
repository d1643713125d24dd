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
  (what ``evalkube compare --api`` pairs), and ``GET .../run``, the run record (what
  ``evalkube report --api`` heads its page with), all of which always need a token: the operator's
  read token (``EVALKUBE_API_TOKEN``) or that run's own token; plus ``/metrics`` and
  ``/healthz``.

Store calls, and the parsing and validation of request bodies, run in threads so the event
loop (shared with kopf) never blocks.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from itertools import islice
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from evalkube import limits
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunEntry, RunRegistry, token_matches, token_shaped
from evalkube.engine.snapshot import PREPARE_UNIT, Prepared
from evalkube.store import ResultStore, TaskResultRecord, decode_cursor
from evalkube.store.filters import SampleFilter, main_metrics
from evalkube.store.remote import sample_from_wire
from evalkube.store.views import sample_view
from evalkube.store.wire import (
    ANSWER_LOOKUP,
    KEPT_ANSWERS,
    SAMPLE_UPDATES,
    SETTLE,
    TASK_RESULT,
    UNIT_FAILURE,
)
from evalkube.util import jsonfast
from evalkube.util.body_shape import BodyError, Shape
from evalkube.util.net import bearer_token

PREFIX = "/api/v1/namespaces/{namespace}/evalruns/{name}"
log = logging.getLogger(__name__)
#: Looks a run up from durable state: ``(namespace, name) -> entry`` or ``None`` (no such run).
RunResolver = Callable[[str, str], Awaitable[RunEntry | None]]
#: The one answer to a runner route without this run's token (whether or not the run exists).
UNAUTHORIZED = "missing or wrong ingest token for this EvalRun"
#: The one answer to a reading route without a token that opens the run.
UNREADABLE = (
    "reading a run needs a token: the operator's read token (the chart's api-token Secret, "
    "EVALKUBE_API_TOKEN) as 'Authorization: Bearer <token>'"
)
#: Seconds a run that durable state did not know is answered as absent without a new lookup.
ABSENT_SECONDS = 5.0
#: Absent runs remembered at once (a flood of invented names cannot grow this without bound).
ABSENT_REMEMBERED = 10_000
#: Rows a streamed answer reads from the store per step, and the bytes after which a step
#: ends early (bound the handler's memory; a sample's judge may hold up to 1 MB).
STREAM_BATCH = 2_000
STREAM_CHUNK_BYTES = 1024 * 1024
_T = TypeVar("_T")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=jsonfast.dumps(data), status=status, content_type="application/json")


async def _parse(request: web.Request, shape: Shape[_T]) -> _T:
    """The request's body as ``shape``, or a 400 naming the wrong fields and the shape. Parsed
    and validated in a thread: a body may be up to :data:`limits.INGEST_BODY_BYTES`, and the
    event loop is kopf's."""
    raw = await request.read()
    try:
        return await asyncio.to_thread(shape.parse, raw)
    except BodyError as exc:
        raise web.HTTPBadRequest(
            text=jsonfast.dumps({"error": {"message": str(exc)}}).decode(),
            content_type="application/json",
        ) from None


def store_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` is the store failing, not the request: the database down, restarting
    or unreachable, its disk full, a connection it dropped. Waiting may fix it."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


@web.middleware
async def _store_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A store failure answers 503 naming it (runners retry 5xx within their window, and the
    message says why in their log), not aiohttp's anonymous 500; nothing was recorded."""
    try:
        return await handler(request)
    except Exception as exc:
        if not store_unavailable(exc):
            raise
        cause = getattr(exc, "orig", None) or exc
        detail = " ".join(str(cause).split())[:500]
        log.warning("the results store refused %s %s: %s", request.method, request.path, detail)
        return _error(503, f"the results store is unavailable: {detail}")


RunRoute = Callable[["ApiServer", web.Request, RunEntry], Awaitable[web.StreamResponse]]
Route = Callable[["ApiServer", web.Request], Awaitable[web.StreamResponse]]


def _run_route(reading: bool) -> Callable[[RunRoute], Route]:
    """A route of one run. Its pods call a route with the run's token, and the route acts on
    that run only; people and tools ``reading`` a run may also use the operator's read token.

    Without a valid token the answer is the same ``401`` whether or not the run exists (a
    forged token learns nothing), and a request with no token, or with text that cannot be a
    token, is refused before the run is looked up. Only the read token's holders learn that
    a run does not exist (``404``)."""

    def decorate(route: RunRoute) -> Route:
        @functools.wraps(route)
        async def authorized(self: ApiServer, request: web.Request) -> web.StreamResponse:
            namespace, name = request.match_info["namespace"], request.match_info["name"]
            token = bearer_token(request.headers)
            refused = UNREADABLE if reading else UNAUTHORIZED
            # the operator's read token (constant-time compare) opens every run to reading
            read = self.read_token
            if reading and token and read and hmac.compare_digest(token.encode(), read.encode()):
                entry = await self._entry(namespace, name)
                if entry is None:
                    return _error(404, f"EvalRun {namespace}/{name} is not known to this operator")
                return await route(self, request, entry)
            if token is None or not token_shaped(token):
                return _error(401, refused)
            entry = await self._entry(namespace, name)
            if entry is None or not token_matches(entry, token):
                return _error(401, refused)
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
        self.on_unit_done = on_unit_done or (lambda entry, unit: None)
        self.resolve = resolve
        #: ``(namespace, name) -> monotonic time`` until which the run counts as absent.
        self._absent: dict[tuple[str, str], float] = {}
        #: The threads that parse, validate and store posted samples (see
        #: :data:`limits.INGEST_THREADS`), apart from the loop's default executor.
        self._ingest_pool = ThreadPoolExecutor(
            max_workers=limits.INGEST_THREADS, thread_name_prefix="evalkube-ingest"
        )
        self.ingest_app = web.Application(
            client_max_size=limits.INGEST_BODY_BYTES, middlewares=[_store_errors]
        )
        self.ingest_app.add_routes(self.ingest_routes())
        self.api_app = web.Application(middlewares=[_store_errors])
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
            web.post(PREFIX + "/units/{unit}:failed", self.unit_failed),
            web.get(PREFIX + "/prepared", self.prepared),
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
            web.get(PREFIX + "/run", self.run_record),
        ]

    async def _entry(self, namespace: str, name: str) -> RunEntry | None:
        """The run from the registry, else from durable state (then remembered). A run found
        absent is not looked up again for :data:`ABSENT_SECONDS`: requests naming runs that
        do not exist cost the API server one read per name and interval, not one each."""
        entry = self.registry.get(namespace, name)
        if entry is None and self.resolve is not None:
            key = (namespace, name)
            now = time.monotonic()
            if self._absent.get(key, 0.0) > now:
                return None
            entry = await self.resolve(namespace, name)
            if entry is None:
                if len(self._absent) >= ABSENT_REMEMBERED:
                    self._absent = {k: t for k, t in self._absent.items() if t > now}
                if len(self._absent) < ABSENT_REMEMBERED:
                    self._absent[key] = now + ABSENT_SECONDS
            else:
                self._absent.pop(key, None)
                self.registry.register(entry)
        return entry

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    @_ingest
    async def ingest(self, request: web.Request, entry: RunEntry) -> web.Response:
        """Samples a runner posts: read on the event loop, then parsed, validated and written
        in one of the :data:`limits.INGEST_THREADS` ingest threads (a body of up to
        :data:`limits.INGEST_BODY_BYTES` must not stall kopf)."""
        raw = await request.read()
        try:
            loop = asyncio.get_running_loop()
            recorded = await loop.run_in_executor(
                self._ingest_pool, self._record, raw, entry.run_id
            )
        except _BadSamples as exc:
            return _error(400, str(exc))
        return _json({"recorded": recorded})

    def _record(self, raw: bytes, run_id: str) -> int:
        """Parse, validate and store a ``{"samples": [...]}`` body (off the event loop)."""
        try:
            body = jsonfast.loads(raw)
        except ValueError as exc:
            raise _BadSamples(f"body is not JSON: {exc}") from None
        items = body.get("samples") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise _BadSamples('body must be {"samples": [...]}')
        try:
            records = [sample_from_wire(item, run_id) for item in items]
        except (TypeError, ValueError) as exc:
            raise _BadSamples(f"invalid sample: {exc}") from None
        del body, items
        self.store.record_samples(records)
        return len(records)

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
                row=query.get("row"),
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
            self.store.page_samples,
            entry.run_id,
            cursor=cursor,
            limit=limit,
            where=where,
            max_bytes=limits.SAMPLES_PAGE_BYTES,
        )
        answer: dict[str, Any] = {
            "samples": [sample_view(r) for r in page],
            "next_cursor": next_cursor,
        }
        if query.get("metrics") in ("1", "true"):
            answer["metrics"] = await asyncio.to_thread(
                self.store.score_names, entry.run_id, limits.CSV_SCORE_COLUMNS_MAX + 1
            )
        return _json(answer)

    @_reading
    async def run_record(self, request: web.Request, entry: RunEntry) -> web.Response:
        """The run as the store has it (what ``evalkube report --api`` heads its page with):
        suite, version, phase, times, the results it finished with, each task's main metric;
        and, without results yet, its samples counted per task x model and status."""
        record = await asyncio.to_thread(self.store.get_run, entry.run_id)
        if record is None:
            return _error(404, f"EvalRun {entry.namespace}/{entry.name} has no run in the store")
        counts: list[Any] = []
        if not (record.summary or {}).get("results"):
            found = await asyncio.to_thread(self.store.status_counts, entry.run_id)
            counts = [[task, model, by] for (task, model), by in sorted(found.items())]
        return _json(
            {
                "run_id": record.run_id,
                "suite_name": record.suite_name,
                "suite_version": record.suite_version,
                "sandbox": record.sandbox,
                "phase": record.phase,
                "created_at": _iso(record.created_at),
                "completed_at": _iso(record.completed_at),
                "summary": record.summary,
                "main_metrics": main_metrics(record.spec),
                "status_counts": counts,
            }
        )

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
    async def prepared(self, request: web.Request, entry: RunEntry) -> web.Response:
        """The run's pins, as its prepare pod reported them: every task's row count and the
        pins of ``?task=`` (all of them without it), for a unit's runner."""
        infos = await asyncio.to_thread(self.store.done_unit_infos, entry.run_id)
        report = infos.get(PREPARE_UNIT)
        if not report or "error" in report:
            return _error(409, "the run's sources are not pinned (its prepare pod did not report)")
        try:
            prepared = Prepared.from_wire(report)
        except ValueError as exc:
            return _error(409, f"the run's prepare report is malformed: {exc}")
        task = request.query.get("task")
        return _json((prepared.for_task(task) if task else prepared).to_wire())

    @_ingest
    async def unit_failed(self, request: web.Request, entry: RunEntry) -> web.Response:
        """The unit's runner cannot run it (its programs do not load, a ``grade_batch`` past
        its limits): the reason is the unit's failure reason in the run's status."""
        unit = request.match_info["unit"]
        body = await _parse(request, UNIT_FAILURE)
        await asyncio.to_thread(self.store.mark_unit_failed, entry.run_id, unit, body.reason)
        self.on_unit_done(entry, unit)
        return _json({"failed": unit})

    @_ingest
    async def unit_done(self, request: web.Request, entry: RunEntry) -> web.Response:
        unit = request.match_info["unit"]
        raw = await request.read()
        try:  # parsed in a thread, never on kopf's event loop
            body = await asyncio.to_thread(jsonfast.loads, raw)
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"body is not JSON: {exc}") from None
        info = body if isinstance(body, dict) else {}
        await asyncio.to_thread(self.store.mark_unit_done, entry.run_id, unit, info)
        seconds = info.get("seconds")
        if isinstance(seconds, int | float):
            self.metrics.unit_duration.labels(info.get("kind", "shard")).observe(seconds)
        self.on_unit_done(entry, unit)
        return _json({"done": unit})


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


class _BadSamples(ValueError):
    """A posted samples body that is not ``{"samples": [...]}`` of valid samples (a 400)."""


async def _task_model_ids(
    request: web.Request,
    entry: RunEntry,
    read: Callable[[str, str, str, tuple[int, int] | None], Iterable[str]],
) -> web.Response:
    """``{"sample_ids": [...]}`` of the run's ``?task=&model=``, as ``read`` finds them; with
    ``&seq_from=&seq_to=`` only those of that range of sequence numbers (one shard's)."""
    query = request.query
    task, model = query.get("task", ""), query.get("model", "")
    seqs = None
    if "seq_from" in query or "seq_to" in query:
        try:
            seqs = (int(query["seq_from"]), int(query["seq_to"]))
        except (KeyError, ValueError):
            return _error(400, "seq_from and seq_to must both be integers")
    ids = await asyncio.to_thread(read, entry.run_id, task, model, seqs)
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
            """The next rows' lines, up to :data:`STREAM_BATCH` rows or
            :data:`STREAM_CHUNK_BYTES` (a sample may be a megabyte)."""
            lines, size = [], 0
            for row in islice(rows, STREAM_BATCH):
                line = jsonfast.dumps(shape(row)) + b"\n"
                lines.append(line)
                size += len(line)
                if size >= STREAM_CHUNK_BYTES:
                    break
            return b"".join(lines)

        try:
            await response.prepare(request)
            while chunk := await loop.run_in_executor(reader, batch):
                await response.write(chunk)
        except ConnectionError:  # the client stopped reading (a runner past a limit)
            return response
        finally:
            await loop.run_in_executor(reader, getattr(rows, "close", lambda: None))
    await response.write_eof()
    return response
