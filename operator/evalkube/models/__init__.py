"""Pydantic specs and statuses: the single source of truth for the CRDs and the CLI files."""

from evalkube.models.errors import ConfigError, SpecError, format_validation_error, validate_spec
from evalkube.models.gate import BaselineSpec, GateCheck, GateSpec, GateStatus, ThresholdSpec
from evalkube.models.grader import GraderSpec, PreprocessSpec
from evalkube.models.meta import ObjectMeta
from evalkube.models.refs import ConfigMapKeyRef, SecretKeyRef
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
from evalkube.models.storage import S3StorageSpec, StorageSpec
from evalkube.models.suite import (
    DatasetSpec,
    EvalSuite,
    EvalSuiteSpec,
    ExtractionSpec,
    Message,
    OutputsSpec,
    TaskSpec,
)
from evalkube.models.tracking import MlflowTrackingSpec, TrackingSpec

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
    "MlflowTrackingSpec",
    "ObjectMeta",
    "OutputsSpec",
    "PreprocessSpec",
    "ProviderSpec",
    "RunReference",
    "RunTemplate",
    "S3StorageSpec",
    "SampleCounts",
    "SecretKeyRef",
    "SpecError",
    "StorageSpec",
    "SuiteRef",
    "TaskModelResult",
    "TaskSpec",
    "ThresholdSpec",
    "TrackingSpec",
    "format_validation_error",
    "validate_spec",
]
