"""The store's Alembic migrations on SQLite and on a real PostgreSQL server: a new store, a
store written before migrations existed, an older and a newer revision, concurrent opens."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, event, inspect

from evalkube.store import (
    ResultStore,
    RunRecord,
    StoreError,
    TaskResultRecord,
    migrate,
    schema,
)


def _reset(url: str) -> None:
    """Leave the database without any of the store's tables (PostgreSQL is shared)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            schema.metadata.drop_all(conn)
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {migrate.VERSION_TABLE}")
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a database without the store's tables, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'results.db'}"
        return
    url: str = request.getfixturevalue("postgres_url")
    _reset(url)
    yield url
    _reset(url)


def _revision(url: str) -> tuple[str, ...]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": migrate.VERSION_TABLE}
            )
            return context.get_current_heads()
    finally:
        engine.dispose()


def _differences(url: str) -> list[Any]:
    """What Alembic's autogenerate would change to make the database match the metadata."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": migrate.VERSION_TABLE, "compare_type": True}
            )
            return list(compare_metadata(context, schema.metadata))
    finally:
        engine.dispose()


def _pre_migration_store(url: str, *, without: tuple[str, ...] = ()) -> None:
    """A store as an evalkube before migrations left it: the tables of the metadata, no
    version table, minus the tables (``table``) and added columns (``table.column``) named."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            # the tables that evalkube created (later revisions add the others)
            schema.metadata.create_all(conn, tables=list(migrate._PRE_MIGRATION_TABLES))
            for name in without:
                table, _, column = name.partition(".")
                if column:
                    conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
                else:
                    conn.exec_driver_sql(f"DROP TABLE {table}")
            conn.exec_driver_sql(
                "INSERT INTO evalkube_task_results (run_id, task_id, model, metrics, problems) "
                "VALUES ('old', 'qa', 'm', '{\"f1\": 0.5}', '[]')"
            )
    finally:
        engine.dispose()


def test_a_new_store_is_at_head_and_matches_the_metadata(empty_url: str) -> None:
    ResultStore.open(empty_url).close()
    assert _revision(empty_url) == (schema.REVISION,)
    assert _differences(empty_url) == []


def test_the_revisions_alone_build_the_metadata_s_tables(empty_url: str) -> None:
    """Stamp nothing, create nothing by hand: revision 0001 then each added column."""
    engine = create_engine(empty_url)
    try:
        with engine.begin() as conn:
            from alembic import command

            command.upgrade(migrate._config(conn), "0001")
        assert "model_calls" not in {
            c["name"] for c in inspect(engine).get_columns("evalkube_task_results")
        }
    finally:
        engine.dispose()
    assert _revision(empty_url) == ("0001",)
    ResultStore.open(empty_url).close()
    assert _revision(empty_url) == (schema.REVISION,)
    assert _differences(empty_url) == []


def test_the_schema_s_revision_is_the_last_one() -> None:
    assert migrate.known_revisions()[-1] == schema.REVISION


def test_added_columns_name_their_revisions_in_order() -> None:
    order = migrate.known_revisions()
    assert order[0] == "0001"
    positions = [order.index(revision) for revision, _, _ in schema.ADDED_COLUMNS]
    assert positions == sorted(positions)
    assert len(set(positions)) == len(positions)


