"""The results store on SQLite and on a real PostgreSQL server (the ``store`` fixture)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from evalkube.store import (
    ResultStore,
    RunRecord,
    SampleRecord,
    StoreError,
    TaskResultRecord,
    decode_cursor,
    encode_cursor,
)
from evalkube.store.sample_reads import ids_query

RUN = "run-1"


def make_run(run_id: str = RUN, **fields: Any) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        suite_name="recipes",
        suite_version="sha256:" + "0" * 64,
        spec={"suite": {"tasks": ["a"]}, "run": {"models": ["precomputed"]}},
        sandbox="process",
        **fields,
    )


def sample(
    n: int,
    *,
    run_id: str = RUN,
    task: str = "t1",
    model: str = "precomputed",
    status: str = "valid",
    **fields: Any,
) -> SampleRecord:
    return SampleRecord(
        run_id=run_id,
        sample_id=f"s_{task}_{model}_{n}",
        task_id=task,
        model=model,
        seq=n,
        status=status,  # type: ignore[arg-type]
        **fields,
    )


def ids(records: list[SampleRecord]) -> list[str]:
    return [r.sample_id for r in records]


# -- runs ---------------------------------------------------------------------------------------


def test_create_and_get_run(store: ResultStore) -> None:
    store.create_run(make_run())
    run = store.get_run(RUN)
    assert run is not None
    assert run.run_id == RUN
    assert run.suite_name == "recipes"
    assert run.spec == {"suite": {"tasks": ["a"]}, "run": {"models": ["precomputed"]}}
    assert run.sandbox == "process"
    assert run.phase == "Running"
    assert run.created_at is not None
    assert run.completed_at is None
    assert run.summary is None


def test_get_unknown_run_is_none(store: ResultStore) -> None:
    assert store.get_run("nope") is None


def test_creating_the_same_run_twice_fails(store: ResultStore) -> None:
    store.create_run(make_run())
    with pytest.raises(Exception):  # noqa: B017, PT011 - the driver's IntegrityError
        store.create_run(make_run())


def test_list_runs_newest_first_with_limit(store: ResultStore) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(5):
        store.create_run(make_run(f"run-{i}", created_at=base + timedelta(minutes=i)))
    assert [r.run_id for r in store.list_runs()] == ["run-4", "run-3", "run-2", "run-1", "run-0"]
    assert [r.run_id for r in store.list_runs(limit=2)] == ["run-4", "run-3"]


def test_finish_and_reopen_run(store: ResultStore) -> None:
    store.create_run(make_run())
    store.finish_run(RUN, "Succeeded", {"results": [{"task": "t1", "metrics": {"m": 0.5}}]})
    run = store.get_run(RUN)
    assert run is not None
    assert run.phase == "Succeeded"
    assert run.completed_at is not None
    assert run.summary == {"results": [{"task": "t1", "metrics": {"m": 0.5}}]}
    store.set_run_phase(RUN, "Running", sandbox="nsjail")
    run = store.get_run(RUN)
    assert run is not None
    assert (run.phase, run.sandbox, run.completed_at) == ("Running", "nsjail", None)


def test_units(store: ResultStore) -> None:
    assert store.done_units(RUN) == set()
    store.mark_unit_done(RUN, "t1.precomputed.00000")
    store.mark_unit_done(RUN, "t1.precomputed.00001", {"samples": 3})
    store.mark_unit_done(RUN, "t1.precomputed.00001", {"samples": 3})  # idempotent
    store.mark_unit_done("other", "t1.precomputed.00002")
    assert store.done_units(RUN) == {"t1.precomputed.00000", "t1.precomputed.00001"}


# -- samples ------------------------------------------------------------------------------------


def test_sample_round_trip_keeps_every_field(store: ResultStore) -> None:
    record = sample(
        7,
        status="invalid",
        row_id="q7",
        prompt=[{"role": "user", "content": "2+2? é ✓"}],
        target="4",
        output_text="The answer is 4.",
        extracted_output="4",
        scores={"exact_match": 0.0},
        judge={"invalid_payload": "True", "error": {"type": "InvalidResult"}},
        error={"stage": "grading", "type": "InvalidResult", "message": "bool", "traceback": ""},
        model_calls={"candidate": 1, "response_ids": ["resp_1"]},
        response_id="resp_1",
        dataset_row={"id": "q7", "nested": {"list": [1, None, True]}},
        timings={"grade_ms": 0.5},
        stdout="printed\n",
        stderr="warned\n",
    )
    store.record_samples([record])
    (back,) = store.iter_samples(RUN)
    assert back == record


def test_minimal_sample_round_trip(store: ResultStore) -> None:
    record = sample(0)
    store.record_samples([record])
    (back,) = store.iter_samples(RUN)
    assert back == record
    assert back.judge is None
    assert back.error is None
    assert back.scores == {}


def test_text_with_nul_characters_is_stored(store: ResultStore) -> None:
    # model outputs and user prints can contain NUL; PostgreSQL text columns refuse it raw
    record = sample(
        0,
        output_text="a\x00b",
        extracted_output="\x00",
        target="t\x00",
        stdout="out\x00",
        stderr="err\x00",
        judge={"k": "v\x00"},
        dataset_row={"x": "\x00"},
    )
    store.record_samples([record])
    (back,) = store.iter_samples(RUN)
    assert back.judge == {"k": "v\x00"}
    assert back.dataset_row == {"x": "\x00"}
    for name in ("output_text", "extracted_output", "target", "stdout", "stderr"):
        value = getattr(back, name)
        assert value is not None
        assert value.replace("\x00", "\ufffd") == getattr(record, name).replace("\x00", "\ufffd")


def test_record_samples_is_idempotent_and_replaces(store: ResultStore) -> None:
    store.record_samples([sample(i, scores={"m": 0.0}) for i in range(5)])
    replaced = [
        sample(i, status="invalid", scores={"m": 1.0}, error={"stage": "grading", "type": "E"})
        for i in range(3, 8)
    ]
    store.record_samples(replaced)
    store.record_samples(replaced)
    records = list(store.iter_samples(RUN))
    assert len(records) == 8
    assert len(set(ids(records))) == 8
    by_seq = {r.seq: r for r in records}
    assert [by_seq[i].scores for i in range(8)] == [{"m": 0.0}] * 3 + [{"m": 1.0}] * 5
    assert by_seq[4].status == "invalid"
    assert by_seq[4].error == {"stage": "grading", "type": "E"}
    assert by_seq[1].error is None


def test_record_samples_across_chunks(store: ResultStore) -> None:
    records = [sample(i, scores={"m": i % 2}) for i in range(4_500)]  # > 2 store chunks
    store.record_samples(records)
    store.record_samples(records[1_000:3_000])
    assert sum(1 for _ in store.iter_samples(RUN)) == 4_500
    assert store.recorded_sample_ids(RUN, "t1", "precomputed") == set(ids(records))


def test_replacing_clears_fields_that_became_empty(store: ResultStore) -> None:
    store.record_samples([sample(0, judge={"x": 1}, stdout="a", error={"stage": "render"})])
    store.record_samples([sample(0)])
    (back,) = store.iter_samples(RUN)
    assert (back.judge, back.stdout, back.error) == (None, None, None)


def test_recorded_sample_ids_per_task_and_model(store: ResultStore) -> None:
    store.record_samples(
        [sample(0), sample(1), sample(0, task="t2"), sample(0, model="m:x"), sample(9, run_id="r2")]
    )
    assert store.recorded_sample_ids(RUN, "t1", "precomputed") == {
        "s_t1_precomputed_0",
        "s_t1_precomputed_1",
    }
    assert store.recorded_sample_ids(RUN, "t2", "precomputed") == {"s_t2_precomputed_0"}
    assert store.recorded_sample_ids(RUN, "t3", "precomputed") == set()


def test_a_shards_ids_are_its_range_of_sequence_numbers(store: ResultStore) -> None:
    """What a retried pod asks for: its shard's recorded (and generation-errored) ids only,
    never its task x model's other shards'."""
    stride = 1_000_000_000
    errored = {"stage": "generation", "type": "GenerationError"}
    store.record_samples(
        [
            sample(shard * stride + i, **({"error": errored} if i == 0 else {}))
            for shard in range(3)
            for i in range(4)
        ]
    )
    shard_1 = (stride, 2 * stride)
    assert store.recorded_sample_ids(RUN, "t1", "precomputed", shard_1) == {
        f"s_t1_precomputed_{stride + i}" for i in range(4)
    }
    assert store.generation_errored_ids(RUN, "t1", "precomputed", shard_1) == {
        f"s_t1_precomputed_{stride}"
    }
    assert len(store.generation_errored_ids(RUN, "t1", "precomputed")) == 3
    assert store.recorded_sample_ids(RUN, "t1", "precomputed", (3 * stride, 4 * stride)) == set()


@pytest.mark.parametrize("error_stage", [None, "generation"])
def test_a_shards_ids_are_read_through_the_order_index(
    store: ResultStore, error_stage: str | None
) -> None:
    """The ids query is a range scan of ``ix_evalkube_samples_order`` (run, task, model, seq)
    on both databases, so a pod's lookup costs its shard's rows, not the run's."""
    store.record_samples([sample(i) for i in range(50)])
    query = ids_query(RUN, "t1", "precomputed", (10, 20), error_stage=error_stage)
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            sql = str(query.compile(store.engine, compile_kwargs={"literal_binds": True}))
            plan = " ".join(
                str(row[-1]) for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")
            )
            assert "USING INDEX ix_evalkube_samples_order" in plan, plan
            assert "seq>? AND seq<?" in plan, plan
        else:
            conn.exec_driver_sql("SET enable_seqscan = off")
            sql = str(query.compile(store.engine, compile_kwargs={"literal_binds": True}))
            plan = " ".join(row[0] for row in conn.exec_driver_sql(f"EXPLAIN {sql}"))
            assert "ix_evalkube_samples_order" in plan, plan
            assert "seq >=" in plan, plan


