"""The one planner of a run's units, and which tasks call models.

``evalkube run`` (:mod:`evalkube.local.engine`), the work-unit pod's runner
(:mod:`evalkube.engine.pod`) and the operator (which only plans) all plan with
:func:`plan_run` (the operator's and the pod's plans of one snapshot are the same list,
tested); every unit is driven by :meth:`evalkube.engine.session.UnitSession.drive_unit`.
"""

from __future__ import annotations

from collections.abc import Mapping

from evalkube import limits
from evalkube.engine.plan import Unit, plan_units
from evalkube.engine.task_sandbox import grader_calls_models
from evalkube.engine.unit_context import BridgeControl
from evalkube.models import EvalRunSpec, EvalSuiteSpec, TaskSpec

__all__ = [
    "BridgeControl",
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
