"""A cluster run's results from per-unit aggregates, so finishing a run reads no sample.

The store's samples stay the source of truth; the operator (trusted, never the runner) reads
each unit's samples once, when the unit is done, through the store's order index (its range
of sequence numbers, :func:`~evalkube.engine.plan.seq_range`), and keeps the unit's
:class:`~evalkube.grading.TaskAggregate` in the store (``evalkube_unit_aggregates``, one row
per unit: idempotent, a replayed done report drops it to be computed again). When every unit
is over, the run's aggregates are the merge of its units': O(units) instead of a read and
JSON decode of every sample's scores on the operator's event loop's process.

Which units make up a task x model: its shard units, unless it has an aggregate unit
(``grade_batch``), which may change any of its shards' samples and is their last writer: then
that unit alone, whose range is every shard. A unit that failed (no done report) is counted
from what it recorded, when the run finishes, as the one-scan aggregation counted it.

Sums are exact (:mod:`evalkube.grading.aggregate`), so merged means equal the one-scan means
bit for bit. As a check that nothing was missed or counted twice, the merged sample counts
must equal the store's count per task x model (an index count, no sample read); if they do
not, the caller falls back to reading every sample (:func:`aggregate_results` without
``live``) and says so in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence

from evalkube.engine.plan import Unit, seq_range
from evalkube.grading import TaskAggregate
from evalkube.grading.criteria import Criterion
from evalkube.store import ResultStore

_log = logging.getLogger(__name__)
CriteriaOf = Mapping[str, Sequence[Criterion]]


def covering_units(units: Sequence[Unit]) -> list[Unit]:
    """The units whose aggregates make up the run's results (see the module docstring)."""
    batch = {(u.task_id, u.model) for u in units if u.kind == "aggregate"}
    return [u for u in units if u.kind == "aggregate" or (u.task_id, u.model) not in batch]


def unit_aggregate(
    store: ResultStore, run_id: str, unit: Unit, criteria_of: CriteriaOf
) -> TaskAggregate:
    """The aggregate of ``unit``'s stored samples (its range of sequence numbers), kept in the
    store."""
    aggregate = TaskAggregate()
    criteria = criteria_of.get(unit.task_id, ())
    add = aggregate.add
    rows = store.unit_scores(run_id, unit.task_id, unit.model, seq_range(unit))
    for status, scores, calls in rows:
        add(status, scores, {k: v for k, v in calls.items() if k != "response_ids"}, criteria)
    store.save_unit_aggregate(run_id, unit.unit_id, unit.task_id, unit.model, aggregate.to_wire())
    return aggregate


def record_done_units(
    store: ResultStore,
    run_id: str,
    units: Sequence[Unit],
    done: Collection[str],
    criteria_of: CriteriaOf,
) -> int:
    """Compute and keep the aggregate of each done unit that has none kept; how many."""
    if not done:
        return 0
    kept = store.unit_aggregate_ids(run_id)
    todo = [u for u in covering_units(units) if u.unit_id in done and u.unit_id not in kept]
    for unit in todo:
        unit_aggregate(store, run_id, unit, criteria_of)
    return len(todo)


def run_aggregates(
    store: ResultStore, run_id: str, units: Sequence[Unit], criteria_of: CriteriaOf
) -> dict[tuple[str, str], TaskAggregate] | None:
    """Every unit is over: the run's aggregates per task x model (sorted), merged from its
    units' (a unit without one kept, a failed unit's, computed now and kept); ``None`` when
    their counts are not the store's (then read every sample instead)."""
    kept = store.unit_aggregates(run_id)
    merged: dict[tuple[str, str], TaskAggregate] = {}
    for unit in covering_units(units):
        if unit.unit_id in kept:
            aggregate = TaskAggregate.from_wire(kept[unit.unit_id][2])
        else:
            aggregate = unit_aggregate(store, run_id, unit, criteria_of)
        if aggregate.samples:
            merged.setdefault((unit.task_id, unit.model), TaskAggregate()).merge(aggregate)
    counts = store.sample_counts(run_id)
    mine = {key: aggregate.samples for key, aggregate in merged.items()}
    if counts != mine:
        _log.warning(
            "run %s: unit aggregates count %s samples per task x model, the store %s; "
            "reading every sample instead",
            run_id,
            mine,
            counts,
        )
        return None
    return dict(sorted(merged.items()))