@pytest.fixture
def mixed(store: ResultStore) -> ResultStore:
    """Two tasks x two models, statuses cycling, seqs inserted out of order."""
    statuses = ["valid", "invalid", "errored", "valid", "pending"]
    records = [
        sample(seq, task=task, model=model, status=statuses[seq % 5])
        for task in ("b_task", "a_task")
        for model in ("zeta:m", "alpha:m")
        for seq in (4, 0, 3, 1, 2, 1_000_000_000, 1_000_000_001)
    ]
    store.record_samples(records)
    store.record_samples([sample(0, run_id="other-run")])
    return store


def test_iter_samples_orders_by_task_model_seq(mixed: ResultStore) -> None:
    records = list(mixed.iter_samples(RUN))
    assert len(records) == 28
    keys = [(r.task_id, r.model, r.seq) for r in records]
    assert keys == sorted(keys)
    assert keys[0] == ("a_task", "alpha:m", 0)
    assert keys[-1] == ("b_task", "zeta:m", 1_000_000_001)


def test_iter_samples_filters(mixed: ResultStore) -> None:
    assert len(list(mixed.iter_samples(RUN, task_id="a_task"))) == 14
    assert len(list(mixed.iter_samples(RUN, task_id="a_task", model="zeta:m"))) == 7
    errored = list(mixed.iter_samples(RUN, status="errored"))
    assert {r.status for r in errored} == {"errored"}
    assert len(errored) == 4  # seq 2 in every task x model
    failed = list(mixed.iter_samples(RUN, status=["invalid", "errored"]))
    assert {r.status for r in failed} == {"invalid", "errored"}
    assert len(failed) == 8 + 4  # seq 1, 1_000_000_001 are invalid; seq 2 errored
    assert list(mixed.iter_samples(RUN, task_id="missing")) == []
    assert list(mixed.iter_samples("no-such-run")) == []


