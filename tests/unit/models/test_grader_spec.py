"""GraderSpec and PreprocessSpec: every field of docs/graders.md with its range and default."""

from __future__ import annotations

from typing import Any

import pytest

from evalkube.models import GraderSpec, PreprocessSpec, SpecError, validate_spec


def grader(**fields: Any) -> GraderSpec:
    return validate_spec(
        GraderSpec, {"type": "python", "source": "def grade(s, i): return 1", **fields}
    )


def problems(model: type, data: Any, prefix: str = "grader") -> list[str]:
    with pytest.raises(SpecError) as info:
        validate_spec(model, data, prefix=prefix)
    return info.value.problems


SRC = {"type": "python", "source": "x"}


# -- defaults -----------------------------------------------------------------------------------


def test_defaults() -> None:
    spec = grader()
    assert spec.contract == "sample"
    assert spec.execution is None
    assert spec.model_access is None
    assert spec.metric_id == "score"
    assert spec.timeout_seconds == 120
    assert spec.max_model_calls == 64
    assert spec.resolved_execution == "per_sample"
    assert spec.resolved_model_access == "none"
    assert spec.entrypoint == "grade"


@pytest.mark.parametrize(
    ("contract", "execution", "access", "entrypoint"),
    [
        ("sample", "per_sample", "none", "grade"),
        ("batch", "aggregate", "none", "grade_batch"),
        ("model_backed", "per_sample", "gateway", "grade"),
    ],
)
def test_execution_and_model_access_derived_from_contract(
    contract: str, execution: str, access: str, entrypoint: str
) -> None:
    spec = grader(contract=contract)
    assert spec.resolved_execution == execution
    assert spec.resolved_model_access == access
    assert spec.entrypoint == entrypoint


def test_explicit_execution_overrides_the_contract() -> None:
    spec = grader(contract="batch", execution="per_sample")
    assert spec.resolved_execution == "per_sample"
    assert spec.entrypoint == "grade"
    spec = grader(contract="sample", execution="aggregate")
    assert spec.resolved_execution == "aggregate"
    assert spec.entrypoint == "grade_batch"


def test_explicit_model_access_overrides_the_contract() -> None:
    assert grader(contract="model_backed", modelAccess="none").resolved_model_access == "none"
    assert grader(contract="sample", modelAccess="gateway").resolved_model_access == "gateway"


@pytest.mark.parametrize("key", ["modelAccess", "model_access"])
def test_mka1_is_a_synonym_of_gateway(key: str) -> None:
    spec = grader(**{key: "mka1"})
    assert spec.model_access == "gateway"
    assert spec.resolved_model_access == "gateway"
    assert spec.to_wire()["modelAccess"] == "gateway"


# -- ranges -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 2, 120, 599, 600])
def test_timeout_in_range(value: int) -> None:
    assert grader(timeoutSeconds=value).timeout_seconds == value


@pytest.mark.parametrize("value", [0, -1, 601, 10_000])
def test_timeout_out_of_range(value: int) -> None:
    assert problems(GraderSpec, {**SRC, "timeoutSeconds": value}) == [
        f"grader.timeoutSeconds: must be between 1 and 600 (got {value})"
    ]


@pytest.mark.parametrize("value", [0, 1, 64, 500])
def test_max_model_calls_in_range(value: int) -> None:
    assert grader(maxModelCalls=value).max_model_calls == value


@pytest.mark.parametrize("value", [-1, 501])
def test_max_model_calls_out_of_range(value: int) -> None:
    assert problems(GraderSpec, {**SRC, "max_model_calls": value}) == [
        f"grader.maxModelCalls: must be between 0 and 500 (got {value})"
    ]


def test_timeout_must_be_an_integer() -> None:
    (problem,) = problems(GraderSpec, {**SRC, "timeoutSeconds": 1.5})
    assert problem.startswith("grader.timeoutSeconds: ")
    (problem,) = problems(GraderSpec, {**SRC, "timeoutSeconds": "soon"})
    assert problem.startswith("grader.timeoutSeconds: ")


def test_metric_id_must_not_be_empty() -> None:
    (problem,) = problems(GraderSpec, {**SRC, "metricId": ""})
    assert problem.startswith("grader.metricId: ")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        (
            "type",
            "javascript",
            "grader.type: must be one of 'python', 'string_check', 'text_similarity', "
            "'multi', 'score_model' or 'label_model' (got 'javascript')",
        ),
        (
            "contract",
            "pairwise",
            "grader.contract: must be one of 'sample', 'batch' or 'model_backed' (got 'pairwise')",
        ),
        (
            "execution",
            "parallel",
            "grader.execution: must be one of 'per_sample' or 'aggregate' (got 'parallel')",
        ),
        (
            "modelAccess",
            "internet",
            "grader.modelAccess: must be one of 'gateway', 'none' or 'mka1' (got 'internet')",
        ),
    ],
)
def test_enumerations(field: str, value: str, expected: str) -> None:
    assert problems(GraderSpec, {**SRC, field: value}) == [expected]


