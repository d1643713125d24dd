"""The results store: every sample recorded before its unit counts as done.

SQLite (a file, the embedded default) or PostgreSQL (by URL). Writes are idempotent by
``(run_id, sample_id)`` so a resumed run or a retried ingest never duplicates a sample, and
reads stream (``yield_per``) so aggregating a million samples keeps memory flat.

The sample write path is the engine's pacing stage, so it is built around CPython's GIL:
``sqlite3.executemany`` releases and retakes the GIL once per row, and with the runner's
thread busy the writer thread then waits for the GIL on every row (five times slower,
measured). On SQLite a chunk of samples is therefore one JSON text and one statement
(``INSERT ... SELECT ... FROM json_each(?)``): one GIL hand-off per chunk, the parsing and
inserting done in C with the GIL released. Each sample is a flat array of strings and
numbers there (its JSON columns already encoded), and the values a whole chunk shares
(run, task, model) are bound once: SQLite re-parses the array for every value it takes
out, so short arrays keep that cheap. PostgreSQL gets rows through the driver.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any

import tenacity
from sqlalchemy import (
    ColumnElement,
    Engine,
    Select,
    and_,
    bindparam,
    cast,
    create_engine,
    event,
    func,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import make_url

from evalkube import jsonfast, limits
from evalkube.store import migrate, schema
from evalkube.store.errors import StoreError
from evalkube.store.filters import SampleFilter, conditions
from evalkube.store.records import RunRecord, SampleRecord, TaskResultRecord

_dumps = jsonfast.dumps_str


def _json(value: Any) -> str | None:
    return None if value is None else _dumps(value)


def _load(text: str | None) -> Any:
    return None if text is None else jsonfast.loads(text)


def _text(value: Any) -> Any:
    """A plain text column value: PostgreSQL refuses NUL characters, so they become U+FFFD.

    Model outputs and user prints (untrusted) may hold NUL; one must not fail a whole unit.
    JSON columns need nothing: the encoder escapes NUL as ``\\u0000``.
    """
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


_SAMPLE_COLUMNS = [column.name for column in schema.samples.columns]
_SAMPLE_KEYS = ("run_id", "sample_id")
#: Columns a chunk of one task x model of a run shares (bound once on SQLite).
_SHARED = ("run_id", "task_id", "model")


def _sample_upsert_sql(values: str) -> str:
    """``INSERT ... ON CONFLICT DO UPDATE`` (same text on SQLite and PostgreSQL)."""
    columns = ", ".join(_SAMPLE_COLUMNS)
    updates = ", ".join(f"{c} = excluded.{c}" for c in _SAMPLE_COLUMNS if c not in _SAMPLE_KEYS)
    return (
        f"INSERT INTO {schema.samples.name} ({columns}) {values} "
        f"ON CONFLICT ({', '.join(_SAMPLE_KEYS)}) DO UPDATE SET {updates}"
    )


#: Positions in an encoded row of the values that differ between a chunk's samples.
_OWN = [i for i, name in enumerate(_SAMPLE_COLUMNS) if name not in _SHARED]
_OWN_VALUES = itemgetter(*_OWN)
_SHARED_VALUES = itemgetter(*(_SAMPLE_COLUMNS.index(name) for name in _SHARED))


def _sample_json_each_sql() -> str:
    """SQLite: upsert a chunk bound as ``(JSON array of own values, run, task, model)``."""
    picks = []
    for name in _SAMPLE_COLUMNS:
        if name in _SHARED:
            picks.append(f"?{2 + _SHARED.index(name)}")
        else:
            picks.append(f"value ->> {_OWN.index(_SAMPLE_COLUMNS.index(name))}")
    # ``WHERE true`` lets SQLite parse ``ON CONFLICT`` after ``SELECT ... FROM``.
    return _sample_upsert_sql(f"SELECT {', '.join(picks)} FROM json_each(?1) WHERE true")


def _sample_row(r: SampleRecord) -> tuple[Any, ...]:
    """A sample's column values in ``_SAMPLE_COLUMNS`` order, JSON columns encoded."""
    detail: dict[str, Any] = {
        "row_id": r.row_id,
        "prompt": r.prompt,
        "target": r.target,
        "output_text": r.output_text,
        "extracted_output": r.extracted_output,
        "dataset_row": r.dataset_row,
    }
    error = r.error
    if r.judge is not None:
        detail["judge"] = r.judge
    if error is not None:
        detail["error"] = error
    if r.response_id is not None:
        detail["response_id"] = r.response_id
    if r.timings:
        detail["timings"] = r.timings
    if r.stdout is not None:
        detail["stdout"] = r.stdout
    if r.stderr is not None:
        detail["stderr"] = r.stderr
    return (
        r.run_id,
        r.sample_id,
        r.task_id,
        r.model,
        r.seq,
        r.status,
        error.get("stage") if error else None,
        _dumps(r.scores),
        _dumps(r.model_calls) if r.model_calls else None,
        _dumps(detail),
    )