def test_iter_samples_limit_and_after(mixed: ResultStore) -> None:
    first = list(mixed.iter_samples(RUN, limit=3))
    assert [(r.task_id, r.model, r.seq) for r in first] == [
        ("a_task", "alpha:m", 0),
        ("a_task", "alpha:m", 1),
        ("a_task", "alpha:m", 2),
    ]
    after = list(mixed.iter_samples(RUN, after=("a_task", "alpha:m", 1_000_000_001), limit=2))
    assert [(r.task_id, r.model, r.seq) for r in after] == [
        ("a_task", "zeta:m", 0),
        ("a_task", "zeta:m", 1),
    ]


def test_page_samples_walks_everything_exactly_once(mixed: ResultStore) -> None:
    seen: list[SampleRecord] = []
    cursor: str | None = None
    pages = 0
    while True:
        page, cursor = mixed.page_samples(RUN, cursor=cursor, limit=5)
        seen.extend(page)
        pages += 1
        if cursor is None:
            break
    assert pages == 6  # 28 samples, 5 per page
    assert ids(seen) == ids(list(mixed.iter_samples(RUN)))
    assert len(set(ids(seen))) == 28


def test_page_samples_with_filters(mixed: ResultStore) -> None:
    page, cursor = mixed.page_samples(RUN, status=["invalid", "errored"], task_id="b_task", limit=4)
    assert len(page) == 4
    assert cursor is not None
    rest, end = mixed.page_samples(
        RUN, status=["invalid", "errored"], task_id="b_task", cursor=cursor, limit=4
    )
    assert len(rest) == 2
    assert end is None
    assert {r.task_id for r in page + rest} == {"b_task"}


