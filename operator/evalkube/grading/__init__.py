"""Pure grading domain: result validation, batch merging, aggregation, templates, extraction.

Imports nothing from the rest of evalkube except ``limits``.
"""

from evalkube.grading.aggregate import TaskAggregate
from evalkube.grading.batch import BatchOutcome, SampleUpdate, validate_batch_return
from evalkube.grading.builtin import BuiltinGrader, MissingLibrary, MultiGrader
from evalkube.grading.criteria import Criterion, merge_outcomes, pass_counts
from evalkube.grading.extraction import ExtractionMiss, Extractor, apply_stop, parse_output_json
from evalkube.grading.formula import Formula, FormulaError
from evalkube.grading.model_graders import EmbeddingJudge, ModelJudge
from evalkube.grading.results import GradeOutcome, capped_repr, invalid, is_score, validate_return
from evalkube.grading.templates import (
    GRADER_NAMES,
    PROMPT_NAMES,
    GraderTemplate,
    PromptTemplate,
    TemplateError,
    compile_template,
)

__all__ = [
    "GRADER_NAMES",
    "PROMPT_NAMES",
    "BatchOutcome",
    "BuiltinGrader",
    "Criterion",
    "EmbeddingJudge",
    "ExtractionMiss",
    "Extractor",
    "Formula",
    "FormulaError",
    "GradeOutcome",
    "GraderTemplate",
    "MissingLibrary",
    "ModelJudge",
    "MultiGrader",
    "PromptTemplate",
    "SampleUpdate",
    "TaskAggregate",
    "TemplateError",
    "apply_stop",
    "capped_repr",
    "compile_template",
    "invalid",
    "is_score",
    "merge_outcomes",
    "parse_output_json",
    "pass_counts",
    "validate_batch_return",
    "validate_return",
]
