"""Reads of samples: streamed (``yield_per``, so aggregating a million samples keeps memory
flat), paged by keyset cursor for the debugging view, counted, and their ids for resuming."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Select, cast, func, select, true, tuple_
from sqlalchemy.dialects.postgresql import JSONB

from evalkube.store import schema
from evalkube.store.database import Database, load_json
from evalkube.store.filters import SampleFilter, conditions
from evalkube.store.records import SampleRecord
from evalkube.util import jsonfast

#: Sample rows the store fetches from the database at a time when it streams whole samples.
SAMPLES_FETCHED = 100


class SampleReads(Database):
    """Samples and their scores, as stored."""

    def recorded_sample_ids(
        self, run_id: str, task_id: str, model: str, seqs: tuple[int, int] | None = None
    ) -> set[str]:
        """Ids of the task x model's recorded samples; ``seqs``: only those whose sequence
        number is in ``[low, high)`` (one shard's: :func:`evalkube.engine.plan.seq_range`)."""
        return {row[0] for row in self._fetch(ids_query(run_id, task_id, model, seqs))}

    def generation_errored_ids(
        self, run_id: str, task_id: str, model: str, seqs: tuple[int, int] | None = None
    ) -> set[str]:
        """Samples whose model call failed: a resumed run calls again (a failure cost
        nothing, and its cause, a missing key or a provider down, may be fixed by now);
        ``seqs`` as for :meth:`recorded_sample_ids`."""
        query = ids_query(run_id, task_id, model, seqs, error_stage="generation")
        return {row[0] for row in self._fetch(query)}

    def iter_samples(
        self,
        run_id: str,
        *,
        task_id: str | None = None,
        model: str | None = None,
        status: str | Sequence[str] | None = None,
        after: tuple[str, str, int] | None = None,
        limit: int | None = None,
        where: SampleFilter | None = None,
    ) -> Generator[SampleRecord, None, None]:
        """Stream samples ordered by task, model, position; filters are optional."""
        c = schema.samples.c
        query = select(schema.samples).where(c.run_id == run_id)
        if where is not None:
            query = query.where(*conditions(where, schema.samples, self._dialect))
        if task_id is not None:
            query = query.where(c.task_id == task_id)
        if model is not None:
            query = query.where(c.model == model)
        if isinstance(status, str):
            query = query.where(c.status == status)
        elif status is not None:
            query = query.where(c.status.in_(list(status)))
        if after is not None:
            query = query.where(tuple_(c.task_id, c.model, c.seq) > tuple_(*after))
        query = query.order_by(c.task_id, c.model, c.seq)
        if limit is not None:
            query = query.limit(limit)
        # rows fetched at a time: a sample's judge may hold up to 1 MB
        with contextlib.closing(self._stream(query, SAMPLES_FETCHED)) as rows:
            yield from map(_sample, rows)

    def page_samples(
        self,
        run_id: str,
        *,
        task_id: str | None = None,
        model: str | None = None,
        status: str | Sequence[str] | None = None,
        cursor: str | None = None,
        limit: int = 10,
        where: SampleFilter | None = None,
        max_bytes: int | None = None,
    ) -> tuple[list[SampleRecord], str | None]:
        """One page of the debugging view and the opaque cursor of the next page.

        ``max_bytes``: the page also ends before its samples' texts, judges and rows (as
        stored) pass this many bytes, after at least one sample; the cursor goes on from there,
        so a page's memory is bounded whatever the samples hold."""
        after = decode_cursor(cursor) if cursor else None
        page: list[SampleRecord] = []
        size, more = 0, False
        rows = self.iter_samples(
            run_id,
            task_id=task_id,
            model=model,
            status=status,
            after=after,
            limit=limit + 1,
            where=where,
        )
        with contextlib.closing(rows):
            for record in rows:
                if len(page) == limit:
                    more = True
                    break
                if max_bytes is not None:
                    size += sample_bytes(record)
                    if page and size > max_bytes:
                        more = True
                        break
                page.append(record)
        return page, (encode_cursor(page[-1]) if more and page else None)

    def iter_pages(
        self, run_id: str, where: SampleFilter | None = None, page_size: int = 1000
    ) -> Iterator[SampleRecord]:
        """Every matching sample, read a page at a time by keyset cursor.

        Memory stays at one page however large the run, and no read transaction is held
        open between pages (a running unit keeps writing to SQLite meanwhile).
        """
        cursor: str | None = None
        while True:
            page, cursor = self.page_samples(run_id, cursor=cursor, limit=page_size, where=where)
            yield from page
            if cursor is None:
                return

    def unit_scores(
        self, run_id: str, task_id: str, model: str, seqs: tuple[int, int]
    ) -> Iterator[tuple[str, dict[str, float], dict[str, Any]]]:
        """Stream ``(status, scores, model_calls)`` of the task x model's samples with sequence
        numbers in ``[low, high)`` (one unit's), by the order index."""
        c = schema.samples.c
        query = select(c.status, c.scores, c.model_calls).where(
            *_task_model(run_id, task_id, model, seqs)
        )
        for row in self._stream(query):
            yield row[0], jsonfast.loads(row[1]), (load_json(row[2]) or {})

    def iter_scores(
        self, run_id: str
    ) -> Iterator[tuple[str, str, str, dict[str, float], dict[str, Any]]]:
        """Stream ``(task, model, status, scores, model_calls)`` of every sample, for aggregates."""
        c = schema.samples.c
        query = (
            select(c.task_id, c.model, c.status, c.scores, c.model_calls)
            .where(c.run_id == run_id)
            .order_by(c.task_id, c.model)
        )
        for row in self._stream(query):
            yield row[0], row[1], row[2], jsonfast.loads(row[3]), (load_json(row[4]) or {})

    def iter_keyed_scores(
        self, run_id: str
    ) -> Iterator[tuple[str, str, str, str, dict[str, float]]]:
        """Stream ``(task, model, key, status, scores)`` of every sample, where ``key`` names
        the dataset row across runs (its id, else ``#position``): paired comparisons."""
        c = schema.samples.c
        # the row id only, taken out of ``detail`` by the database (a judge may be 1 MB)
        if self._dialect == "postgresql":
            row_id: Any = cast(c.detail, JSONB)["row_id"].astext
        else:
            row_id = func.json_extract(c.detail, "$.row_id")
        query = (
            select(c.task_id, c.model, row_id, c.seq, c.status, c.scores)
            .where(c.run_id == run_id)
            .order_by(c.task_id, c.model, c.seq)
        )
        for row in self._stream(query):
            key = str(row[2]) if row[2] is not None else f"#{row[3]}"
            yield row[0], row[1], key, row[4], jsonfast.loads(row[5])

    def score_names(self, run_id: str, limit: int | None = None) -> list[str]:
        """The metric names any sample of the run has, sorted (the CSV export's columns); the
        first ``limit`` of them (graders choose names, a run may have millions)."""
        c = schema.samples.c
        if self._dialect == "postgresql":
            each = func.jsonb_each_text(cast(c.scores, JSONB)).table_valued("key", "value")
        else:
            each = func.json_each(c.scores).table_valued("key", "value")
        query = (
            select(each.c.key)
            .select_from(schema.samples)
            .join(each, true())
            .where(c.run_id == run_id)
            .distinct()
            .order_by(each.c.key)
            .limit(limit)
        )
        return sorted(str(row[0]) for row in self._fetch(query))

    def sample_counts(self, run_id: str) -> dict[tuple[str, str], int]:
        """Samples per task x model (a count over the order index, no sample read)."""
        c = schema.samples.c
        query = (
            select(c.task_id, c.model, func.count())
            .where(c.run_id == run_id)
            .group_by(c.task_id, c.model)
        )
        return {(row[0], row[1]): int(row[2]) for row in self._fetch(query)}

    def status_counts(self, run_id: str) -> dict[tuple[str, str], dict[str, int]]:
        """Samples per task x model and status (``evalkube runs`` of an unfinished run)."""
        c = schema.samples.c
        query = (
            select(c.task_id, c.model, c.status, func.count())
            .where(c.run_id == run_id)
            .group_by(c.task_id, c.model, c.status)
        )
        out: dict[tuple[str, str], dict[str, int]] = {}
        for task, model, status, count in self._fetch(query):
            out.setdefault((task, model), {})[status] = int(count)
        return out


def ids_query(
    run_id: str,
    task_id: str,
    model: str,
    seqs: tuple[int, int] | None = None,
    error_stage: str | None = None,
) -> Select[str]:
    """Sample ids of a task x model (with sequence numbers in ``[low, high)``, and an error
    stage): one range of the ``(run_id, task_id, model, seq)`` index, whatever the run's size."""
    c = schema.samples.c
    query = select(c.sample_id).where(*_task_model(run_id, task_id, model, seqs))
    if error_stage is not None:
        query = query.where(c.error_stage == error_stage)
    return query


def _task_model(
    run_id: str, task_id: str, model: str, seqs: tuple[int, int] | None
) -> list[ColumnElement[bool]]:
    """A task x model's samples (those with sequence numbers in ``[low, high)``)."""
    c = schema.samples.c
    where = [c.run_id == run_id, c.task_id == task_id, c.model == model]
    if seqs is not None:
        where += [c.seq >= seqs[0], c.seq < seqs[1]]
    return where


def sample_bytes(record: SampleRecord) -> int:
    """About how many bytes ``record`` holds: its texts, and its judge, error, scores and
    dataset row as JSON (what bounds a page of samples)."""
    size = 256
    for text in (
        record.prompt if isinstance(record.prompt, str) else None,
        record.target,
        record.output_text,
        record.stdout,
        record.stderr,
    ):
        size += len(text) if text else 0
    for value in (
        record.judge,
        record.error,
        record.scores,
        record.dataset_row,
        record.extracted_output,
    ):
        if value:
            size += len(value) if isinstance(value, str) else len(jsonfast.dumps(value))
    if record.prompt is not None and not isinstance(record.prompt, str):
        size += len(jsonfast.dumps(record.prompt))
    return size


def encode_cursor(record: SampleRecord) -> str:
    raw = json.dumps([record.task_id, record.model, record.seq]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str, int]:
    """Decode a page cursor; :class:`ValueError` on anything malformed."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        task, model, seq = json.loads(base64.urlsafe_b64decode(padded))
        if not (isinstance(task, str) and isinstance(model, str) and isinstance(seq, int)):
            raise ValueError
        return task, model, seq
    except Exception:
        raise ValueError("invalid cursor; use the `next_cursor` of the previous page") from None


def _sample(row: Any) -> SampleRecord:
    detail = jsonfast.loads(row.detail)
    record = SampleRecord(
        run_id=row.run_id,
        sample_id=row.sample_id,
        task_id=row.task_id,
        model=row.model,
        seq=row.seq,
        status=row.status,
        scores=load_json(row.scores) or {},
        model_calls=load_json(row.model_calls) or {},
        **{key: detail.get(key) for key in schema.DETAIL_KEYS},
    )
    # absent (or null) in ``detail``: empty, as in a record that was never stored
    record.dataset_row = record.dataset_row or {}
    record.timings = record.timings or {}
    return record