def test_exact_last_page_has_no_cursor(mixed: ResultStore) -> None:
    page, cursor = mixed.page_samples(RUN, task_id="a_task", model="alpha:m", limit=7)
    assert len(page) == 7
    assert cursor is None


def test_cursor_round_trip_and_garbage() -> None:
    record = sample(1_000_000_003, task="t", model="openai:gpt-4.1")
    cursor = encode_cursor(record)
    assert "=" not in cursor
    assert decode_cursor(cursor) == ("t", "openai:gpt-4.1", 1_000_000_003)
    for bad in ["", "!!!", "bm90IGpzb24", encode_cursor(record)[:-2] + "xx"]:
        with pytest.raises(ValueError, match="invalid cursor"):
            decode_cursor(bad)


def test_apply_sample_updates(store: ResultStore) -> None:
    store.record_samples(
        [
            sample(0, status="pending", scores={"a": 1.0}, judge={"old": 1}, extracted_output="x"),
            sample(1, status="pending", judge={"old": 2}, extracted_output="y"),
            sample(2, status="pending", judge={"old": 3}, extracted_output="z"),
        ]
    )
    store.apply_sample_updates(
        RUN,
        [
            {"sample_id": "s_t1_precomputed_0", "scores": {"a": 1.0, "b": 0.5}},
            {"sample_id": "s_t1_precomputed_1", "judge": None, "extracted_output": None},
            {"sample_id": "s_t1_precomputed_2", "judge": {"new": True}, "extracted_output": "w"},
            {"sample_id": "s_does_not_exist", "judge": {"x": 1}},
        ],
    )
    a, b, c = store.iter_samples(RUN)
    assert (a.scores, a.judge, a.extracted_output) == ({"a": 1.0, "b": 0.5}, {"old": 1}, "x")
    assert (b.judge, b.extracted_output) == (None, None)
    assert (c.judge, c.extracted_output) == ({"new": True}, "w")
    assert len(list(store.iter_samples(RUN))) == 3


