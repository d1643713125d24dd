"""The JSON bodies of the bridge's control routes, declared for pydantic.

Only the trusted runner calls these routes (never on the hot path of a model call), so a
declared shape beats hand-written checks; :class:`evalkube.util.body_shape.Shape` answers a bad
body with the wrong fields and the shape to send.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from evalkube import limits
from evalkube.util.body_shape import Shape


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError("must be printable")
    return value


ExecutionId = Annotated[
    str, Field(min_length=1, max_length=limits.EXECUTION_ID_CHARS), AfterValidator(_printable)
]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True)


class UnitBudget(_Body):
    """``PUT /evalkube/v1/budget``."""

    unit_id: str
    max_calls_per_execution: Annotated[int, Field(ge=0)]
    planned_executions: Annotated[int, Field(ge=0)]


class UsageTake(_Body):
    """``POST /evalkube/v1/usage:take``: ``"*"`` takes every recorded execution."""

    execution_ids: list[str] | Literal["*"]


class ExecutionsOpen(_Body):
    """``POST /evalkube/v1/executions:open``."""

    tokens: list[ExecutionId]


UNIT_BUDGET = Shape(
    UnitBudget,
    '{"unit_id": str, "max_calls_per_execution": int >= 0, "planned_executions": int >= 0}',
)
USAGE_TAKE = Shape(
    UsageTake, '{"execution_ids": ["id", ...]} (or "*" for every recorded execution)'
)
EXECUTIONS_OPEN = Shape(
    ExecutionsOpen,
    f'{{"tokens": ["token", ...]}} (printable, at most {limits.EXECUTION_ID_CHARS} '
    "characters each)",
)
