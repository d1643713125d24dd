"""Model-call budgets: ``max_model_calls`` per grader execution and a total per work unit.

Executions are identified by **tokens**: the runner draws a fresh random token for every
execution, opens it here through the control listener before the grader may use it, and
closes it when it takes the execution's usage. A grader call is charged to the token in its
``X-Evalkube-Execution`` header only while that token is open; a forged, guessed or reused
token is refused (:class:`UnknownExecution`) and costs no open execution anything. The unit
total (``max_model_calls x planned executions``) stays as a second wall: however calls are
spread over tokens, a unit never makes more calls than its samples were entitled to.

One proxy serves one unit at a time (a pod's sidecar serves its one unit; the local engine
runs units one after another and calls :meth:`Budgets.configure_unit` before each). Called
only from the proxy's event loop thread or under its lock: not thread-safe by itself.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from evalkube import limits


class UnknownExecution(Exception):
    """The call names no open execution token (forged, guessed, reused or never opened)."""


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
    """Calls of each open execution token (a token is open while it is a key here)."""
    refused: Counter[str] = field(default_factory=Counter)
    """Calls refused by scope (``execution``, ``unit``, ``unknown_execution``): the runner
    reports them with the unit, since Prometheus never scrapes a work-unit Pod's proxy."""

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

    def open(self, tokens: list[str]) -> None:
        """Open ``tokens`` for grader calls (ValueError past :data:`limits.OPEN_EXECUTIONS_MAX`
        open at once, or for a token already open: tokens are never reused)."""
        per_execution = self.unit.per_execution
        if len(per_execution) + len(tokens) > limits.OPEN_EXECUTIONS_MAX:
            raise ValueError(
                f"at most {limits.OPEN_EXECUTIONS_MAX} executions may be open at once; "
                "close some (usage:take) first"
            )
        if any(token in per_execution for token in tokens) or len(set(tokens)) != len(tokens):
            raise ValueError("an execution token may be opened only once")
        for token in tokens:
            per_execution[token] = 0

    def close(self, tokens: list[str]) -> None:
        """Close ``tokens``: later calls naming them are refused."""
        for token in tokens:
            self.unit.per_execution.pop(token, None)

    def acquire(self, execution_id: str) -> None:
        """Count one call of the open token ``execution_id``, or raise
        :class:`UnknownExecution` / :class:`BudgetExhausted`."""
        unit = self.unit
        used = unit.per_execution.get(execution_id)
        if used is None:
            unit.refused["unknown_execution"] += 1
            raise UnknownExecution(
                "this execution token is not open (forged, reused or already finished); "
                "call models through ctx.responses_create / ctx.embeddings_create"
            )
        if used >= unit.max_calls_per_execution:
            unit.refused["execution"] += 1
            raise BudgetExhausted(
                f"model call budget of {unit.max_calls_per_execution} exhausted for this execution",
                "execution",
            )
        total = unit.total
        if total is not None and unit.used >= total:
            unit.refused["unit"] += 1
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
            "open_executions": len(unit.per_execution),
            "refused": dict(sorted(unit.refused.items())),
        }
