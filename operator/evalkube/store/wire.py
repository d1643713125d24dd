"""The ingest API's small bodies (sample updates, settling, batch results), declared once.

:class:`~evalkube.store.remote.RemoteStore` sends them from a work-unit pod and
:class:`~evalkube.controller.api.ApiServer` validates them with
:class:`evalkube.util.body_shape.Shape` (a bad one is a 400 naming the field). Samples
themselves, the hot path, keep their hand-tuned decoder
(:func:`~evalkube.store.remote.sample_from_wire`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evalkube.util.body_shape import Shape


class _Body(BaseModel):
    #: Other keys are ignored (a body claiming a ``run_id`` is pinned to the token's run).
    model_config = ConfigDict(frozen=True)


class _Exact(BaseModel):
    #: What a sample may have changed: nothing else.
    model_config = ConfigDict(extra="forbid", frozen=True)


class SampleUpdate(_Exact):
    """One ``grade_batch`` update; only the keys sent are applied (``null`` clears)."""

    sample_id: str
    scores: dict[str, float] | None = None
    judge: Any = None
    extracted_output: Any = None


class SampleUpdates(_Body):
    updates: list[SampleUpdate]


class SettleValues(_Exact):
    scores: dict[str, float] | None = None
    judge: Any = None
    error: Any = None


class Settle(_Body):
    """Settle a unit's pending samples as ``valid`` or ``invalid``."""

    task: str
    model: str
    status: Literal["valid", "invalid"]
    values: SettleValues = Field(default_factory=SettleValues)


class TaskResult(_Body):
    """A task x model's batch metrics or its error."""

    task: str
    model: str
    metrics: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    problems: list[str] = Field(default_factory=list)
    model_calls: dict[str, int] = Field(default_factory=dict, alias="modelCalls")


SAMPLE_UPDATES = Shape(
    SampleUpdates,
    '{"updates": [{"sample_id": str, "scores"?: {name: number}, "judge"?, '
    '"extracted_output"?}, ...]}',
)
SETTLE = Shape(
    Settle,
    '{"task": str, "model": str, "status": "valid"|"invalid", '
    '"values"?: {"scores"?, "judge"?, "error"?}}',
)
TASK_RESULT = Shape(
    TaskResult,
    '{"task": str, "model": str, "metrics"?: {name: number}, "error"?: str, "problems"?: [str], '
    '"modelCalls"?: {purpose: int}}',
)


class UnitFailure(_Body):
    """Why a unit's runner could not run it."""

    reason: str = Field(min_length=1)


UNIT_FAILURE = Shape(UnitFailure, '{"reason": str}')


#: What a kept answer is for: a candidate, or the list of a sample's grader ``ctx`` calls.
AnswerPurpose = Literal["candidate", "ctx"]


class KeptAnswers(_Exact):
    """Model answers a pod keeps as they arrive: a retried Job takes them back."""

    purpose: AnswerPurpose
    answers: list[tuple[str, Any]]


class AnswerLookup(_Exact):
    purpose: AnswerPurpose
    sample_ids: list[str] = Field(max_length=10_000)


KEPT_ANSWERS = Shape(
    KeptAnswers, '{"purpose": "candidate"|"ctx", "answers": [[sample_id, answer]]}'
)
ANSWER_LOOKUP = Shape(AnswerLookup, '{"purpose": "candidate"|"ctx", "sample_ids": [str]}')
