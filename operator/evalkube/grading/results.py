"""Validate what a grader returned, exactly as docs/graders.md says (pure functions).

A finite number (not a bool) is stored under ``metric_id``; a dict with ``scores`` keeps its
finite numeric scores and its ``judge``. Everything else is *invalid*: it scores 0 under
``metric_id``, is counted as invalid, and keeps the raw payload and the error on the judge
so the debugging view shows what happened.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from evalkube import limits

Status = Literal["valid", "invalid"]


@dataclass(slots=True)
class GradeOutcome:
    """A validated grade: status, scores that count, judge payload, error if invalid."""

    status: Status
    scores: dict[str, float]
    judge: Any = None
    error: dict[str, Any] | None = field(default=None)


def _finite(value: int | float) -> bool:
    """``math.isfinite`` that treats ints too large for a float (JSON allows them) as not."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def is_score(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and _finite(value)


def capped_repr(value: Any, limit: int = limits.INVALID_PAYLOAD_REPR_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (with a marker when cut)."""
    try:
        text = repr(value)
    except Exception:  # a value decoded from JSON has a repr, but stay total
        text = f"<unrepresentable {type(value).__name__}>"
    if len(text) > limit:
        return text[:limit] + f"... [{len(text) - limit} more characters]"
    return text


def invalid(
    metric_id: str,
    *,
    error_type: str,
    message: str,
    traceback: str = "",
    raw: Any = None,
    raw_repr: str | None = None,
) -> GradeOutcome:
    """An invalid outcome: 0 under ``metric_id``; the judge holds the raw payload and error."""
    error = {
        "type": error_type,
        "message": message[: limits.ERROR_MESSAGE_CHARS],
        "traceback": "\n".join(traceback.splitlines()[-limits.TRACEBACK_TAIL_LINES :]),
    }
    judge = {
        "invalid_payload": raw_repr if raw_repr is not None else capped_repr(raw),
        "error": error,
    }
    return GradeOutcome("invalid", {metric_id: 0.0}, judge, error)


def score_names_problem(names: Collection[str], declared: Collection[str]) -> str | None:
    """Why a sample's score names are refused (too many undeclared, or one too long), or None.

    Every name a grader returns becomes a metric of its task (status, aggregates), so the
    host bounds them: :data:`~evalkube.limits.SCORE_NAMES_PER_SAMPLE` names besides the
    ``declared`` ones, each at most :data:`~evalkube.limits.SCORE_NAME_CHARS` characters."""
    undeclared = sum(1 for name in names if name not in declared)
    if undeclared > limits.SCORE_NAMES_PER_SAMPLE:
        return (
            f"the grader returned {undeclared} score names besides the task's declared "
            f"metrics; at most {limits.SCORE_NAMES_PER_SAMPLE} are accepted per sample "
            "(declare the names you report in the task's `metrics`, or return fewer)"
        )
    for name in names:
        if len(name) > limits.SCORE_NAME_CHARS:
            return (
                f"score name {capped_repr(name, 60)} has {len(name)} characters; at most "
                f"{limits.SCORE_NAME_CHARS} are accepted"
            )
    return None


def validate_return(value: Any, metric_id: str, declared: Collection[str] = ()) -> GradeOutcome:
    """Validate a ``grade()`` return value (``declared``: the task's declared metric names,
    which do not count towards the per-sample cap on score names)."""

    def refused(message: str) -> GradeOutcome:
        return invalid(metric_id, error_type="InvalidResult", message=message, raw=value)

    if isinstance(value, bool):
        return refused("the grader returned a bool; return a number (1.0/0.0) or {'scores': {...}}")
    if isinstance(value, int | float):
        if _finite(value):
            return GradeOutcome("valid", {metric_id: float(value)})
        return refused(f"the grader returned a non-finite number ({value}); scores must be finite")
    if isinstance(value, dict):
        scores_in = value.get("scores")
        scores: dict[str, float] = {}
        if isinstance(scores_in, dict):
            problem = score_names_problem([str(k) for k in scores_in], {metric_id, *declared})
            if problem is not None:
                return invalid(
                    metric_id,
                    error_type="TooManyScores",
                    message=problem,
                    raw_repr=capped_repr(value, 500),
                )
            scores = {str(k): float(v) for k, v in scores_in.items() if is_score(v)}
        if not scores:
            return refused(
                "the grader returned a dict without any finite numeric score in "
                "`scores`; return {'scores': {'name': number}}"
            )
        return GradeOutcome("valid", scores, value.get("judge"))
    kind = "None" if value is None else type(value).__name__
    return refused(
        f"the grader returned {kind}; return a finite number or {{'scores': {{'name': number}}}}"
    )
