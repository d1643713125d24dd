"""Several criteria per task (OpenAI's ``testing_criteria``): merging outcomes, pass/fail.

Pure: the runner grades a sample once per criterion and merges the outcomes here; the
aggregates count each criterion's passed/failed samples from the stored scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evalkube.grading.results import GradeOutcome, Status


@dataclass(frozen=True, slots=True)
class Criterion:
    """What the aggregates need of one criterion: its name, score key and threshold."""

    name: str
    metric_id: str
    pass_threshold: float | None = None


def merge_outcomes(outcomes: Sequence[tuple[Criterion, GradeOutcome]]) -> GradeOutcome:
    """One sample's outcome over its criteria.

    Each criterion's primary score keeps its ``metric_id`` (unique within the task); its
    other named scores are stored as ``name.score`` so criteria never overwrite each other.
    The sample is invalid when any criterion is; the judge holds each criterion's judge by
    name and the error names the first invalid criterion.
    """
    scores: dict[str, float] = {}
    judge: dict[str, Any] = {}
    error: dict[str, Any] | None = None
    for criterion, outcome in outcomes:
        for key, value in outcome.scores.items():
            scores[key if key == criterion.metric_id else f"{criterion.name}.{key}"] = value
        judge[criterion.name] = outcome.judge
        if outcome.error is not None and error is None:
            error = {**outcome.error, "criterion": criterion.name}
    status: Status = "invalid" if any(o.status == "invalid" for _, o in outcomes) else "valid"
    return GradeOutcome(status, scores, judge, error)


def pass_counts(
    criteria: Sequence[Criterion], status: str, scores: Mapping[str, float] | None
) -> list[tuple[str, bool]]:
    """``(criterion, passed)`` for each criterion with a threshold that graded this sample.

    A graded sample (valid or invalid) passes when its score is >= the threshold (OpenAI's
    semantics); a missing score counts 0, like the means. Errored and pending samples were
    never graded and count in neither.
    """
    if status not in ("valid", "invalid"):
        return []
    scores = scores or {}
    return [
        (c.name, scores.get(c.metric_id, 0.0) >= c.pass_threshold)
        for c in criteria
        if c.pass_threshold is not None
    ]
