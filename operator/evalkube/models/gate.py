"""The gate of an EvalRun: minimum scores, a maximum error rate, and a baseline run whose
scores may not drop by more than an allowance (judged by a paired test, so noise alone does
not fail a run). Evaluated by :mod:`evalkube.grading.gate`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from evalkube.models.base import SpecModel


class ThresholdSpec(SpecModel):
    """A minimum for one metric, on every task x model it matches."""

    metric: str = Field(min_length=1)
    """Metric id (as in the results)."""
    task: str | None = None
    """Only this task (default: every task with the metric)."""
    model: str | None = None
    """Only this model (default: every model)."""
    min: float
    """The aggregate must be at least this."""


class BaselineSpec(SpecModel):
    """The run to compare with; exactly one of ``run`` and ``lastSucceeded``."""

    run: str | None = None
    """An earlier run: an EvalRun's name in the same namespace (cluster) or a run id (local)."""
    last_succeeded: bool = False
    """The latest earlier Succeeded run of the same suite (none yet: the check passes)."""
    max_regression: float = Field(default=0.0, ge=0)
    """Allowed drop of a metric's mean (absolute, e.g. 0.02)."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    """A drop fails only when the paired bootstrap's upper bound at this confidence is below
    ``-maxRegression`` (the drop is real, not noise)."""

    @model_validator(mode="after")
    def _one_baseline(self) -> BaselineSpec:
        if (self.run is None) == (not self.last_succeeded):
            raise ValueError("set exactly one of `run` (a run name) and `lastSucceeded: true`")
        return self


class GateSpec(SpecModel):
    """Checks a finished run must pass; the result is the ``Passed`` condition."""

    thresholds: list[ThresholdSpec] = Field(default_factory=list, max_length=200)
    """Minimum aggregates."""
    max_error_rate: float | None = Field(default=None, ge=0, le=1)
    """Largest share of errored samples in any task x model."""
    baseline: BaselineSpec | None = None
    """Compare with an earlier run of the suite."""


class GateCheck(SpecModel):
    """One check of the gate and how it came out."""

    name: str
    """What was checked, e.g. ``min qa/gpt-4o exact_match``."""
    kind: Literal["min", "errors", "baseline"]
    """A threshold, the error rate, or the comparison with the baseline."""
    passed: bool
    """Whether the check held."""
    task: str | None = None
    """The task checked (none for a check of the whole run)."""
    model: str | None = None
    """The model checked."""
    metric: str | None = None
    """The metric checked (thresholds and baseline checks)."""
    value: float | None = None
    """The observed value (aggregate, error rate, or mean difference to the baseline)."""
    threshold: float | None = None
    """The bound it was held to."""
    message: str = ""
    """Why it failed (or what it found)."""


class GateStatus(SpecModel):
    """The gate's outcome on a finished run."""

    passed: bool
    """Every check held."""
    baseline: str | None = None
    """The run compared with, when there was one."""
    checks: list[GateCheck] = Field(default_factory=list)
    """Each check and its outcome."""