def test_apply_sample_updates_with_an_error_sets_its_stage(store: ResultStore) -> None:
    store.record_samples([sample(0, status="pending")])
    store.apply_sample_updates(
        RUN,
        [{"sample_id": "s_t1_precomputed_0", "status": "invalid", "error": {"stage": "batch"}}],
    )
    (back,) = store.iter_samples(RUN)
    assert back.status == "invalid"
    assert back.error == {"stage": "batch"}
    assert len(list(store.iter_samples(RUN, status="invalid"))) == 1


def test_settle_pending_only_touches_pending_of_that_task_and_model(store: ResultStore) -> None:
    store.record_samples(
        [
            sample(0, status="pending"),
            sample(1, status="pending"),
            sample(2, status="errored", error={"stage": "extraction"}),
            sample(0, status="pending", task="t2"),
            sample(0, status="pending", model="m:x"),
        ]
    )
    assert store.settle_pending(RUN, "t1", "precomputed", "valid") == 2
    assert store.settle_pending(RUN, "t1", "precomputed", "valid") == 0
    statuses = {(r.task_id, r.model, r.seq): r.status for r in store.iter_samples(RUN)}
    assert statuses == {
        ("t1", "precomputed", 0): "valid",
        ("t1", "precomputed", 1): "valid",
        ("t1", "precomputed", 2): "errored",
        ("t2", "precomputed", 0): "pending",
        ("t1", "m:x", 0): "pending",
    }


def test_settle_pending_with_values(store: ResultStore) -> None:
    store.record_samples([sample(0, status="pending", scores={"x": 1.0})])
    error = {"stage": "batch", "type": "Timeout", "message": "too slow"}
    settled = store.settle_pending(
        RUN,
        "t1",
        "precomputed",
        "invalid",
        {"scores": {"score": 0.0}, "error": error, "judge": {"error": error}},
    )
    assert settled == 1
    (back,) = store.iter_samples(RUN, status="invalid")
    assert back.scores == {"score": 0.0}
    assert back.error == error
    assert back.judge == {"error": error}


def test_task_results_upsert(store: ResultStore) -> None:
    assert store.task_results(RUN) == []
    store.save_task_result(TaskResultRecord(RUN, "t1", "precomputed", {"f1": 0.5}, None, ["p"]))
    store.save_task_result(TaskResultRecord(RUN, "t2", "precomputed", {}, "Timeout: slow", []))
    store.save_task_result(TaskResultRecord(RUN, "t1", "precomputed", {"f1": 0.75}, None, []))
    store.save_task_result(TaskResultRecord("other", "t1", "precomputed", {"f1": 0.1}))
    results = sorted(store.task_results(RUN), key=lambda r: r.task_id)
    assert results == [
        TaskResultRecord(RUN, "t1", "precomputed", {"f1": 0.75}, None, []),
        TaskResultRecord(RUN, "t2", "precomputed", {}, "Timeout: slow", []),
    ]


def test_iter_scores(store: ResultStore) -> None:
    store.record_samples(
        [
            sample(0, scores={"m": 1.0}, model_calls={"judge": 2, "response_ids": ["a", "b"]}),
            sample(1, status="invalid", scores={"m": 0.0}),
            sample(2, status="errored"),
            sample(0, task="t0", scores={"x": 0.5}),
            sample(0, run_id="other", scores={"m": 9.0}),
        ]
    )
    rows = list(store.iter_scores(RUN))
    assert len(rows) == 4
    assert [(t, m) for t, m, *_ in rows] == sorted((t, m) for t, m, *_ in rows)
    by = {(t, s): (scores, calls) for t, _m, s, scores, calls in rows}
    assert by[("t1", "valid")] == ({"m": 1.0}, {"judge": 2, "response_ids": ["a", "b"]})
    assert by[("t1", "invalid")] == ({"m": 0.0}, {})
    assert by[("t1", "errored")] == ({}, {})
    assert by[("t0", "valid")] == ({"x": 0.5}, {})


