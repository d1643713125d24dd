"""Plain records the store reads and writes (dataclasses: cheap at 100k samples)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

SampleStatus = Literal["valid", "invalid", "errored", "pending"]


@dataclass(slots=True)
class SampleRecord:
    """Everything known about one sample: inputs, outputs, scores and what went wrong."""

    run_id: str
    sample_id: str
    task_id: str
    model: str
    seq: int
    """Position of the row in the task after preprocessing (orders the debugging view)."""
    status: SampleStatus
    row_id: str | None = None
    prompt: Any = None
    target: str | None = None
    output_text: str | None = None
    extracted_output: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    judge: Any = None
    error: dict[str, Any] | None = None
    """``{"stage", "type", "message", "traceback"}`` when something failed."""
    model_calls: dict[str, Any] = field(default_factory=dict)
    """Counts by purpose and the response ids of every model call for this sample."""
    response_id: str | None = None
    dataset_row: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    stdout: str | None = None
    stderr: str | None = None


@dataclass(slots=True)
class RunRecord:
    """One run: what it ran, where, and how it ended."""

    run_id: str
    suite_name: str
    suite_version: str
    spec: dict[str, Any]
    sandbox: str
    phase: str = "Running"
    created_at: datetime | None = None
    completed_at: datetime | None = None
    summary: dict[str, Any] | None = None


@dataclass(slots=True)
class TaskResultRecord:
    """Batch-level outcome of one task x model (``grade_batch`` metrics or its error)."""

    run_id: str
    task_id: str
    model: str
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    model_calls: dict[str, int] = field(default_factory=dict)
    """Model calls of the ``grade_batch`` execution by purpose (it belongs to no one sample)."""
