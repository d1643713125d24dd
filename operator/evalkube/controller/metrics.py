"""The operator's Prometheus metrics (``evalkube_`` prefix; see docs/metrics.md).

Created on an explicit registry so tests use a fresh one each.
"""

from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SCORE_LABELS = ["namespace", "suite", "task", "model", "metric"]


class OperatorMetrics:
    """All metrics the operator exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        gauge = functools.partial(Gauge, registry=self.registry)
        counter = functools.partial(Counter, registry=self.registry)
        self.score = gauge(
            "evalkube_score",
            "Latest aggregate score of a completed EvalRun, per suite, task, model and metric.",
            _SCORE_LABELS,
        )
        self.gate_passed = gauge(
            "evalkube_gate_passed",
            "Gate of the latest completed EvalRun of a suite: 1 passed, 0 failed.",
            ["namespace", "suite", "run"],
        )
        self.baseline_delta = gauge(
            "evalkube_score_baseline_delta",
            "Latest aggregate score minus its gate baseline's, per suite, task, model and metric.",
            _SCORE_LABELS,
        )
        self.budget_refusals = counter(
            "evalkube_model_budget_refusals",
            "Graders' model calls a work-unit Pod's proxy refused, by scope (execution, unit: "
            "a budget ran out; unknown_execution: a token not open), added when a run finishes.",
            ["namespace", "suite", "scope"],
        )
        self.runs = gauge("evalkube_runs", "EvalRuns known to the operator, by phase.", ["phase"])
        self.samples = counter(
            "evalkube_samples_total",
            "Samples recorded, by status (valid, invalid, errored, pending).",
            ["namespace", "suite", "status"],
        )
        self.model_calls = counter(
            "evalkube_model_calls_total",
            "Model calls recorded on samples, by purpose (candidate, judge, embedding).",
            ["namespace", "suite", "purpose"],
        )
        self.unit_duration = Histogram(
            "evalkube_unit_duration_seconds",
            "Wall-clock duration of work units, from the runner's report.",
            ["kind"],
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200),
            registry=self.registry,
        )
        self.status_patches = counter(
            "evalkube_status_patches_total", "EvalRun status patches written by the operator."
        )
        self.passes = counter(
            "evalkube_reconcile_passes_total",
            "Passes over EvalRuns the operator finished (Job events, unit reports, timer).",
        )
        self.jobs_created = counter("evalkube_jobs_created_total", "Work-unit Jobs created.")
