"""The store as a work-unit pod sees it: the operator's ingest API over HTTP.

A pod holds no database credentials, only its run's bearer token; the operator checks the
token, pins every sample to that run, and writes to the real store. Every call is
idempotent (samples upsert by id), so a retried request or a re-run unit never duplicates.

Calls are retried with capped exponential backoff for up to ``retry_seconds`` on connection
errors, 5xx and 404 (a replica that does not know the run yet, an operator restarting behind
its Service, its store down or full): the unit's samples wait instead of failing the unit.
No attempt outlasts the window either (a partition that drops packets answers nothing, and
a request waiting on it would hold the unit until its Job's deadline); past the window the
call raises :class:`IngestUnreachable`, the Pod fails and its Job retries it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import tenacity

from evalkube.store.records import SampleRecord, TaskResultRecord
from evalkube.util import jsonfast
from evalkube.util.net import release

SAMPLE_FIELDS = {f.name for f in dataclasses.fields(SampleRecord)}
#: Answers worth waiting out: the run unknown to this replica yet, or the operator unwell.
RETRIED_STATUSES = frozenset({404, 500, 502, 503, 504})
#: Sample ids one ``answers:lookup`` request asks for (the whole shard is asked at once).
ANSWER_LOOKUP_IDS = 5_000
#: Seconds one attempt may wait for its answer (a large post is parsed and committed first).
REQUEST_SECONDS = 60.0
_JSON = {"Content-Type": "application/json"}


def _worth_waiting(exc: BaseException) -> bool:
    if isinstance(exc, RemoteStoreError):
        return exc.status in RETRIED_STATUSES
    return isinstance(exc, httpx.TransportError)


def sample_to_wire(record: SampleRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in SAMPLE_FIELDS}


def sample_from_wire(data: Any, run_id: str) -> SampleRecord:
    """Rebuild a record from JSON; the run id always comes from the server, never the body."""
    if not isinstance(data, dict):
        raise ValueError("a sample must be an object")
    unknown = set(data) - SAMPLE_FIELDS
    if unknown:
        raise ValueError(f"unknown sample fields: {sorted(unknown)}")
    for key in ("sample_id", "task_id", "model", "status"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ValueError(f"sample.{key} must be a non-empty string")
    if data["status"] not in ("valid", "invalid", "errored", "pending"):
        raise ValueError("sample.status must be valid, invalid, errored or pending")
    if not isinstance(data.get("seq"), int):
        raise ValueError("sample.seq must be an integer")
    scores = data.get("scores") or {}
    if not isinstance(scores, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in scores.values()
    ):
        raise ValueError("sample.scores must map names to numbers")
    values = {k: v for k, v in data.items() if k != "run_id"}
    return SampleRecord(run_id=run_id, **values)


class RemoteStore:
    """A :class:`~evalkube.store.protocol.SampleStore` backed by the operator's ingest API."""

    def __init__(
        self,
        base_url: str,
        namespace: str,
        name: str,
        token: str,
        *,
        transport: httpx.BaseTransport | None = None,
        retry_seconds: float = 300.0,
    ) -> None:
        self.prefix = f"/api/v1/namespaces/{quote(namespace)}/evalruns/{quote(name)}"
        self.retry_seconds = retry_seconds
        self.client = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(
                min(REQUEST_SECONDS, retry_seconds), connect=min(10.0, retry_seconds)
            ),
            transport=transport,
        )

    def close(self) -> None:
        self.client.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call, retried (0.25 s doubling to 10 s) while a retry can still start within
        ``retry_seconds``. An error no wait can fix (401, 400, ...) is raised as it was; one
        still worth waiting for at the end of the window as :class:`IngestUnreachable`."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_worth_waiting),
            wait=tenacity.wait_exponential(multiplier=0.25, max=10.0),
            stop=tenacity.stop_before_delay(self.retry_seconds),
            reraise=True,
        )
        started = time.monotonic()
        try:
            return retrying(self._once, method, self.prefix + path, **kwargs)
        except (RemoteStoreError, httpx.TransportError) as exc:
            if not _worth_waiting(exc):
                raise
            raise IngestUnreachable(
                f"the ingest API did not take {method} {path}: gave up after "
                f"{time.monotonic() - started:.0f} s of retries (the runner's retry window "
                f"is {self.retry_seconds:g} s, EVALKUBE_INGEST_RETRY_SECONDS); last error: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _once(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = self.client.request(method, url, **kwargs)
        release(response)  # the posted chunk is freed with the response, not at a full GC
        if response.status_code >= 400:
            raise RemoteStoreError(response)
        return response

    def _post(self, path: str, body: Any) -> httpx.Response:
        """POST ``body`` as JSON (``bytes``: already encoded)."""
        content = body if isinstance(body, bytes) else jsonfast.dumps(body)
        return self._request("POST", path, content=content, headers=_JSON)

    # -- SampleStore ---------------------------------------------------------------------------
    def encode_samples(self, records: Sequence[SampleRecord]) -> bytes:
        return jsonfast.dumps({"samples": [sample_to_wire(r) for r in records]})

    def write_encoded(self, payload: bytes) -> None:
        self._post("/samples", payload)

    def record_samples(self, records: Sequence[SampleRecord]) -> None:
        self.write_encoded(self.encode_samples(records))

    def recorded_sample_ids(
        self, run_id: str, task_id: str, model: str, seqs: tuple[int, int] | None = None
    ) -> set[str]:
        return self._ids("/sample-ids", task_id, model, seqs)

    def iter_samples(
        self, run_id: str, *, task_id: str | None = None, model: str | None = None
    ) -> Iterator[SampleRecord]:
        params = {k: v for k, v in (("task", task_id), ("model", model)) if v is not None}
        with self.client.stream("GET", self.prefix + "/samples:export", params=params) as response:
            if response.status_code >= 400:
                response.read()
                raise RemoteStoreError(response)
            for line in response.iter_lines():
                if line:
                    yield sample_from_wire(jsonfast.loads(line), run_id)

    def apply_sample_updates(self, run_id: str, updates: Iterable[dict[str, Any]]) -> None:
        self._post("/samples:update", {"updates": list(updates)})

    def settle_pending(
        self,
        run_id: str,
        task_id: str,
        model: str,
        status: str,
        values: dict[str, Any] | None = None,
    ) -> int:
        body = {"task": task_id, "model": model, "status": status, "values": values or {}}
        return int(self._post("/samples:settle", body).json()["settled"])

    # -- kept model answers (a retried Job takes them back instead of paying again) ----------
    def record_answers(self, run_id: str, purpose: str, answers: Sequence[tuple[str, Any]]) -> None:
        self._post("/answers", {"purpose": purpose, "answers": [list(a) for a in answers]})

    def recorded_answers(
        self, run_id: str, purpose: str, sample_ids: Sequence[str]
    ) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for start in range(0, len(sample_ids), ANSWER_LOOKUP_IDS):
            chunk = list(sample_ids[start : start + ANSWER_LOOKUP_IDS])
            body = {"purpose": purpose, "sample_ids": chunk}
            found.update(self._post("/answers:lookup", body).json()["answers"])
        return found

    def generation_errored_ids(
        self, run_id: str, task_id: str, model: str, seqs: tuple[int, int] | None = None
    ) -> set[str]:
        return self._ids("/generation-errored-ids", task_id, model, seqs)

    def save_task_result(self, result: TaskResultRecord) -> None:
        self._post(
            "/task-results",
            {
                "task": result.task_id,
                "model": result.model,
                "metrics": result.metrics,
                "error": result.error,
                "problems": result.problems,
                "modelCalls": result.model_calls,
            },
        )

    def prepared(self, task_id: str | None = None) -> dict[str, Any]:
        """What the run's prepare pod reported: every task's row count and the pins of
        ``task_id``'s sources (of every task when ``None``)."""
        params = {"task": task_id} if task_id is not None else {}
        return dict(self._request("GET", "/prepared", params=params).json())

    def _ids(self, path: str, task_id: str, model: str, seqs: tuple[int, int] | None) -> set[str]:
        """Sample ids at ``path?task=&model=`` (one shard's: ``&seq_from=&seq_to=`` too)."""
        params = {"task": task_id, "model": model}
        if seqs is not None:
            params["seq_from"], params["seq_to"] = str(seqs[0]), str(seqs[1])
        return set(self._request("GET", path, params=params).json()["sample_ids"])

    def mark_unit_done(self, unit_id: str, info: dict[str, Any]) -> None:
        self._post(f"/units/{quote(unit_id, safe='')}:done", info)

    def mark_unit_failed(self, unit_id: str, reason: str) -> None:
        """The unit cannot run (:class:`~evalkube.engine.unit_context.UnitFailed`): the reason
        becomes the unit's failure reason in the run's status."""
        self._post(f"/units/{quote(unit_id, safe='')}:failed", {"reason": reason})


class RemoteStoreError(RuntimeError):
    """The ingest API refused a request; the message carries its explanation."""

    def __init__(self, response: httpx.Response) -> None:
        try:
            detail = response.json().get("error", {}).get("message", "")
        except ValueError:
            detail = response.text[:300]
        super().__init__(f"ingest API answered HTTP {response.status_code}: {detail}")
        self.status = response.status_code


class IngestUnreachable(RuntimeError):
    """The ingest API did not take a call within the retry window (operator down, its store
    down or full, a partition): the runner gives up so that its Job retries the unit."""