def test_runs_are_isolated(store: ResultStore) -> None:
    store.record_samples([sample(0, run_id="r1"), sample(0, run_id="r2", status="invalid")])
    assert [r.status for r in store.iter_samples("r1")] == ["valid"]
    assert [r.status for r in store.iter_samples("r2")] == ["invalid"]


def test_store_reopens_existing_data(store: ResultStore) -> None:
    store.create_run(make_run())
    store.record_samples([sample(0, scores={"m": 1.0})])
    again = ResultStore.open(store.engine.url.render_as_string(hide_password=False))
    try:
        assert again.get_run(RUN) is not None
        assert [r.scores for r in again.iter_samples(RUN)] == [{"m": 1.0}]
    finally:
        again.close()


def test_bad_urls_are_store_errors(tmp_path: Any) -> None:
    with pytest.raises(StoreError, match="invalid store URL"):
        ResultStore.open("not a url at all ::")
    with pytest.raises(StoreError, match="cannot open the results store"):
        ResultStore.open(f"sqlite:///{tmp_path}/missing-dir/x/results.db")


def test_deeply_nested_judge_is_stored(store: ResultStore) -> None:
    # Deeper than orjson encodes (255) and near what the worker can send (about 1,000):
    # the chunk falls back to slower encoders, it is never lost.
    judge: Any = "bottom"
    for _ in range(900):
        judge = [judge]
    store.record_samples([sample(0, judge=judge), sample(1, judge={"ok": True})])
    stored = {r.sample_id: r.judge for r in store.iter_samples(RUN)}
    depth, value = 0, stored["s_t1_precomputed_0"]
    while isinstance(value, list):
        depth, value = depth + 1, value[0]
    assert (depth, value) == (900, "bottom")
    assert stored["s_t1_precomputed_1"] == {"ok": True}


def test_chunk_values_keep_their_types(store: ResultStore) -> None:
    record = sample(
        0,
        prompt=[{"role": "user", "content": 'say "null"'}],
        target="null",
        output_text="1e999",
        extracted_output="",
        scores={"m": 0.1 + 0.2, "big": 1e300},
        judge={"n": 2**62, "f": -0.0, "s": "\u2028\x00\n"},
        model_calls={"judge": 2},
        dataset_row={"id": 7, "nested": {"a": [1, None, True]}},
        timings={"grade_ms": 0.001},
    )
    store.record_samples([record])
    [back] = list(store.iter_samples(RUN))
    assert back == record


def test_a_store_without_later_columns_is_upgraded_and_keeps_its_records(
    store: ResultStore,
) -> None:
    """A store written before batch model calls were kept (no ``model_calls`` column on task
    results, and before migrations: no version table) opens, keeps its results, and records
    the new column from then on."""
    from evalkube.store import TaskResultRecord
    from evalkube.store.migrate import VERSION_TABLE

    url = store.engine.url.render_as_string(hide_password=False)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
        conn.exec_driver_sql("DROP TABLE evalkube_unit_aggregates")  # revision 0003's
        conn.exec_driver_sql("ALTER TABLE evalkube_task_results DROP COLUMN model_calls")
        conn.exec_driver_sql(
            "INSERT INTO evalkube_task_results (run_id, task_id, model, metrics, problems) "
            "VALUES ('old', 'qa', 'm', '{\"f1\": 0.5}', '[]')"
        )
    store.close()
    upgraded = ResultStore.open(url)
    try:
        assert upgraded.task_results("old") == [
            TaskResultRecord("old", "qa", "m", {"f1": 0.5}, None, [], {})
        ]
        upgraded.save_task_result(TaskResultRecord("new", "qa", "m", {}, None, [], {"judge": 3}))
        assert upgraded.task_results("new")[0].model_calls == {"judge": 3}
    finally:
        upgraded.close()


def test_lone_surrogates_are_stored(store: ResultStore) -> None:
    record = sample(0, judge={"why": "\ud800x"}, output_text="ok")
    store.record_samples([record])
    [back] = list(store.iter_samples(RUN))
    assert back.judge == {"why": "\ud800x"}
