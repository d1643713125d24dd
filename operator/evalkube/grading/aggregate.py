"""Aggregates per task x model, computed by streaming over samples (pure, O(metrics) memory).

Each per-sample metric is the mean over *all* samples of the task x model: a sample without
the metric (invalid, errored, or a grader that did not return it) counts 0, so failures pull
the score down instead of silently shrinking the denominator. Batch metrics from
``grade_batch`` are added as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evalkube.grading.criteria import Criterion, pass_counts


@dataclass(slots=True)
class TaskAggregate:
    """Running sums for one task x model."""

    samples: int = 0
    valid: int = 0
    invalid: int = 0
    errored: int = 0
    pending: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    model_calls: dict[str, int] = field(default_factory=dict)
    passed: dict[str, int] = field(default_factory=dict)
    """Per criterion with a ``passThreshold``: graded samples whose score reached it."""
    failed: dict[str, int] = field(default_factory=dict)
    """Per criterion with a ``passThreshold``: graded samples whose score fell short."""

    def add(
        self,
        status: str,
        scores: Mapping[str, float] | None,
        model_calls: Mapping[str, Any] | None = None,
        criteria: Sequence[Criterion] = (),
    ) -> None:
        """Count one sample (``criteria``: the task's, for pass/fail counts)."""
        for name, ok in pass_counts(criteria, status, scores):
            into = self.passed if ok else self.failed
            into[name] = into.get(name, 0) + 1
        self.samples += 1
        if status == "valid":
            self.valid += 1
        elif status == "invalid":
            self.invalid += 1
        elif status == "errored":
            self.errored += 1
        else:
            self.pending += 1
        for name, value in (scores or {}).items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        for purpose, count in (model_calls or {}).items():
            if isinstance(count, int) and not isinstance(count, bool):
                self.model_calls[purpose] = self.model_calls.get(purpose, 0) + count

    def merge(self, other: TaskAggregate) -> None:
        """Add the samples ``other`` counted (units run in other processes)."""
        self.samples += other.samples
        self.valid += other.valid
        self.invalid += other.invalid
        self.errored += other.errored
        self.pending += other.pending
        for name, total in other.sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + total
        for purpose, count in other.model_calls.items():
            self.model_calls[purpose] = self.model_calls.get(purpose, 0) + count
        for mine, theirs in ((self.passed, other.passed), (self.failed, other.failed)):
            for name, count in theirs.items():
                mine[name] = mine.get(name, 0) + count

    def metrics(
        self,
        batch_metrics: Mapping[str, float] | None = None,
        expected: Iterable[str] = (),
    ) -> dict[str, float]:
        """Per-sample means (missing counts 0) plus batch metrics, sorted by name.

        ``expected``: the task's per-sample metric names, reported as 0 when no sample is
        valid (every one errored or was invalid) instead of vanishing from the results.
        """
        out = (
            {name: total / self.samples for name, total in self.sums.items()}
            if self.samples
            else {}
        )
        if self.samples and not self.valid:
            for name in expected:
                out.setdefault(name, 0.0)
        out.update(batch_metrics or {})
        return dict(sorted(out.items()))

    def counts(self) -> dict[str, int]:
        return {
            "samples": self.samples,
            "valid": self.valid,
            "invalid": self.invalid,
            "errored": self.errored,
        }

    def criteria_counts(self, criteria: Sequence[Criterion]) -> dict[str, dict[str, int]]:
        """``{criterion: {"passed", "failed"}}`` for each criterion with a threshold."""
        return {
            c.name: {"passed": self.passed.get(c.name, 0), "failed": self.failed.get(c.name, 0)}
            for c in criteria
            if c.pass_threshold is not None
        }
