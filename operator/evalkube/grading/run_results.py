"""A run's results per task x model, read back from its store: what ``evalkube run`` prints
and the operator writes into EvalRun status.

Here rather than in the local engine so the controller uses it without importing the engine
that runs suites; the store is reached through :class:`ScoreSource`, a protocol the SQL store
satisfies, so this layer imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from evalkube.grading.aggregate import TaskAggregate, cap_metrics
from evalkube.grading.criteria import Criterion
from evalkube.models import CriterionCounts, EvalSuiteSpec, SampleCounts, TaskModelResult


class BatchResult(Protocol):
    """A task x model's ``grade_batch`` outcome as the store keeps it."""

    @property
    def task_id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def metrics(self) -> dict[str, float]: ...
    @property
    def error(self) -> str | None: ...
    @property
    def model_calls(self) -> dict[str, int]: ...


class ScoreSource(Protocol):
    """The store reads aggregation needs (:class:`evalkube.store.ResultStore` has them)."""

    def iter_scores(
        self, run_id: str
    ) -> Iterator[tuple[str, str, str, dict[str, float], dict[str, Any]]]: ...

    def task_results(self, run_id: str) -> Sequence[BatchResult]: ...


def expected_metrics(
    suite: EvalSuiteSpec, criteria_of: Mapping[str, Sequence[Criterion]]
) -> dict[str, list[str]]:
    """Per task, the per-sample metrics reported as 0 when no sample of it is valid (a metric
    must not vanish from the results because every sample errored)."""
    declared = declared_metrics(suite, criteria_of)
    return {
        task.id: declared[task.id] if task.primary_grader.resolved_execution == "per_sample" else []
        for task in suite.tasks
    }


def declared_metrics(
    suite: EvalSuiteSpec, criteria_of: Mapping[str, Sequence[Criterion]]
) -> dict[str, list[str]]:
    """Per task, its declared metrics: ``metrics``, else its criteria's metric ids. Results
    always report them, and only they are exported to Prometheus (a grader's other names
    cannot create series)."""
    return {
        task.id: task.metrics or [c.metric_id for c in criteria_of.get(task.id, ())]
        for task in suite.tasks
    }


def aggregate_results(
    store: ScoreSource,
    run_id: str,
    live: dict[tuple[str, str], TaskAggregate] | None = None,
    expected: dict[str, list[str]] | None = None,
    criteria_of: Mapping[str, Sequence[Criterion]] | None = None,
    declared: Mapping[str, Sequence[str]] | None = None,
) -> list[TaskModelResult]:
    """Aggregates per task x model from the stored samples (or ``live`` ones) and batch results.

    ``expected``: per task, the metrics reported as 0 when no sample of it is valid;
    ``criteria_of`` (task id -> criteria) adds pass/fail counts per criterion; ``declared``
    (task id -> names) are kept first when a result's metrics are capped (:func:`cap_metrics`).
    """
    criteria_of = criteria_of or {}
    aggregates: dict[tuple[str, str], TaskAggregate] = dict(live) if live is not None else {}
    rows = store.iter_scores(run_id) if live is None else iter(())
    for task_id, model, status, scores, calls in rows:
        aggregates.setdefault((task_id, model), TaskAggregate()).add(
            status,
            scores,
            {k: v for k, v in calls.items() if k != "response_ids"},
            criteria_of.get(task_id, ()),
        )
    batch = {(r.task_id, r.model): r for r in store.task_results(run_id)}
    results = []
    for (task_id, model), aggregate in aggregates.items():
        task_result = batch.get((task_id, model))
        model_calls = dict(aggregate.model_calls)
        for purpose, count in (task_result.model_calls if task_result else {}).items():
            model_calls[purpose] = model_calls.get(purpose, 0) + count
        metrics, omitted = cap_metrics(
            aggregate.metrics(
                task_result.metrics if task_result else None, (expected or {}).get(task_id, ())
            ),
            (declared or {}).get(task_id, ()),
        )
        omitted += 1 if aggregate.untracked else 0
        results.append(
            TaskModelResult(
                task=task_id,
                model=model,
                metrics=metrics,
                metrics_omitted=omitted or None,
                counts=SampleCounts(**aggregate.counts()),
                criteria={
                    name: CriterionCounts(**counts)
                    for name, counts in aggregate.criteria_counts(
                        criteria_of.get(task_id, ())
                    ).items()
                },
                model_calls=dict(sorted(model_calls.items())),
                error=task_result.error if task_result else None,
            )
        )
    return results