def default_url(path: str) -> str:
    """SQLite URL for a file path."""
    return f"sqlite:///{path}"


class ResultStore:
    """Runs, units, samples and task results on SQLite or PostgreSQL."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._dialect = engine.dialect.name
        paramstyle = engine.dialect.paramstyle
        placeholder = "?" if paramstyle == "qmark" else "%s"
        self._sample_sql = _sample_upsert_sql(
            f"VALUES ({', '.join([placeholder] * len(_SAMPLE_COLUMNS))})"
        )
        self._sample_chunk_sql = _sample_json_each_sql() if self._dialect == "sqlite" else None

    @classmethod
    def open(cls, url: str) -> ResultStore:
        """Open the store at ``url``, creating its tables or upgrading them to this evalkube's
        (:mod:`evalkube.store.migrate`)."""
        try:
            parsed = make_url(url)
        except Exception as exc:
            raise StoreError(f"invalid store URL {url!r}: {exc}") from None
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        kwargs: dict[str, Any] = {}
        if parsed.get_backend_name() == "sqlite":
            kwargs["connect_args"] = {"timeout": SQLITE_LOCK_SECONDS}
        engine = create_engine(parsed, **kwargs)
        if parsed.get_backend_name() == "sqlite":
            event.listen(engine, "connect", _sqlite_pragmas)
        shown = parsed.render_as_string(hide_password=True)
        try:
            migrate.upgrade(engine, shown)
        except StoreError:
            engine.dispose()
            raise
        except Exception as exc:
            engine.dispose()
            raise StoreError(f"cannot open the results store {shown}: {exc}") from None
        return cls(engine)

    @property
    def location(self) -> str:
        """The store's URL without its password (a SQLite store: its file), for messages."""
        url = self.engine.url
        if url.get_backend_name() == "sqlite" and url.database:
            return str(Path(url.database).resolve())
        return url.render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    # -- runs -------------------------------------------------------------------------------
    def create_run(self, run: RunRecord) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                schema.runs.insert().values(
                    run_id=run.run_id,
                    suite_name=run.suite_name,
                    suite_version=run.suite_version,
                    spec=_json(run.spec),
                    sandbox=run.sandbox,
                    phase=run.phase,
                    created_at=run.created_at or datetime.now(UTC),
                    completed_at=run.completed_at,
                    summary=_json(run.summary),
                )
            )

    def get_run(self, run_id: str) -> RunRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(schema.runs).where(schema.runs.c.run_id == run_id)).first()
        return _run(row) if row is not None else None

    def list_runs(self, limit: int = 20) -> list[RunRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(schema.runs).order_by(schema.runs.c.created_at.desc()).limit(limit)
            ).all()
        return [_run(row) for row in rows]

    def last_run(
        self, suite_name: str, *, phase: str = "Succeeded", id_prefix: str = "", exclude: str = ""
    ) -> RunRecord | None:
        """The latest finished run of ``suite_name`` in ``phase`` whose id starts with
        ``id_prefix`` (a namespace's runs), other than ``exclude``: a gate's baseline."""
        c = schema.runs.c
        query = (
            select(schema.runs)
            .where(c.suite_name == suite_name, c.phase == phase, c.run_id != exclude)
            .where(c.run_id.startswith(id_prefix, autoescape=True))
            .order_by(c.completed_at.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return _run(row) if row is not None else None

    def finish_run(self, run_id: str, phase: str, summary: dict[str, Any] | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(schema.runs)
                .where(schema.runs.c.run_id == run_id)
                .values(phase=phase, completed_at=datetime.now(UTC), summary=_json(summary))
            )

    def update_run_suite(self, run_id: str, suite_version: str, spec: dict[str, Any]) -> None:
        """A resumed run took new suite files (``--reload``): its version and snapshot."""
        with self.engine.begin() as conn:
            conn.execute(
                update(schema.runs)
                .where(schema.runs.c.run_id == run_id)
                .values(suite_version=suite_version, spec=_json(spec))
            )

    def set_run_phase(self, run_id: str, phase: str, sandbox: str | None = None) -> None:
        values: dict[str, Any] = {"phase": phase, "completed_at": None}
        if sandbox is not None:
            values["sandbox"] = sandbox
        with self.engine.begin() as conn:
            conn.execute(update(schema.runs).where(schema.runs.c.run_id == run_id).values(**values))

    # -- units ------------------------------------------------------------------------------
    def mark_unit_done(self, run_id: str, unit_id: str, info: dict[str, Any] | None = None) -> None:
        """Record the unit done (again: a replayed report). Its aggregate, if one was kept,
        is dropped in the same transaction, to be computed afresh from its samples."""
        row = {
            "run_id": run_id,
            "unit_id": unit_id,
            "state": "done",
            "info": _json(info),
            "finished_at": datetime.now(UTC),
        }
        with self.engine.begin() as conn:
            conn.execute(
                _upsert_statement(self._dialect, schema.units, row, ("run_id", "unit_id")), [row]
            )
            kept = schema.unit_aggregates.c
            conn.execute(
                schema.unit_aggregates.delete().where(
                    kept.run_id == run_id, kept.unit_id == unit_id
                )
            )

    # -- per-unit aggregates (evalkube.controller.results) ---------------------------------
    def unit_scores(
        self, run_id: str, task_id: str, model: str, seqs: tuple[int, int]
    ) -> Iterator[tuple[str, dict[str, float], dict[str, Any]]]:
        """Stream ``(status, scores, model_calls)`` of the task x model's samples with sequence
        numbers in ``[low, high)`` (one unit's), by the order index."""
        c = schema.samples.c
        query = select(c.status, c.scores, c.model_calls).where(
            *_task_model(run_id, task_id, model, seqs)
        )
        with self.engine.connect() as conn:
            for row in conn.execution_options(yield_per=5000).execute(query):
                yield row[0], jsonfast.loads(row[1]), (_load(row[2]) or {})

    def save_unit_aggregate(
        self, run_id: str, unit_id: str, task_id: str, model: str, aggregate: dict[str, Any]
    ) -> None:
        """Keep a unit's aggregate (replacing an earlier one of the unit)."""
        self._upsert(
            schema.unit_aggregates,
            [
                {
                    "run_id": run_id,
                    "unit_id": unit_id,
                    "task_id": task_id,
                    "model": model,
                    "aggregate": _dumps(aggregate),
                }
            ],
            ("run_id", "unit_id"),
        )

    def unit_aggregate_ids(self, run_id: str) -> set[str]:
        """The units of the run whose aggregate is kept."""
        c = schema.unit_aggregates.c
        with self.engine.connect() as conn:
            return {row[0] for row in conn.execute(select(c.unit_id).where(c.run_id == run_id))}

    def unit_aggregates(self, run_id: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
        """``unit id -> (task, model, aggregate)`` of every unit aggregate kept for the run."""
        c = schema.unit_aggregates.c
        query = select(c.unit_id, c.task_id, c.model, c.aggregate).where(c.run_id == run_id)
        with self.engine.connect() as conn:
            return {row[0]: (row[1], row[2], jsonfast.loads(row[3])) for row in conn.execute(query)}

    def sample_counts(self, run_id: str) -> dict[tuple[str, str], int]:
        """Samples per task x model (a count over the order index, no sample read)."""
        c = schema.samples.c
        query = (
            select(c.task_id, c.model, func.count())
            .where(c.run_id == run_id)
            .group_by(c.task_id, c.model)
        )
        with self.engine.connect() as conn:
            return {(row[0], row[1]): int(row[2]) for row in conn.execute(query)}

    def mark_unit_failed(self, run_id: str, unit_id: str, reason: str) -> None:
        """A unit's runner found it cannot run (its programs do not load, a ``grade_batch``
        past its limits): the reason, for the run's status. Never over a unit done."""
        row = {
            "run_id": run_id,
            "unit_id": unit_id,
            "state": "failed",
            "info": _json({"reason": reason[: limits.ERROR_MESSAGE_CHARS]}),
            "finished_at": datetime.now(UTC),
        }
        insert = (postgresql.insert if self._dialect == "postgresql" else sqlite.insert)(
            schema.units
        )
        statement = insert.on_conflict_do_update(
            index_elements=["run_id", "unit_id"],
            set_={name: insert.excluded[name] for name in ("state", "info", "finished_at")},
            where=schema.units.c.state != "done",
        )
        with self.engine.begin() as conn:
            conn.execute(statement, [row])

    def failed_units(self, run_id: str) -> dict[str, str]:
        """``unit -> reason`` of the units their runner reported failed (and not done since)."""
        units = schema.units.c
        query = select(units.unit_id, units.info).where(
            units.run_id == run_id, units.state == "failed"
        )
        with self.engine.connect() as conn:
            return {
                row[0]: str((_load(row[1]) or {}).get("reason") or "the unit's runner failed")
                for row in conn.execute(query)
            }

    def done_units(self, run_id: str) -> set[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(schema.units.c.unit_id).where(
                    and_(schema.units.c.run_id == run_id, schema.units.c.state == "done")
                )
            )
            return {row[0] for row in rows}

    def done_unit_infos(self, run_id: str) -> dict[str, dict[str, Any]]:
        """What each done unit's runner reported with it (``units/{unit}:done``)."""
        units = schema.units.c
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(units.unit_id, units.info).where(
                    and_(units.run_id == run_id, units.state == "done")
                )
            )
            return {row[0]: _load(row[1]) or {} for row in rows}

    # -- samples ----------------------------------------------------------------------------
    def record_samples(self, records: Sequence[SampleRecord]) -> None:
        """Insert or replace samples, a chunk per transaction (idempotent by sample id)."""
        for start in range(0, len(records), limits.STORE_CHUNK_SIZE):
            self.write_encoded(
                self.encode_samples(records[start : start + limits.STORE_CHUNK_SIZE])
            )

    def encode_samples(self, records: Sequence[SampleRecord]) -> list[tuple[Any, ...]]:
        """Encode records for :meth:`write_encoded` (done on the runner's thread)."""
        return [_sample_row(r) for r in records]

    def write_encoded(self, rows: list[tuple[Any, ...]]) -> None:
        """Upsert what :meth:`encode_samples` produced in one transaction (writer thread)."""
        if not rows:
            return
        with self.engine.begin() as conn:
            if self._sample_chunk_sql is None:
                conn.exec_driver_sql(self._sample_sql, rows)
                return
            own = _OWN_VALUES
            for (run_id, task_id, model), group in groupby(rows, key=_SHARED_VALUES):
                chunk = jsonfast.dumps_str([own(row) for row in group])
                conn.exec_driver_sql(self._sample_chunk_sql, (chunk, run_id, task_id, model))

    def recorded_sample_ids(
        self, run_id: str, task_id: str, model: str, seqs: tuple[int, int] | None = None
    ) -> set[str]:
        """Ids of the task x model's recorded samples; ``seqs``: only those whose sequence
        number is in ``[low, high)`` (one shard's: :func:`evalkube.engine.plan.seq_range`)."""
        with self.engine.connect() as conn:
            return {row[0] for row in conn.execute(ids_query(run_id, task_id, model, seqs))}

    def generation_errored_ids(
        self, run_id: str, task_id: str, model: str, seqs: tuple[int, int] | None = None
    ) -> set[str]:
        """Samples whose model call failed: a resumed run calls again (a failure cost
        nothing, and its cause, a missing key or a provider down, may be fixed by now);
        ``seqs`` as for :meth:`recorded_sample_ids`."""
        query = ids_query(run_id, task_id, model, seqs, error_stage="generation")
        with self.engine.connect() as conn:
            return {row[0] for row in conn.execute(query)}

    def iter_samples(
        self,
        run_id: str,
        *,
        task_id: str | None = None,
        model: str | None = None,
        status: str | Sequence[str] | None = None,
        after: tuple[str, str, int] | None = None,
        limit: int | None = None,
        columns: str = "all",
        where: SampleFilter | None = None,
    ) -> Iterator[SampleRecord]:
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
        with self.engine.connect() as conn:
            # rows fetched at a time: a sample's judge may hold up to 1 MB
            result = conn.execution_options(yield_per=SAMPLES_FETCHED).execute(query)
            try:
                for row in result:
                    yield _sample(row)
            finally:  # a reader that stops early (a page full) closes the server's cursor
                result.close()

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
        try:
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
        finally:
            getattr(rows, "close", lambda: None)()
        next_cursor = encode_cursor(page[-1]) if more and page else None
        return page, next_cursor

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
        with self.engine.connect() as conn:
            return sorted(str(row[0]) for row in conn.execute(query))

    def status_counts(self, run_id: str) -> dict[tuple[str, str], dict[str, int]]:
        """Samples per task x model and status (``evalkube runs`` of an unfinished run)."""
        c = schema.samples.c
        query = (
            select(c.task_id, c.model, c.status, func.count())
            .where(c.run_id == run_id)
            .group_by(c.task_id, c.model, c.status)
        )
        out: dict[tuple[str, str], dict[str, int]] = {}
        with self.engine.connect() as conn:
            for task, model, status, count in conn.execute(query):
                out.setdefault((task, model), {})[status] = int(count)
        return out

    def apply_sample_updates(self, run_id: str, updates: Iterable[dict[str, Any]]) -> None:
        """Write batch updates in order: each has ``sample_id`` and new values of ``scores``,
        ``judge``, ``extracted_output`` or ``error`` (``None`` clears)."""
        changes = list(updates)
        if not changes:
            return
        c = schema.samples.c
        ids = list(dict.fromkeys(change["sample_id"] for change in changes))
        with self.engine.begin() as conn:
            current: dict[str, dict[str, Any]] = {}
            for start in range(0, len(ids), 500):
                rows = conn.execute(
                    select(*_PATCHED).where(
                        c.run_id == run_id, c.sample_id.in_(ids[start : start + 500])
                    )
                )
                for row in rows:
                    current[row[0]] = _state(row)
            for change in changes:
                state = current.get(change["sample_id"])
                if state is not None:
                    _patch(state, {k: v for k, v in change.items() if k != "sample_id"})
            self._rewrite(conn, run_id, current.items())

    def settle_pending(
        self,
        run_id: str,
        task_id: str,
        model: str,
        status: str,
        values: dict[str, Any] | None = None,
    ) -> int:
        """Move the task x model's ``pending`` samples to ``status`` (after ``grade_batch``),
        setting ``values`` (``scores``, ``judge``, ``error``) on each."""
        c = schema.samples.c
        pending = and_(
            c.run_id == run_id, c.task_id == task_id, c.model == model, c.status == "pending"
        )
        with self.engine.begin() as conn:
            if values:
                states = [
                    (row[0], _state(row)) for row in conn.execute(select(*_PATCHED).where(pending))
                ]
                for _, state in states:
                    _patch(state, values)
                self._rewrite(conn, run_id, states)
            result = conn.execute(update(schema.samples).where(pending).values(status=status))
            return int(result.rowcount or 0)

    @staticmethod
    def _rewrite(conn: Any, run_id: str, states: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Store patched states (see ``_state``) of samples."""
        c = schema.samples.c
        params = [
            {
                "b_run": run_id,
                "b_id": sample_id,
                "b_status": state["status"],
                "b_stage": state["error_stage"],
                "b_scores": _dumps(state["scores"]),
                "b_detail": _dumps(state["detail"]),
            }
            for sample_id, state in states
        ]
        if params:
            conn.execute(
                update(schema.samples)
                .where(c.run_id == bindparam("b_run"), c.sample_id == bindparam("b_id"))
                .values(
                    status=bindparam("b_status"),
                    error_stage=bindparam("b_stage"),
                    scores=bindparam("b_scores"),
                    detail=bindparam("b_detail"),
                ),
                params,
            )

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
        with self.engine.connect() as conn:
            for row in conn.execution_options(yield_per=5000).execute(query):
                yield row[0], row[1], row[2], jsonfast.loads(row[3]), (_load(row[4]) or {})

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
        with self.engine.connect() as conn:
            for row in conn.execution_options(yield_per=5000).execute(query):
                key = str(row[2]) if row[2] is not None else f"#{row[3]}"
                yield row[0], row[1], key, row[4], jsonfast.loads(row[5])

    # -- model answers ----------------------------------------------------------------------
    def record_answers(self, run_id: str, purpose: str, answers: Sequence[tuple[str, Any]]) -> None:
        """Keep ``(sample_id, answer)`` pairs (one transaction, idempotent by sample id)."""
        self._upsert(
            schema.answers,
            [
                {"run_id": run_id, "sample_id": sid, "purpose": purpose, "answer": _dumps(answer)}
                for sid, answer in answers
            ],
            ("run_id", "sample_id", "purpose"),
        )

    def recorded_answers(
        self, run_id: str, purpose: str, sample_ids: Sequence[str]
    ) -> dict[str, Any]:
        """The kept answers of ``sample_ids`` (those that have one)."""
        c = schema.answers.c
        found: dict[str, Any] = {}
        with self.engine.connect() as conn:
            for start in range(0, len(sample_ids), 500):
                rows = conn.execute(
                    select(c.sample_id, c.answer).where(
                        c.run_id == run_id,
                        c.purpose == purpose,
                        c.sample_id.in_(list(sample_ids[start : start + 500])),
                    )
                )
                found.update((row[0], jsonfast.loads(row[1])) for row in rows)
        return found

    def forget_answers(self, run_id: str) -> None:
        """Drop a run's kept answers (its samples hold them once it has succeeded)."""
        with self.engine.begin() as conn:
            conn.execute(schema.answers.delete().where(schema.answers.c.run_id == run_id))

    # -- task results -----------------------------------------------------------------------
    def save_task_result(self, result: TaskResultRecord) -> None:
        self._upsert(
            schema.task_results,
            [
                {
                    "run_id": result.run_id,
                    "task_id": result.task_id,
                    "model": result.model,
                    "metrics": _json(result.metrics),
                    "error": _text(result.error),
                    "problems": _json(result.problems),
                    "model_calls": _json(result.model_calls) if result.model_calls else None,
                }
            ],
            ("run_id", "task_id", "model"),
        )

    def task_results(self, run_id: str) -> list[TaskResultRecord]:
        c = schema.task_results.c
        with self.engine.connect() as conn:
            rows = conn.execute(select(schema.task_results).where(c.run_id == run_id)).all()
        return [
            TaskResultRecord(
                row.run_id,
                row.task_id,
                row.model,
                _load(row.metrics) or {},
                row.error,
                _load(row.problems) or [],
                _load(row.model_calls) or {},
            )
            for row in rows
        ]

    # -- internals --------------------------------------------------------------------------
    def _upsert(self, table: Any, rows: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
        if not rows:
            return
        with self.engine.begin() as conn:
            conn.execute(_upsert_statement(self._dialect, table, rows[0], keys), rows)


def _upsert_statement(dialect: str, table: Any, row: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """``INSERT ... ON CONFLICT (keys) DO UPDATE`` of rows shaped like ``row``."""
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)
    columns = [name for name in row if name not in keys]
    return insert.on_conflict_do_update(
        index_elements=list(keys), set_={name: insert.excluded[name] for name in columns}
    )


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


#: Sample rows the store fetches from the database at a time when it streams whole samples.
SAMPLES_FETCHED = 100


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


#: Seconds a new SQLite connection keeps trying to switch the file to WAL (its busy timeout).
SQLITE_LOCK_SECONDS = 30


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # Switching a new file to WAL needs it to itself, and SQLite answers "database is locked"
    # at once, without its busy timeout, while another connection opening the same new store
    # holds it: try again until that one is done (then the file is in WAL and this is a read).
    for attempt in tenacity.Retrying(
        retry=tenacity.retry_if_exception(
            lambda exc: isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
        ),
        wait=tenacity.wait_random(0.01, 0.05),
        stop=tenacity.stop_after_delay(SQLITE_LOCK_SECONDS),
        reraise=True,
    ):
        with attempt:
            cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


#: Columns a batch update reads, patches and writes back.
_PATCHED = (
    schema.samples.c.sample_id,
    schema.samples.c.status,
    schema.samples.c.error_stage,
    schema.samples.c.scores,
    schema.samples.c.detail,
)


def _state(row: Any) -> dict[str, Any]:
    return {
        "status": row[1],
        "error_stage": row[2],
        "scores": jsonfast.loads(row[3]),
        "detail": jsonfast.loads(row[4]),
    }


def _patch(state: dict[str, Any], values: dict[str, Any]) -> None:
    """Apply new values (``status``, ``scores`` or a ``detail`` field) to a sample's state."""
    for key, value in values.items():
        if key in ("status", "scores"):
            state[key] = value
        elif key in schema.DETAIL_KEYS:
            state["detail"][key] = value
            if key == "error":
                state["error_stage"] = value.get("stage") if isinstance(value, dict) else None
        else:
            raise ValueError(f"cannot update sample field {key!r}")


def _sample(row: Any) -> SampleRecord:
    detail = jsonfast.loads(row.detail)
    return SampleRecord(
        run_id=row.run_id,
        sample_id=row.sample_id,
        task_id=row.task_id,
        model=row.model,
        seq=row.seq,
        status=row.status,
        row_id=detail.get("row_id"),
        prompt=detail.get("prompt"),
        target=detail.get("target"),
        output_text=detail.get("output_text"),
        extracted_output=detail.get("extracted_output"),
        scores=_load(row.scores) or {},
        judge=detail.get("judge"),
        error=detail.get("error"),
        model_calls=_load(row.model_calls) or {},
        response_id=detail.get("response_id"),
        dataset_row=detail.get("dataset_row") or {},
        timings=detail.get("timings") or {},
        stdout=detail.get("stdout"),
        stderr=detail.get("stderr"),
    )


def _run(row: Any) -> RunRecord:
    return RunRecord(
        run_id=row.run_id,
        suite_name=row.suite_name,
        suite_version=row.suite_version,
        spec=_load(row.spec) or {},
        sandbox=row.sandbox,
        phase=row.phase,
        created_at=row.created_at,
        completed_at=row.completed_at,
        summary=_load(row.summary),
    )
