"""Aggregates per task x model, computed by streaming over samples (pure, O(metrics) memory).

Each per-sample metric is the mean over *all* samples of the task x model: a sample without
the metric (invalid, errored, or a grader that did not return it) counts 0, so failures pull
the score down instead of silently shrinking the denominator. Batch metrics from
``grade_batch`` are added as they are.

Memory and results stay bounded whatever graders return: at most
:data:`~evalkube.limits.METRIC_NAMES_TRACKED` names are averaged per task x model, and a
result reports the declared metrics plus undeclared ones up to
:data:`~evalkube.limits.METRICS_PER_RESULT` (:func:`cap_metrics`).

Sums are exact: every finite float is an integer number of 2**-1074 (the smallest subnormal),
so a sum is kept as that integer, and a mean is the one correctly rounded division of it by
the count. A mean therefore does not depend on the order samples are counted in, nor on how
they were split into partial aggregates and merged (units counted apart, in other processes
or stored per unit: :meth:`TaskAggregate.to_wire`): every way gives the same float.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evalkube import limits
from evalkube.grading.criteria import Criterion, pass_counts

#: A sum is an integer number of 2**-_SCALE (every finite double is one).
_SCALE = 1074
_ONE = 1 << _SCALE
#: Exact values of the scores seen most (0, 1, 0.5, ...), so the common case is one lookup.
_EXACT: dict[float, int] = {}
_EXACT_CACHED = 4_096
#: The sample counters of a :class:`TaskAggregate` (merged and written alike).
_COUNTERS = ("samples", "valid", "invalid", "errored", "pending")


def exact(value: float) -> int:
    """``value`` as an integer number of 2**-1074; :class:`ValueError` or
    :class:`OverflowError` for NaN and infinities (which result validation never lets
    through)."""
    found = _EXACT.get(value)
    if found is not None:
        return found
    numerator, denominator = value.as_integer_ratio()
    scaled = numerator << (_SCALE + 1 - denominator.bit_length())
    if len(_EXACT) < _EXACT_CACHED:
        _EXACT[value] = scaled
    return scaled


def exact_mean(total: int, count: int) -> float:
    """``total`` (in 2**-1074) divided by ``count``, correctly rounded (one rounding)."""
    try:
        return total / (count << _SCALE)
    except OverflowError:  # the mean of finite scores, beyond the largest float
        return math.copysign(math.inf, total)


def exact_floats(total: int) -> list[float]:
    """Floats whose exact sum is ``total`` (in 2**-1074): its lossless JSON form, usually one
    or two numbers."""
    out: list[float] = []
    while total:
        try:
            part = total / _ONE
        except OverflowError:
            part = sys.float_info.max if total > 0 else -sys.float_info.max
        out.append(part)
        total -= exact(part)
    return out


@dataclass(slots=True)
class TaskAggregate:
    """Running sums for one task x model."""

    samples: int = 0
    valid: int = 0
    invalid: int = 0
    errored: int = 0
    pending: int = 0
    sums: dict[str, int] = field(default_factory=dict)
    """Per metric name, the exact sum of its scores in 2**-1074 (:func:`exact`)."""
    model_calls: dict[str, int] = field(default_factory=dict)
    passed: dict[str, int] = field(default_factory=dict)
    """Per criterion with a ``passThreshold``: graded samples whose score reached it."""
    failed: dict[str, int] = field(default_factory=dict)
    """Per criterion with a ``passThreshold``: graded samples whose score fell short."""
    untracked: int = 0
    """Scores not averaged because :data:`~evalkube.limits.METRIC_NAMES_TRACKED` other names
    were tracked first."""

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
        counter = status if status in ("valid", "invalid", "errored") else "pending"
        setattr(self, counter, getattr(self, counter) + 1)
        for name, value in (scores or {}).items():
            try:
                self._add_score(name, exact(value))
            except (ValueError, OverflowError, AttributeError):
                continue  # not a finite number: validation never stores one
        for purpose, count in (model_calls or {}).items():
            if isinstance(count, int) and not isinstance(count, bool):
                self.model_calls[purpose] = self.model_calls.get(purpose, 0) + count

    def merge(self, other: TaskAggregate) -> None:
        """Add the samples ``other`` counted (units run in other processes)."""
        for counter in _COUNTERS:
            setattr(self, counter, getattr(self, counter) + getattr(other, counter))
        for name, total in other.sums.items():
            self._add_score(name, total)
        self.untracked += other.untracked
        for purpose, count in other.model_calls.items():
            self.model_calls[purpose] = self.model_calls.get(purpose, 0) + count
        for mine, theirs in ((self.passed, other.passed), (self.failed, other.failed)):
            for name, count in theirs.items():
                mine[name] = mine.get(name, 0) + count

    def _add_score(self, name: str, value: int) -> None:
        total = self.sums.get(name)
        if total is not None:
            self.sums[name] = total + value
        elif len(self.sums) < limits.METRIC_NAMES_TRACKED:
            self.sums[name] = value
        else:
            self.untracked += 1

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
            {name: exact_mean(total, self.samples) for name, total in self.sums.items()}
            if self.samples
            else {}
        )
        if self.samples and not self.valid:
            for name in expected:
                out.setdefault(name, 0.0)
        out.update(batch_metrics or {})
        return dict(sorted(out.items()))

    def counts(self) -> dict[str, int]:
        """The counters a result reports (``pending`` is not one of them)."""
        return {counter: getattr(self, counter) for counter in _COUNTERS if counter != "pending"}

    def to_wire(self) -> dict[str, Any]:
        """A lossless JSON form (sums as floats adding up exactly), for partial aggregates
        kept in the store; :meth:`from_wire` reads it back."""
        return {
            **{counter: getattr(self, counter) for counter in _COUNTERS},
            "sums": {name: exact_floats(total) for name, total in self.sums.items()},
            "model_calls": self.model_calls,
            "passed": self.passed,
            "failed": self.failed,
            "untracked": self.untracked,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> TaskAggregate:
        aggregate = cls(
            sums={name: sum(exact(p) for p in parts) for name, parts in data["sums"].items()},
            model_calls={k: int(v) for k, v in data["model_calls"].items()},
            passed={k: int(v) for k, v in data["passed"].items()},
            failed={k: int(v) for k, v in data["failed"].items()},
            untracked=int(data["untracked"]),
        )
        for counter in _COUNTERS:
            setattr(aggregate, counter, int(data[counter]))
        return aggregate

    def criteria_counts(self, criteria: Sequence[Criterion]) -> dict[str, dict[str, int]]:
        """``{criterion: {"passed", "failed"}}`` for each criterion with a threshold."""
        return {
            c.name: {"passed": self.passed.get(c.name, 0), "failed": self.failed.get(c.name, 0)}
            for c in criteria
            if c.pass_threshold is not None
        }


def cap_metrics(metrics: Mapping[str, float], keep: Iterable[str]) -> tuple[dict[str, float], int]:
    """A result's metrics: every one named in ``keep`` (the task's declared metrics), then the
    others in name order up to :data:`~evalkube.limits.METRICS_PER_RESULT` in all; with the
    number left out."""
    kept = {name: metrics[name] for name in keep if name in metrics}
    for name in sorted(metrics):
        if len(kept) >= limits.METRICS_PER_RESULT:
            break
        kept.setdefault(name, metrics[name])
    return dict(sorted(kept.items())), len(metrics) - len(kept)