def test_type_is_required() -> None:
    assert problems(GraderSpec, {"source": "x"}) == ["grader.type: required field is missing"]


# -- source / file ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["file", "fileId", "file_id"])
def test_file_and_its_aliases(key: str) -> None:
    spec = validate_spec(GraderSpec, {"type": "python", key: "graders/g.py"})
    assert spec.file == "graders/g.py"
    assert spec.source is None
    assert spec.to_wire()["file"] == "graders/g.py"


def test_source_inline() -> None:
    spec = grader()
    assert spec.source is not None
    assert spec.file is None


def test_neither_source_nor_file() -> None:
    assert problems(GraderSpec, {"type": "python"}) == [
        "grader: set exactly one of `source` (inline Python) or `file`"
    ]


@pytest.mark.parametrize("key", ["file", "fileId", "file_id"])
def test_both_source_and_file(key: str) -> None:
    assert problems(GraderSpec, {"type": "python", "source": "x", key: "g.py"}) == [
        "grader: set exactly one of `source` (inline Python) or `file`"
    ]


def test_empty_source_still_counts_as_given() -> None:
    assert validate_spec(GraderSpec, {"type": "python", "source": ""}).source == ""


# -- spelling -----------------------------------------------------------------------------------


def test_camel_case_and_snake_case_are_both_accepted() -> None:
    camel = validate_spec(
        GraderSpec,
        {
            "type": "python",
            "source": "x",
            "metricId": "m",
            "timeoutSeconds": 5,
            "maxModelCalls": 3,
            "modelAccess": "gateway",
        },
    )
    snake = validate_spec(
        GraderSpec,
        {
            "type": "python",
            "source": "x",
            "metric_id": "m",
            "timeout_seconds": 5,
            "max_model_calls": 3,
            "model_access": "gateway",
        },
    )
    assert camel == snake
    assert camel.to_wire() == {
        "type": "python",
        "source": "x",
        "contract": "sample",
        "metricId": "m",
        "timeoutSeconds": 5,
        "maxModelCalls": 3,
        "modelAccess": "gateway",
    }


def test_wire_form_round_trips() -> None:
    spec = grader(contract="batch", metricId="f1", timeoutSeconds=30)
    assert validate_spec(GraderSpec, spec.to_wire()) == spec


@pytest.mark.parametrize("unknown", ["metricsId", "timeout", "timeout_secs", "language"])
def test_unknown_fields_are_rejected_by_name(unknown: str) -> None:
    assert problems(GraderSpec, {**SRC, unknown: 1}) == [
        f"grader.{unknown}: unknown field; remove it or check its spelling"
    ]


def test_several_problems_are_all_reported() -> None:
    found = problems(GraderSpec, {**SRC, "timeoutSeconds": 0, "maxModelCalls": 900, "x": 1})
    assert found == [
        "grader.timeoutSeconds: must be between 1 and 600 (got 0)",
        "grader.maxModelCalls: must be between 0 and 500 (got 900)",
        "grader.x: unknown field; remove it or check its spelling",
    ]


def test_spec_error_message_joins_problems_and_names_the_source() -> None:
    with pytest.raises(SpecError) as info:
        validate_spec(GraderSpec, {"type": "python"}, prefix="g", source="suite.yaml")
    assert str(info.value) == "suite.yaml: g: set exactly one of `source` (inline Python) or `file`"


# -- preprocessors ------------------------------------------------------------------------------


def test_preprocess_defaults_and_entrypoints() -> None:
    spec = validate_spec(PreprocessSpec, {"type": "python", "source": "x"})
    assert spec.contract == "sample"
    assert spec.entrypoint == "transform"
    assert spec.timeout_seconds == 120
    batch = validate_spec(PreprocessSpec, {"type": "python", "file": "p.py", "contract": "batch"})
    assert batch.entrypoint == "transform_batch"


def test_preprocess_has_no_model_backed_contract() -> None:
    (problem,) = problems(
        PreprocessSpec, {"type": "python", "source": "x", "contract": "model_backed"}, "pre"
    )
    assert problem.startswith("pre.contract: must be one of 'sample' or 'batch'")


def test_preprocess_timeout_range() -> None:
    assert problems(
        PreprocessSpec, {"type": "python", "source": "x", "timeoutSeconds": 601}, "pre"
    ) == ["pre.timeoutSeconds: must be between 1 and 600 (got 601)"]


@pytest.mark.parametrize("field", ["timeoutSeconds", "maxModelCalls"])
def test_bools_are_not_counts(field: str) -> None:
    """`timeoutSeconds: true` must not silently become 1 second."""
    with pytest.raises(SpecError, match=f"grader.{field}"):
        validate_spec(GraderSpec, {"type": "python", "source": "x", field: True}, prefix="grader")
