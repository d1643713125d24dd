"""Writes of samples: recorded in chunks (idempotent by ``(run_id, sample_id)``, so a resumed
run or a retried ingest never duplicates a sample), then patched by batch graders.

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

from collections.abc import Iterable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

from sqlalchemy import Engine, and_, bindparam, select, update

from evalkube import limits
from evalkube.store import schema
from evalkube.store.database import Database
from evalkube.store.records import SampleRecord
from evalkube.util import jsonfast

_dumps = jsonfast.dumps_str
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
    picks = [
        f"?{2 + _SHARED.index(name)}" if name in _SHARED else f"value ->> {_OWN.index(i)}"
        for i, name in enumerate(_SAMPLE_COLUMNS)
    ]
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


class SampleWrites(Database):
    """Samples recorded (a chunk per transaction) and updated after ``grade_batch``."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        placeholder = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        values = ", ".join([placeholder] * len(_SAMPLE_COLUMNS))
        self._sample_sql = _sample_upsert_sql(f"VALUES ({values})")
        self._sample_chunk_sql = _sample_json_each_sql() if self._dialect == "sqlite" else None

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
                chunk = ids[start : start + 500]
                current.update(_states(conn, c.run_id == run_id, c.sample_id.in_(chunk)))
            for change in changes:
                state = current.get(change["sample_id"])
                if state is not None:
                    _patch(state, {k: v for k, v in change.items() if k != "sample_id"})
            _rewrite(conn, run_id, current.items())

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
                states = _states(conn, pending)
                for state in states.values():
                    _patch(state, values)
                _rewrite(conn, run_id, states.items())
            result = conn.execute(update(schema.samples).where(pending).values(status=status))
            return int(result.rowcount or 0)


#: Columns a batch update reads, patches and writes back.
_PATCHED = (
    schema.samples.c.sample_id,
    schema.samples.c.status,
    schema.samples.c.error_stage,
    schema.samples.c.scores,
    schema.samples.c.detail,
)


def _states(conn: Any, *where: Any) -> dict[str, dict[str, Any]]:
    """``sample id -> state`` (:data:`_PATCHED`, decoded) of the samples ``where`` selects."""
    return {
        row[0]: {
            "status": row[1],
            "error_stage": row[2],
            "scores": jsonfast.loads(row[3]),
            "detail": jsonfast.loads(row[4]),
        }
        for row in conn.execute(select(*_PATCHED).where(*where))
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


def _rewrite(conn: Any, run_id: str, states: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Store patched states (see :func:`_states`) of samples."""
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
