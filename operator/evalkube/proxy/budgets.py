"""Model-call budgets: ``max_model_calls`` per grader execution and a total per work unit.

The grader sets its execution id (``X-Evalkube-Execution``) itself, so the id alone cannot
be trusted: a grader rotating or forging ids would get a fresh per-execution budget each
time. The unit total (``max_model_calls x planned executions``) closes that door: however the
calls are spread over ids, a unit never makes more calls than its samples were entitled to.

One proxy serves one unit at a time (a pod's sidecar serves its one unit; the local engine
runs units one after another and calls :meth:`Budgets.configure_unit` before each). Called
only from the proxy's event loop thread or under its lock: not thread-safe by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evalkube import limits


class BudgetExhausted(Exception):
    """The call would exceed a budget; the message is meant for the grader's author."""

    def __init__(self, message: str, scope: str) -> None:
        super().__init__(message)
        self.scope = scope


@dataclass
class UnitBudget:
    """The budget of one work unit."""

    unit_id: str
    max_calls_per_execution: int
    planned_executions: int | None
    used: int = 0
    per_execution: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int | None:
        """The unit's total, ``None`` when no executions were planned (no unit cap)."""
        if self.planned_executions is None:
            return None
        return self.max_calls_per_execution * self.planned_executions


class Budgets:
    """Per-execution and per-unit call budgets of the unit being served."""

    def __init__(
        self,
        max_calls_per_execution: int = limits.MAX_MODEL_CALLS_DEFAULT,
        planned_executions: int | None = None,
        unit_id: str = "default",
    ) -> None:
        self.unit = UnitBudget(unit_id, max_calls_per_execution, planned_executions)

    def configure_unit(
        self, unit_id: str, max_calls_per_execution: int, planned_executions: int | None
    ) -> None:
        """Serve ``unit_id`` from now on, with fresh counters.

        ``planned_executions=None`` leaves the unit without a total (only the per-execution
        budget applies): for ad-hoc proxies only; the engine always plans its units.
        """
        if max_calls_per_execution < 0 or (planned_executions or 0) < 0:
            raise ValueError("budgets are non-negative")
        self.unit = UnitBudget(unit_id, max_calls_per_execution, planned_executions)

    def acquire(self, execution_id: str) -> None:
        """Count one call of ``execution_id``, or raise :class:`BudgetExhausted`."""
        unit = self.unit
        used = unit.per_execution.get(execution_id, 0)
        if used >= unit.max_calls_per_execution:
            raise BudgetExhausted(
                f"model call budget of {unit.max_calls_per_execution} exhausted for this execution",
                "execution",
            )
        total = unit.total
        if total is not None and unit.used >= total:
            raise BudgetExhausted(
                f"model call budget of {total} exhausted for this work unit "
                f"({unit.max_calls_per_execution} calls x {unit.planned_executions} executions)",
                "unit",
            )
        unit.per_execution[execution_id] = used + 1
        unit.used += 1

    def snapshot(self) -> dict[str, object]:
        """The served unit's budget and use (for the control API)."""
        unit = self.unit
        return {
            "unit_id": unit.unit_id,
            "max_calls_per_execution": unit.max_calls_per_execution,
            "planned_executions": unit.planned_executions,
            "total": unit.total,
            "used": unit.used,
            "executions": len(unit.per_execution),
        }
