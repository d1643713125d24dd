"""A run's records other than its samples: the run, its units' reports and their aggregates,
task results, and the model answers kept for ``--resume``; written and read."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite

from evalkube import limits
from evalkube.store import schema
from evalkube.store.database import Database, load_json
from evalkube.store.records import RunRecord, TaskResultRecord
from evalkube.util import jsonfast

_dumps = jsonfast.dumps_str
_UNIT_KEYS = ("run_id", "unit_id")


def _json(value: Any) -> str | None:
    return None if value is None else _dumps(value)


def _text(value: Any) -> Any:
    """A plain text column value: PostgreSQL refuses NUL characters, so they become U+FFFD.

    Model outputs and user prints (untrusted) may hold NUL; one must not fail a whole unit.
    JSON columns need nothing: the encoder escapes NUL as ``\\u0000``.
    """
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


class RunState(Database):
    """Runs, units, unit aggregates, task results and kept answers."""

    # -- runs ------------------------------------------------------------------------------
    def create_run(self, run: RunRecord) -> None:
        self._write(
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

    def finish_run(self, run_id: str, phase: str, summary: dict[str, Any] | None) -> None:
        now = datetime.now(UTC)
        self._update_run(run_id, phase=phase, completed_at=now, summary=_json(summary))

    def update_run_suite(self, run_id: str, suite_version: str, spec: dict[str, Any]) -> None:
        """A resumed run took new suite files (``--reload``): its version and snapshot."""
        self._update_run(run_id, suite_version=suite_version, spec=_json(spec))

    def set_run_phase(self, run_id: str, phase: str, sandbox: str | None = None) -> None:
        also = {"sandbox": sandbox} if sandbox is not None else {}
        self._update_run(run_id, phase=phase, completed_at=None, **also)

    def _update_run(self, run_id: str, **values: Any) -> None:
        self._write(update(schema.runs).where(schema.runs.c.run_id == run_id).values(**values))

    def get_run(self, run_id: str) -> RunRecord | None:
        query = select(schema.runs).where(schema.runs.c.run_id == run_id)
        return next(map(_run, self._fetch(query)), None)

    def list_runs(self, limit: int = 20) -> list[RunRecord]:
        query = select(schema.runs).order_by(schema.runs.c.created_at.desc()).limit(limit)
        return [_run(row) for row in self._fetch(query)]

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
        return next(map(_run, self._fetch(query)), None)

    # -- units and their aggregates (evalkube.controller.results) --------------------------
    def mark_unit_done(self, run_id: str, unit_id: str, info: dict[str, Any] | None = None) -> None:
        """Record the unit done (again: a replayed report). Its aggregate, if one was kept,
        is dropped in the same transaction, to be computed afresh from its samples."""
        row = _unit_row(run_id, unit_id, "done", info)
        kept = schema.unit_aggregates
        with self.engine.begin() as conn:
            conn.execute(_upsert_statement(self._dialect, schema.units, row, _UNIT_KEYS), [row])
            conn.execute(kept.delete().where(kept.c.run_id == run_id, kept.c.unit_id == unit_id))

    def mark_unit_failed(self, run_id: str, unit_id: str, reason: str) -> None:
        """A unit's runner found it cannot run (its programs do not load, a ``grade_batch``
        past its limits): the reason, for the run's status. Never over a unit done."""
        info = {"reason": reason[: limits.ERROR_MESSAGE_CHARS]}
        where = schema.units.c.state != "done"
        self._upsert(schema.units, [_unit_row(run_id, unit_id, "failed", info)], _UNIT_KEYS, where)

    def save_unit_aggregate(
        self, run_id: str, unit_id: str, task_id: str, model: str, aggregate: dict[str, Any]
    ) -> None:
        """Keep a unit's aggregate (replacing an earlier one of the unit)."""
        row = {"run_id": run_id, "unit_id": unit_id, "task_id": task_id, "model": model}
        row["aggregate"] = _dumps(aggregate)
        self._upsert(schema.unit_aggregates, [row], _UNIT_KEYS)

    def failed_units(self, run_id: str) -> dict[str, str]:
        """``unit -> reason`` of the units their runner reported failed (and not done since)."""
        return {
            row[0]: str((load_json(row[1]) or {}).get("reason") or "the unit's runner failed")
            for row in self._unit_infos(run_id, "failed")
        }

    def done_units(self, run_id: str) -> set[str]:
        return {row[0] for row in self._unit_infos(run_id, "done")}

    def done_unit_infos(self, run_id: str) -> dict[str, dict[str, Any]]:
        """What each done unit's runner reported with it (``units/{unit}:done``)."""
        return {row[0]: load_json(row[1]) or {} for row in self._unit_infos(run_id, "done")}

    def _unit_infos(self, run_id: str, state: str) -> list[Any]:
        c = schema.units.c
        return self._fetch(select(c.unit_id, c.info).where(c.run_id == run_id, c.state == state))

    def unit_aggregate_ids(self, run_id: str) -> set[str]:
        """The units of the run whose aggregate is kept."""
        c = schema.unit_aggregates.c
        return {row[0] for row in self._fetch(select(c.unit_id).where(c.run_id == run_id))}

    def unit_aggregates(self, run_id: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
        """``unit id -> (task, model, aggregate)`` of every unit aggregate kept for the run."""
        c = schema.unit_aggregates.c
        query = select(c.unit_id, c.task_id, c.model, c.aggregate).where(c.run_id == run_id)
        return {row[0]: (row[1], row[2], jsonfast.loads(row[3])) for row in self._fetch(query)}

    # -- model answers ---------------------------------------------------------------------
    def record_answers(self, run_id: str, purpose: str, answers: Sequence[tuple[str, Any]]) -> None:
        """Keep ``(sample_id, answer)`` pairs (one transaction, idempotent by sample id)."""
        rows = [
            {"run_id": run_id, "sample_id": sid, "purpose": purpose, "answer": _dumps(answer)}
            for sid, answer in answers
        ]
        self._upsert(schema.answers, rows, ("run_id", "sample_id", "purpose"))

    def forget_answers(self, run_id: str) -> None:
        """Drop a run's kept answers (its samples hold them once it has succeeded)."""
        self._write(schema.answers.delete().where(schema.answers.c.run_id == run_id))

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

    # -- task results ----------------------------------------------------------------------
    def save_task_result(self, result: TaskResultRecord) -> None:
        row = {
            "run_id": result.run_id,
            "task_id": result.task_id,
            "model": result.model,
            "metrics": _json(result.metrics),
            "error": _text(result.error),
            "problems": _json(result.problems),
            "model_calls": _json(result.model_calls) if result.model_calls else None,
        }
        self._upsert(schema.task_results, [row], ("run_id", "task_id", "model"))

    def task_results(self, run_id: str) -> list[TaskResultRecord]:
        query = select(schema.task_results).where(schema.task_results.c.run_id == run_id)
        return [
            TaskResultRecord(
                row.run_id,
                row.task_id,
                row.model,
                load_json(row.metrics) or {},
                row.error,
                load_json(row.problems) or [],
                load_json(row.model_calls) or {},
            )
            for row in self._fetch(query)
        ]

    def _upsert(
        self, table: Any, rows: list[dict[str, Any]], keys: tuple[str, ...], where: Any = None
    ) -> None:
        if rows:
            self._write(_upsert_statement(self._dialect, table, rows[0], keys, where), rows)


def _unit_row(run_id: str, unit_id: str, state: str, info: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "unit_id": unit_id,
        "state": state,
        "info": _json(info),
        "finished_at": datetime.now(UTC),
    }


def _upsert_statement(
    dialect: str, table: Any, row: dict[str, Any], keys: tuple[str, ...], where: Any = None
) -> Any:
    """``INSERT ... ON CONFLICT (keys) DO UPDATE`` of rows shaped like ``row`` (where
    ``where`` holds of the row kept)."""
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)
    set_ = {name: insert.excluded[name] for name in row if name not in keys}
    return insert.on_conflict_do_update(index_elements=list(keys), set_=set_, where=where)


def _run(row: Any) -> RunRecord:
    return RunRecord(
        run_id=row.run_id,
        suite_name=row.suite_name,
        suite_version=row.suite_version,
        spec=load_json(row.spec) or {},
        sandbox=row.sandbox,
        phase=row.phase,
        created_at=row.created_at,
        completed_at=row.completed_at,
        summary=load_json(row.summary),
    )
