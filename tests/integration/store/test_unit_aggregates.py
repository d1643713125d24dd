"""A run's results from per-unit aggregates equal the results of reading every sample (issue
25): bit for bit, over randomized runs with valid, invalid, errored and pending samples,
random float scores, model calls, pass thresholds, batch metrics and ``grade_batch`` updates,
failed units, resumed units that rewrite their samples, and units whose done report is
replayed. On SQLite and on a real PostgreSQL server (the ``store`` fixture).

The old path is :func:`aggregate_results` reading the store's scores; the new one
:func:`run_aggregates` (each unit's aggregate, kept when the unit is done, merged).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from evalkube.controller.results import covering_units, record_done_units, run_aggregates
from evalkube.engine.plan import Unit, plan_units, sample_id, seq_range
from evalkube.grading.criteria import Criterion
from evalkube.grading.run_results import aggregate_results
from evalkube.store import ResultStore, RunRecord, SampleRecord, TaskResultRecord

RUN = "team.nightly.0f1e2d3c"
CRITERIA = {
    "qa": (Criterion("grader", "score", 0.5), Criterion("graders[1]", "f1", 0.25)),
    "mix": (Criterion("grader", "score"),),
    "batchy": (Criterion("grader", "score"),),
}
EXPECTED = {"qa": ["score", "f1"], "mix": ["score"], "batchy": []}
DECLARED = {"qa": ["score", "f1"], "mix": ["score"], "batchy": ["macro_f1"]}


def random_sample(rng: random.Random, unit: Unit, position: int, pending: bool) -> SampleRecord:
    seq = unit.shard * 1_000_000_000 + position
    record = SampleRecord(
        RUN, sample_id(RUN, unit.task_id, unit.model, seq), unit.task_id, unit.model, seq, "valid"
    )
    status = "pending" if pending else rng.choice(["valid"] * 6 + ["invalid", "errored"])
    record.status = status  # type: ignore[assignment]
    if status == "errored":
        stage = rng.choice(["generation", "extraction", "render"])
        record.error = {"stage": stage, "type": "E", "message": "m"}
    else:
        scores = {"score": rng.choice([0.0, 1.0, rng.random(), rng.uniform(-3, 3)])}
        if rng.random() < 0.7:
            scores["f1"] = rng.random() / 7
        if rng.random() < 0.2:
            scores[f"extra_{rng.randrange(5)}"] = rng.uniform(0, 1e6)
        record.scores = scores
    if rng.random() < 0.5:
        record.model_calls = {
            "candidate": 1,
            "judge": rng.randrange(3),
            "response_ids": [f"r{seq}"],
        }
    return record


def play_run(store: ResultStore, rng: random.Random) -> list[Unit]:
    """Records a randomized run as pods and the operator's passes would leave it."""
    rows = {"qa": rng.randrange(1, 60), "mix": rng.randrange(0, 30), "batchy": rng.randrange(1, 40)}
    tasks = [
        ("qa", rows["qa"], False),
        ("mix", rows["mix"], False),
        ("batchy", rows["batchy"], True),
    ]
    units = plan_units(tasks, ["precomputed", "openai:gpt-x"], rng.choice([3, 7, 10]))
    store.create_run(RunRecord(RUN, "suite", "sha256:x", {}, "pod"))
    failed = {u.unit_id for u in units if u.kind == "shard" and rng.random() < 0.15}
    done: set[str] = set()
    order = [u for u in units if u.kind == "shard"]
    rng.shuffle(order)
    for unit in order:
        count = unit.stop - unit.start
        if unit.task_id == "mix" and rng.random() < 0.3:
            count += rng.randrange(1, 4)  # a transform_batch that added rows
        aggregate_task = unit.task_id == "batchy"
        samples = [random_sample(rng, unit, p, aggregate_task) for p in range(count)]
        if unit.unit_id in failed:
            store.record_samples(samples[: rng.randrange(count + 1)])  # died half way
            continue
        if rng.random() < 0.3:  # an earlier attempt stored some, the retried pod the rest
            store.record_samples(samples[: count // 2])
        store.record_samples(samples)
        store.mark_unit_done(RUN, unit.unit_id, {"kind": "shard"})
        done.add(unit.unit_id)
        record_done_units(store, RUN, units, done, CRITERIA)  # the pass the report wakes
        if rng.random() < 0.2:  # its done report replayed after a rewrite of its samples
            store.record_samples(
                [random_sample(rng, unit, p, aggregate_task) for p in range(count)]
            )
            store.mark_unit_done(RUN, unit.unit_id, {"kind": "shard"})
            record_done_units(store, RUN, units, done, CRITERIA)
    for unit in (u for u in units if u.kind == "aggregate"):
        group = {u.unit_id for u in units if (u.task_id, u.model) == (unit.task_id, unit.model)}
        if group & failed:
            continue  # not run: a shard failed
        ids = [s.sample_id for s in store.iter_samples(RUN, task_id="batchy", model=unit.model)]
        updates: list[dict[str, Any]] = [
            {"sample_id": i, "scores": {"score": rng.random(), "bonus": rng.random()}}
            for i in ids
            if rng.random() < 0.6
        ]
        store.apply_sample_updates(RUN, updates)
        store.settle_pending(RUN, "batchy", unit.model, "valid")
        metrics = {"macro_f1": rng.random(), "undeclared": rng.random()}
        store.save_task_result(
            TaskResultRecord(RUN, "batchy", unit.model, metrics, None, [], {"judge": 2})
        )
        store.mark_unit_done(RUN, unit.unit_id, {"kind": "aggregate"})
        done.add(unit.unit_id)
        record_done_units(store, RUN, units, done, CRITERIA)
    return units


@pytest.mark.parametrize("seed", range(6))
def test_unit_aggregates_give_exactly_the_results_of_reading_every_sample(
    store: ResultStore, seed: int
) -> None:
    rng = random.Random(seed)
    units = play_run(store, rng)
    merged = run_aggregates(store, RUN, units, CRITERIA)
    assert merged is not None, "the unit aggregates account for every stored sample"
    new = aggregate_results(store, RUN, merged, EXPECTED, CRITERIA, DECLARED)
    old = aggregate_results(store, RUN, None, EXPECTED, CRITERIA, DECLARED)
    assert sorted(new, key=lambda r: (r.task, r.model)) == sorted(
        old, key=lambda r: (r.task, r.model)
    )
    assert sum(r.counts.samples for r in new) == sum(store.sample_counts(RUN).values())
    # every covering unit's aggregate is kept now, so finishing again reads no sample
    assert store.unit_aggregate_ids(RUN) >= {u.unit_id for u in covering_units(units)}
    again = aggregate_results(
        store, RUN, run_aggregates(store, RUN, units, CRITERIA), EXPECTED, CRITERIA, DECLARED
    )
    assert again == new


def test_a_done_report_replayed_drops_the_units_aggregate(store: ResultStore) -> None:
    """Idempotent by unit: a unit reported done again is counted from its samples as they are
    now, once (never its old aggregate plus the new)."""
    [unit] = plan_units([("qa", 3, False)], ["precomputed"], 10)
    store.create_run(RunRecord(RUN, "suite", "sha256:x", {}, "pod"))
    rng = random.Random(1)
    store.record_samples([random_sample(rng, unit, p, False) for p in range(3)])
    store.mark_unit_done(RUN, unit.unit_id)
    assert record_done_units(store, RUN, [unit], {unit.unit_id}, CRITERIA) == 1
    assert record_done_units(store, RUN, [unit], {unit.unit_id}, CRITERIA) == 0  # kept
    store.mark_unit_done(RUN, unit.unit_id)
    assert store.unit_aggregate_ids(RUN) == set()
    assert record_done_units(store, RUN, [unit], {unit.unit_id}, CRITERIA) == 1
    merged = run_aggregates(store, RUN, [unit], CRITERIA)
    assert merged is not None
    assert merged[("qa", "precomputed")].samples == 3


def test_samples_the_units_do_not_account_for_make_it_read_every_sample(
    store: ResultStore,
) -> None:
    """A sample outside every unit's range of sequence numbers (never written by a runner of
    this plan) is not lost: the counts differ from the store's, and the caller reads every
    sample instead."""
    [unit] = plan_units([("qa", 3, False)], ["precomputed"], 10)
    store.create_run(RunRecord(RUN, "suite", "sha256:x", {}, "pod"))
    rng = random.Random(2)
    store.record_samples([random_sample(rng, unit, p, False) for p in range(3)])
    store.mark_unit_done(RUN, unit.unit_id)
    record_done_units(store, RUN, [unit], {unit.unit_id}, CRITERIA)
    stray = random_sample(rng, unit, 0, False)
    stray.seq, stray.sample_id = seq_range(unit)[1] + 5, "s_stray"
    store.record_samples([stray])
    assert run_aggregates(store, RUN, [unit], CRITERIA) is None
