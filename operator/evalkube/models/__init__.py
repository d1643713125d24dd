"""Pydantic specs and statuses: the single source of truth for the CRDs and the CLI files."""

from evalkube.models.errors import ConfigError, SpecError, format_validation_error, validate_spec
from evalkube.models.gate import BaselineSpec, GateCheck, GateSpec, GateStatus, ThresholdSpec
from evalkube.models.grader import GraderSpec, PreprocessSpec
from evalkube.models.meta import ObjectMeta
from evalkube.models.run import (
    PRECOMPUTED,
    Condition,
    CriterionCounts,
    EvalRun,
    EvalRunSpec,
    EvalRunStatus,
    GenerationSpec,
    ProviderSpec,
    SampleCounts,
    SecretKeyRef,
    SuiteRef,
    TaskModelResult,
)
from evalkube.models.schedule import (
    EvalSchedule,
    EvalScheduleSpec,
    EvalScheduleStatus,
    RunReference,
    RunTemplate,
)
from evalkube.models.suite import (
    ConfigMapKeyRef,
    DatasetSpec,
    EvalSuite,
    EvalSuiteSpec,
    ExtractionSpec,
    Message,
    OutputsSpec,
    TaskSpec,
)

__all__ = [
    "PRECOMPUTED",
    "BaselineSpec",
    "Condition",
    "ConfigError",
    "ConfigMapKeyRef",
    "CriterionCounts",
    "DatasetSpec",
    "EvalRun",
    "EvalRunSpec",
    "EvalRunStatus",
    "EvalSchedule",
    "EvalScheduleSpec",
    "EvalScheduleStatus",
    "EvalSuite",
    "EvalSuiteSpec",
    "ExtractionSpec",
    "GateCheck",
    "GateSpec",
    "GateStatus",
    "GenerationSpec",
    "GraderSpec",
    "Message",
    "ObjectMeta",
    "OutputsSpec",
    "PreprocessSpec",
    "ProviderSpec",
    "RunReference",
    "RunTemplate",
    "SampleCounts",
    "SecretKeyRef",
    "SpecError",
    "SuiteRef",
    "TaskModelResult",
    "TaskSpec",
    "ThresholdSpec",
    "format_validation_error",
    "validate_spec",
]
