"""Pure grading domain: result validation, batch merging, aggregation, templates, extraction.

Imports nothing from the rest of evalkube except ``limits``.
"""

from evalkube.grading.aggregate import TaskAggregate
from evalkube.grading.batch import BatchOutcome, SampleUpdate, validate_batch_return
from evalkube.grading.extraction import ExtractionMiss, Extractor, apply_stop
from evalkube.grading.results import GradeOutcome, capped_repr, invalid, is_score, validate_return
from evalkube.grading.templates import PromptTemplate, TemplateError, compile_template

__all__ = [
    "BatchOutcome",
    "ExtractionMiss",
    "Extractor",
    "GradeOutcome",
    "PromptTemplate",
    "SampleUpdate",
    "TaskAggregate",
    "TemplateError",
    "apply_stop",
    "capped_repr",
    "compile_template",
    "invalid",
    "is_score",
    "validate_batch_return",
    "validate_return",
]
