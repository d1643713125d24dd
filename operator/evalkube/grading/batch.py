"""Apply what ``grade_batch`` returned: aggregate metrics and per-sample updates (pure).

``{"metrics": {...}, "samples": [{"sample_id", "scores"?, "judge"?, "extracted_output"?}]}``.
Scores merge into the sample's scores; ``judge`` replaces (``null`` clears);
``extracted_output`` replaces (``null`` allowed). Unknown sample ids are reported, never
fatal. If the task declares ``metrics``, undeclared batch metric ids are dropped; otherwise at
most :data:`~evalkube.limits.SCORE_NAMES_PER_SAMPLE` are kept, and names longer than
:data:`~evalkube.limits.SCORE_NAME_CHARS` are dropped. A sample update with too many score
names is refused whole (a problem is noted), as ``grade()`` would be.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from evalkube import limits
from evalkube.grading.results import capped_repr, is_score, score_names_problem

_UNSET: Any = object()


@dataclass(slots=True)
class SampleUpdate:
    """One sample's batch update; fields left ``UNSET`` are not touched."""

    sample_id: str
    scores: dict[str, float] = field(default_factory=dict)
    judge: Any = _UNSET
    extracted_output: Any = _UNSET

    @property
    def sets_judge(self) -> bool:
        return self.judge is not _UNSET

    @property
    def sets_extracted_output(self) -> bool:
        return self.extracted_output is not _UNSET


@dataclass(slots=True)
class BatchOutcome:
    """Validated batch result: kept metrics, updates, dropped metrics and problems."""

    metrics: dict[str, float] = field(default_factory=dict)
    updates: list[SampleUpdate] = field(default_factory=list)
    dropped_metrics: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


def _failure(message: str, value: Any) -> BatchOutcome:
    return BatchOutcome(
        error={
            "type": "InvalidBatchResult",
            "message": message,
            "invalid_payload": capped_repr(value),
        }
    )


def validate_batch_return(
    value: Any, *, declared_metrics: Collection[str] | None, sample_ids: Collection[str]
) -> BatchOutcome:
    """Validate a ``grade_batch()`` return value against the task's samples."""
    if not isinstance(value, dict):
        kind = "None" if value is None else type(value).__name__
        return _failure(f"grade_batch returned {kind}; return {{'metrics': {{...}}}}", value)
    outcome = BatchOutcome()
    metrics = value.get("metrics", {})
    if not isinstance(metrics, dict):
        return _failure("`metrics` must be an object of metric id -> number", value)
    overflow = 0
    for name, number in metrics.items():
        if not is_score(number):
            _note(
                outcome.problems,
                f"metric {capped_repr(name, 60)} is not a finite number "
                f"({capped_repr(number, 100)})",
            )
        elif declared_metrics is not None and name not in declared_metrics:
            if len(outcome.dropped_metrics) < limits.SCORE_NAMES_PER_SAMPLE:
                outcome.dropped_metrics.append(str(name)[: limits.SCORE_NAME_CHARS])
        elif declared_metrics is None and (
            len(outcome.metrics) >= limits.SCORE_NAMES_PER_SAMPLE
            or len(name) > limits.SCORE_NAME_CHARS
        ):
            overflow += 1
        else:
            outcome.metrics[str(name)] = float(number)
    if overflow:
        _note(
            outcome.problems,
            f"{overflow} metrics dropped: grade_batch may return at most "
            f"{limits.SCORE_NAMES_PER_SAMPLE} undeclared metrics, each name at most "
            f"{limits.SCORE_NAME_CHARS} characters (declare the task's `metrics`)",
        )
    updates = [] if value.get("samples") is None else value["samples"]
    if not isinstance(updates, list):
        return _failure("`samples` must be a list of sample updates", value)
    for position, raw in enumerate(updates):
        update = _update(raw, position, sample_ids, outcome.problems, declared_metrics or ())
        if update is not None:
            outcome.updates.append(update)
    if not outcome.metrics and not outcome.updates:
        return _failure("grade_batch returned no finite metric and no sample update", value)
    return outcome


def _update(
    raw: Any,
    position: int,
    sample_ids: Collection[str],
    problems: list[str],
    declared: Collection[str],
) -> SampleUpdate | None:
    where = f"samples[{position}]"
    if not isinstance(raw, dict):
        _note(problems, f"{where} is not an object")
        return None
    sample_id = raw.get("sample_id")
    if not isinstance(sample_id, str) or not sample_id:
        _note(problems, f"{where}.sample_id is required")
        return None
    if sample_id not in sample_ids:
        _note(problems, f"{where}.sample_id {sample_id!r} is not a sample of this task and model")
        return None
    update = SampleUpdate(sample_id)
    scores = raw.get("scores")
    if isinstance(scores, dict) and (problem := score_names_problem(list(scores), declared)):
        _note(problems, f"{where}: {problem}")
        return None
    if isinstance(scores, dict):
        for name, number in scores.items():
            if is_score(number):
                update.scores[str(name)] = float(number)
            else:
                _note(problems, f"{where}.scores.{str(name)[:60]} is not a finite number")
    elif scores is not None:
        _note(problems, f"{where}.scores must be an object")
    if "judge" in raw:
        update.judge = raw["judge"]
    if "extracted_output" in raw:
        extracted = raw["extracted_output"]
        if extracted is None or isinstance(extracted, str):
            update.extracted_output = extracted
        else:
            _note(problems, f"{where}.extracted_output must be a string or null")
    return update


def _note(problems: list[str], problem: str) -> None:
    """Add ``problem`` unless :data:`~evalkube.limits.SCORE_NAMES_PER_SAMPLE` are noted."""
    if len(problems) < limits.SCORE_NAMES_PER_SAMPLE:
        problems.append(problem)