@pytest.mark.parametrize(
    ("without", "stamped"),
    [
        # written by the evalkube just before migrations: nothing to add
        ((), "0002"),
        # before task results kept model calls
        (("evalkube_task_results.model_calls",), "0001"),
        # before answers were kept and before model calls: the table is created on open
        (("evalkube_answers", "evalkube_task_results.model_calls"), "0001"),
    ],
)
def test_a_store_from_before_migrations_is_stamped_upgraded_and_keeps_its_records(
    empty_url: str, without: tuple[str, ...], stamped: str
) -> None:
    _pre_migration_store(empty_url, without=without)
    stamps: list[str] = []

    def record_stamp(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if migrate.VERSION_TABLE in statement and statement.lstrip().startswith("INSERT"):
            stamps.append(statement)

    event.listen(Engine, "before_cursor_execute", record_stamp)
    try:
        store = ResultStore.open(empty_url)
    finally:
        event.remove(Engine, "before_cursor_execute", record_stamp)
    try:
        assert len(stamps) == 1  # stamped once, then moved by UPDATEs
        assert store.task_results("old") == [
            TaskResultRecord("old", "qa", "m", {"f1": 0.5}, None, [], {})
        ]
        store.save_task_result(TaskResultRecord("new", "qa", "m", {}, None, [], {"judge": 3}))
        assert store.task_results("new")[0].model_calls == {"judge": 3}
    finally:
        store.close()
    assert _revision(empty_url) == (schema.REVISION,)
    assert _differences(empty_url) == []


def test_a_store_stamped_with_an_older_revision_is_upgraded(empty_url: str) -> None:
    _pre_migration_store(empty_url, without=("evalkube_task_results.model_calls",))
    engine = create_engine(empty_url)
    try:
        with engine.begin() as conn:
            from alembic import command

            command.stamp(migrate._config(conn), "0001")
    finally:
        engine.dispose()
    ResultStore.open(empty_url).close()
    assert _revision(empty_url) == (schema.REVISION,)
    assert _differences(empty_url) == []


def test_a_store_from_a_newer_evalkube_is_refused_clearly(empty_url: str) -> None:
    ResultStore.open(empty_url).close()
    engine = create_engine(empty_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999'")
    finally:
        engine.dispose()
    with pytest.raises(StoreError, match=r"newer evalkube .*9999.*upgrade evalkube"):
        ResultStore.open(empty_url)
    assert _revision(empty_url) == ("9999",)


def test_a_refused_layout_1_store_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE evalkube_samples (run_id TEXT, sample_id TEXT, prompt TEXT, "
            "PRIMARY KEY (run_id, sample_id))"
        )
    with pytest.raises(StoreError, match=r"earlier evalkube .*layout 1.*new file"):
        ResultStore.open(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert names == ["evalkube_samples"]


def test_an_up_to_date_store_opens_with_one_read_of_the_version_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    ResultStore.open(url).close()
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        ResultStore.open(url).close()
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert statements == [f"SELECT version_num FROM {migrate.VERSION_TABLE}"]


def test_an_up_to_date_store_opens_without_importing_alembic(tmp_path: Path) -> None:
    """Alembic's import is a noticeable part of a command's start; only migrating needs it."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    ResultStore.open(url).close()
    code = (
        "import sys\n"
        "from evalkube.store import ResultStore\n"
        f"ResultStore.open({url!r}).close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]"


def _open_at_barrier(url: str, barrier: Any, errors: Any) -> None:
    """Wait for the other openers, open the store, write to it; report any error."""
    try:
        barrier.wait(timeout=120)
        store = ResultStore.open(url)
        try:
            store.save_task_result(TaskResultRecord("run", "qa", "m", {}, None, [], {}))
        finally:
            store.close()
    except BaseException as exc:
        errors.put(repr(exc))


OPENERS = 4


@pytest.mark.slow
def test_processes_opening_a_new_store_at_once_all_succeed(empty_url: str) -> None:
    spawn = multiprocessing.get_context("spawn")
    barrier, errors = spawn.Barrier(OPENERS), spawn.Queue()
    workers = [
        spawn.Process(target=_open_at_barrier, args=(empty_url, barrier, errors))
        for _ in range(OPENERS)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=180)
    reported = [errors.get(timeout=5) for _ in range(errors.qsize())]
    assert reported == []
    assert [w.exitcode for w in workers] == [0] * OPENERS
    assert _revision(empty_url) == (schema.REVISION,)
    assert _differences(empty_url) == []


def test_threads_opening_a_new_store_at_once_all_succeed(empty_url: str) -> None:
    barrier = threading.Barrier(OPENERS)
    errors: list[str] = []

    class Collect:
        def put(self, error: str) -> None:
            errors.append(error)

    threads = [
        threading.Thread(target=_open_at_barrier, args=(empty_url, barrier, Collect()))
        for _ in range(OPENERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert _revision(empty_url) == (schema.REVISION,)


def _old_local_spec(loaded: Any, spec: Any) -> dict[str, Any]:
    """What ``evalkube run`` stored as a run's spec before revision 0004."""
    return {
        "suite": loaded.suite.to_wire(),
        "run": spec.to_wire(),
        "base_dir": str(loaded.base_dir),
        "suite_file": str(loaded.suite_file),
        "sources": {f"{t}/{k}": list(v) for (t, k), v in loaded.sources.items()},
        "pins": {},
    }


def _stamp_with_spec(url: str, run_id: str, spec: dict[str, Any], revision: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            from alembic import command

            conn.execute(
                schema.runs.update()
                .where(schema.runs.c.run_id == run_id)
                .values(spec=json.dumps(spec))
            )
            command.stamp(migrate._config(conn), revision)
    finally:
        engine.dispose()


def test_a_local_run_stored_before_run_snapshots_is_migrated_and_resumes(
    empty_url: str, tmp_path: Path
) -> None:
    """Revision 0004: a local run recorded in the old plain shape becomes a RunSnapshot that
    ``--resume`` accepts (same suite version, same code), and the run finishes with every
    sample once."""
    from evalkube.engine import load_files, resolve_run_spec
    from evalkube.local import LocalEngine
    from evalkube.models.snapshot import RunSnapshot
    from evalkube.sandbox import ProcessBackend

    (tmp_path / "rows.jsonl").write_text("".join(f'{{"q": "{i}"}}\n' for i in range(4)))
    (tmp_path / "suite.json").write_text(
        json.dumps(
            {
                "apiVersion": "evalkube.io/v1alpha1",
                "kind": "EvalSuite",
                "metadata": {"name": "old"},
                "spec": {
                    "tasks": [
                        {
                            "id": "qa",
                            "dataset": {"path": "rows.jsonl"},
                            "prompt": "{{ item.q }}",
                            "target": "{{ item.q }}",
                            "outputs": {"column": "q"},
                            "grader": {
                                "type": "python",
                                "source": "def grade(s, i): return 1.0",
                                "metricId": "same",
                            },
                        }
                    ]
                },
            }
        )
    )
    loaded, _ = load_files(tmp_path / "suite.json", None)
    spec = resolve_run_spec(loaded, None, None).model_copy(update={"shard_size": 2})
    store = ResultStore.open(empty_url)
    try:
        LocalEngine(store, ProcessBackend()).start(loaded, spec, run_id="old-run")
        store.set_run_phase("old-run", "Failed")  # as if interrupted: --resume may take it
    finally:
        store.close()
    _stamp_with_spec(empty_url, "old-run", _old_local_spec(loaded, spec), "0003")

    store = ResultStore.open(empty_url)
    try:
        record = store.get_run("old-run")
        assert record is not None
        snapshot = RunSnapshot.model_validate(record.spec)
        assert snapshot.run.run_id == "old-run"
        assert snapshot.suite.name == "old"
        assert snapshot.suite.version == record.suite_version
        assert snapshot.local is not None
        assert snapshot.local.suite_file == str(tmp_path / "suite.json")
        summary = LocalEngine(store, ProcessBackend()).resume("old-run")
        assert summary.phase == "Succeeded"
        assert sorted(s.row_id for s in store.iter_samples("old-run")) == ["0", "1", "2", "3"]
    finally:
        store.close()
    assert _revision(empty_url) == (schema.REVISION,)


def test_an_operator_run_s_wrapped_snapshot_is_unwrapped_and_goes_back_on_downgrade(
    empty_url: str,
) -> None:
    snapshot = {
        "run": {"run_id": "ns-r-1", "namespace": "ns", "name": "r", "uid": "1"},
        "suite": {"name": "s", "spec": {"tasks": []}, "version": "sha256:0"},
        "run_spec": {"models": ["precomputed"]},
    }
    wrapped = {"namespace": "ns", "name": "r", "snapshot": snapshot}
    store = ResultStore.open(empty_url)
    try:
        store.create_run(RunRecord("ns-r-1", "s", "sha256:0", {}, "pod"))
    finally:
        store.close()
    _stamp_with_spec(empty_url, "ns-r-1", wrapped, "0003")
    store = ResultStore.open(empty_url)
    try:
        record = store.get_run("ns-r-1")
        assert record is not None
        assert record.spec == snapshot
    finally:
        store.close()
    engine = create_engine(empty_url)
    try:
        with engine.begin() as conn:
            from alembic import command

            command.downgrade(migrate._config(conn), "0003")
            (text,) = conn.execute(schema.runs.select().with_only_columns(schema.runs.c.spec)).one()
    finally:
        engine.dispose()
    assert json.loads(text) == wrapped
