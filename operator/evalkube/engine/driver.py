"""The one unit driver: plans a run's units and drives each with its model access.

``evalkube run`` (:mod:`evalkube.local.engine`), the work-unit pod's runner
(:mod:`evalkube.engine.pod`) and the operator (which only plans) all come here, so the three
can never disagree about which units a run has or what a grader may spend:

- :func:`plan_run` is the only planner (the operator's and the pod's plans of one snapshot are
  the same list, tested);
- :func:`drive_unit` owns model access: a task whose grader has ``model_access: gateway`` gets
  the bridge's grader endpoint, execution tokens and a unit budget of ``max_model_calls`` per
  execution x planned executions; any other task gets no endpoint and a zero budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evalkube import limits
from evalkube.engine.plan import Unit, plan_units
from evalkube.engine.runner import (
    BridgeControl,
    UnitContext,
    UnitReport,
    grader_calls_models,
    run_aggregate,
    run_shard,
)
from evalkube.models import EvalRunSpec, EvalSuiteSpec, TaskSpec

__all__ = [
    "BridgeControl",
    "drive_unit",
    "grader_calls_models",
    "has_model_access",
    "judges_call_models",
    "plan_run",
]


def plan_run(suite: EvalSuiteSpec, row_counts: Mapping[str, int], spec: EvalRunSpec) -> list[Unit]:
    """The units of a run of ``suite`` with ``spec`` (rows per task from ``row_counts``)."""
    tasks = [
        (task.id, int(row_counts[task.id]), task.primary_grader.resolved_execution == "aggregate")
        for task in suite.tasks
    ]
    return plan_units(tasks, spec.models, spec.shard_size or limits.SHARD_SIZE_DEFAULT)


def has_model_access(task: TaskSpec) -> bool:
    """Whether ``task`` spends model calls while grading (``ctx`` or a model built-in)."""
    return any(g.resolved_model_access == "gateway" for g in task.criteria)


def judges_call_models(task: TaskSpec) -> bool:
    """Whether a built-in of ``task`` (score_model, label_model, cosine) calls models: the
    trusted runner makes those calls, so only then does a pod's runner mount the socket."""
    return any(g.calls_models for g in task.criteria)


def drive_unit(
    ctx: UnitContext,
    unit: Unit,
    rows: list[dict[str, Any]] | None,
    bridge: BridgeControl | None,
) -> UnitReport:
    """Run ``unit`` (``rows``: its shard's dataset rows; ``None`` for an aggregate unit)."""
    task = ctx.runtime.task
    access = bridge if bridge is not None and has_model_access(task) else None
    if bridge is not None:
        planned = len(rows or ()) * len(task.criteria) if unit.kind == "shard" else 1
        if access is not None:
            calls = max(g.max_model_calls for g in task.criteria)
            bridge.configure_unit(unit.unit_id, calls, planned)
        else:  # a grader without model access spends nothing, whatever it finds to call
            bridge.configure_unit(unit.unit_id, 0, 0)
    ctx.bridge = access
    ctx.model_endpoint = access.endpoint if access is not None else None
    if unit.kind == "aggregate":
        return run_aggregate(ctx, unit)
    return run_shard(ctx, unit, rows or [])
