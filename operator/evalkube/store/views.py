"""The debugging view of a sample, shared by ``evalkube samples`` and the samples API."""

from __future__ import annotations

from typing import Any

from evalkube.store.filters import STATUS_FILTERS
from evalkube.store.records import SampleRecord

__all__ = ["STATUS_FILTERS", "sample_view"]


def sample_view(record: SampleRecord) -> dict[str, Any]:
    """What a person debugging a grader looks at, in the seed's field order."""
    return {
        "sample_id": record.sample_id,
        "task_id": record.task_id,
        "model": record.model,
        "status": record.status,
        "row_id": record.row_id,
        "prompt": record.prompt,
        "target": record.target,
        "output_text": record.output_text,
        "extracted_output": record.extracted_output,
        "scores": record.scores,
        "judge": record.judge,
        "error": record.error,
        "model_calls": record.model_calls,
        "response_id": record.response_id,
        "stdout": record.stdout,
        "stderr": record.stderr,
    }
