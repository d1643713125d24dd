"""EvalSuite and EvalRun specs: paths in messages, unique ids, models, providers, credentials."""

from __future__ import annotations

from typing import Any

import pytest

from evalkube.models import (
    EvalRun,
    EvalRunSpec,
    EvalSuite,
    EvalSuiteSpec,
    SpecError,
    format_validation_error,
    validate_spec,
)
from evalkube.models.errors import format_path

GRADER = {"type": "python", "source": "def grade(s, i): return 1"}


def task(task_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": task_id, "dataset": {"rows": [{"a": 1}]}, "grader": dict(GRADER), **fields}


def suite_doc(*tasks: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "s"},
        "spec": {"tasks": list(tasks)},
    }


def problems(model: type, data: Any, prefix: str = "spec") -> list[str]:
    with pytest.raises(SpecError) as info:
        validate_spec(model, data, prefix=prefix)
    return info.value.problems


# -- paths --------------------------------------------------------------------------------------


def test_error_names_the_exact_path() -> None:
    doc = suite_doc(task("a"), task("b"), task("c", grader={**GRADER, "timeoutSeconds": 0}))
    assert problems(EvalSuite, doc, prefix="") == [
        "spec.tasks[2].grader.timeoutSeconds: must be between 1 and 600 (got 0)"
    ]


def test_error_path_with_snake_case_input_is_spelled_camel_case() -> None:
    doc = suite_doc(task("a", grader={**GRADER, "timeout_seconds": 601}))
    assert problems(EvalSuite, doc, prefix="") == [
        "spec.tasks[0].grader.timeoutSeconds: must be between 1 and 600 (got 601)"
    ]


def test_spec_only_document_uses_the_prefix() -> None:
    data = {"tasks": [task("a", grader={**GRADER, "maxModelCalls": 501})]}
    assert problems(EvalSuiteSpec, data) == [
        "spec.tasks[0].grader.maxModelCalls: must be between 0 and 500 (got 501)"
    ]


@pytest.mark.parametrize(
    ("where", "patch", "expected"),
    [
        ("task", {"bogus": 1}, "spec.tasks[0].bogus"),
        ("task", {"few_shots": []}, "spec.tasks[0].few_shots"),
        ("dataset", {"idFeild": "id"}, "spec.tasks[0].dataset.idFeild"),
        ("grader", {"metricsId": "x"}, "spec.tasks[0].grader.metricsId"),
        (
            "extraction",
            {"type": "regex", "pattern": "x", "flags": "i"},
            "spec.tasks[0].extraction.flags",
        ),
    ],
)
def test_unknown_fields_are_rejected_by_name(
    where: str, patch: dict[str, Any], expected: str
) -> None:
    t = task("a")
    if where == "task":
        t.update(patch)
    elif where == "dataset":
        t["dataset"].update(patch)
    elif where == "grader":
        t["grader"].update(patch)
    else:
        t["extraction"] = patch
    assert problems(EvalSuite, suite_doc(t), prefix="") == [
        f"{expected}: unknown field; remove it or check its spelling"
    ]


def test_unknown_top_level_field() -> None:
    doc = {**suite_doc(task("a")), "sepc": {}}
    assert problems(EvalSuite, doc, prefix="") == [
        "sepc: unknown field; remove it or check its spelling"
    ]


def test_missing_required_fields_are_named() -> None:
    assert problems(EvalSuiteSpec, {"tasks": [{"id": "a"}]}) == [
        "spec.tasks[0].dataset: required field is missing",
    ]


def test_a_task_without_grader_or_graders_says_which_to_set() -> None:
    bare = {"id": "a", "dataset": {"rows": [{}]}}
    assert problems(EvalSuiteSpec, {"tasks": [bare]}) == [
        "spec.tasks[0]: set exactly one of `grader` or `graders` (a list of criteria)"
    ]


GRADE = {"type": "python", "source": "def grade(sample, item):\n    return 1.0\n"}


@pytest.mark.parametrize(
    ("graders", "message"),
    [
        ([GRADE], "graders[0].name is required: it names the criterion"),
        ([{**GRADE, "name": "a"}, {**GRADE, "name": "a"}], "graders[1].name 'a' is used twice"),
        (
            [{**GRADE, "name": "a"}, {**GRADE, "name": "b", "metricId": "a"}],
            "graders[1].metricId 'a' is used by another criterion",
        ),
        (
            [{**GRADE, "name": "a"}, {**GRADE, "name": "b", "contract": "batch"}],
            "graders[1]: grade_batch graders cannot share a task",
        ),
    ],
)
def test_graders_list_errors(graders: list[dict[str, Any]], message: str) -> None:
    task = {"id": "a", "dataset": {"rows": [{}]}, "graders": graders}
    (problem,) = problems(EvalSuiteSpec, {"tasks": [task]})
    assert problem.startswith("spec.tasks[0]: ")
    assert message in problem


def test_criteria_name_their_metric_and_keep_a_threshold() -> None:
    task = {
        "id": "a",
        "dataset": {"rows": [{}]},
        "graders": [
            {**GRADE, "name": "exact", "passThreshold": 1},
            {**GRADE, "name": "fuzzy", "metricId": "ratio", "pass_threshold": 0.8},
        ],
    }
    spec = validate_spec(EvalSuiteSpec, {"tasks": [task]})
    assert [(g.metric_id, g.pass_threshold) for g in spec.tasks[0].criteria] == [
        ("exact", 1.0),
        ("ratio", 0.8),
    ]
    assert spec.tasks[0].grader_programs()[1][0] == "graders[1]"


def test_chat_message_errors_name_the_message_not_the_union_branch() -> None:
    bad_role = task(
        "a", prompt=[{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]
    )
    assert problems(EvalSuiteSpec, {"tasks": [bad_role]}) == [
        "spec.tasks[0].prompt[1].role: must be one of 'system', 'developer', 'user' or "
        "'assistant' (got 'robot')"
    ]
    extra = task("a", prompt=[{"role": "user", "content": "x", "name": "n"}])
    assert problems(EvalSuiteSpec, {"tasks": [extra]}) == [
        "spec.tasks[0].prompt[0].name: unknown field; remove it or check its spelling"
    ]


def test_format_path() -> None:
    assert format_path(("spec", "tasks", 2, "timeout_seconds")) == "spec.tasks[2].timeoutSeconds"
    assert format_path(("tasks", 0), prefix="spec") == "spec.tasks[0]"
    assert format_path(()) == "(root)"


def test_format_validation_error_deduplicates() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        EvalSuiteSpec.model_validate({"tasks": [task("a", bogus=1)]})
    assert format_validation_error(EvalSuiteSpec, info.value, "spec") == [
        "spec.tasks[0].bogus: unknown field; remove it or check its spelling"
    ]


# -- suite rules --------------------------------------------------------------------------------


def test_task_ids_must_be_unique() -> None:
    assert problems(EvalSuiteSpec, {"tasks": [task("a"), task("b"), task("a")]}) == [
        "spec: task id 'a' is used twice; task ids must be unique"
    ]


def test_at_least_one_task() -> None:
    (problem,) = problems(EvalSuiteSpec, {"tasks": []})
    assert problem.startswith("spec.tasks: ")


@pytest.mark.parametrize("task_id", ["Upper", "-lead", "trail-", "sp ace", "x" * 64, ""])
def test_task_id_format(task_id: str) -> None:
    (problem,) = problems(EvalSuiteSpec, {"tasks": [task(task_id)]})
    assert problem.startswith("spec.tasks[0].id: ")


@pytest.mark.parametrize("task_id", ["a", "exact_match", "t-1.v2", "x" * 63])
def test_task_id_accepted(task_id: str) -> None:
    assert validate_spec(EvalSuiteSpec, {"tasks": [task(task_id)]}).tasks[0].id == task_id


@pytest.mark.parametrize(
    "dataset",
    [
        {},
        {"rows": [], "path": "d.jsonl"},
        {"path": "d.jsonl", "configMapRef": {"name": "c", "key": "k"}},
    ],
)
def test_dataset_needs_exactly_one_source(dataset: dict[str, Any]) -> None:
    assert problems(EvalSuiteSpec, {"tasks": [task("a", dataset=dataset)]}) == [
        "spec.tasks[0].dataset: set exactly one of `rows`, `path`, `configMapRef` or `uri`"
    ]


@pytest.mark.parametrize(
    ("extraction", "message"),
    [
        ({"type": "regex"}, "`pattern` is required when type is `regex`"),
        ({"type": "json"}, "`field` is required when type is `json`"),
    ],
)
def test_extraction_parameters(extraction: dict[str, Any], message: str) -> None:
    assert problems(EvalSuiteSpec, {"tasks": [task("a", extraction=extraction)]}) == [
        f"spec.tasks[0].extraction: {message}"
    ]


def test_outputs_need_exactly_one_of_column_or_path() -> None:
    assert problems(EvalSuiteSpec, {"tasks": [task("a", outputs={})]}) == [
        "spec.tasks[0].outputs: set exactly one of `column`, `path` or `uri`"
    ]


def test_task_snake_and_camel_spellings() -> None:
    camel = task(
        "a",
        fewShot=[{"q": 1}],
        outputs={"column": "o", "extractedColumn": "e"},
        extraction={"type": "choice", "ignoreCase": True},
    )
    camel["dataset"]["idField"] = "id"
    snake = task(
        "a",
        few_shot=[{"q": 1}],
        outputs={"column": "o", "extracted_column": "e"},
        extraction={"type": "choice", "ignore_case": True},
    )
    snake["dataset"]["id_field"] = "id"
    a = validate_spec(EvalSuiteSpec, {"tasks": [camel]})
    b = validate_spec(EvalSuiteSpec, {"tasks": [snake]})
    assert a == b
    assert a.tasks[0].extraction.ignore_case is True
    assert a.tasks[0].dataset.id_field == "id"


def test_task_defaults() -> None:
    spec = validate_spec(EvalSuiteSpec, {"tasks": [task("a")]}).tasks[0]
    assert spec.extraction.type == "none"
    assert spec.stop == []
    assert spec.few_shot == []
    assert spec.metrics is None
    assert spec.prompt is None


# -- runs ---------------------------------------------------------------------------------------


def run_spec(**fields: Any) -> EvalRunSpec:
    return validate_spec(EvalRunSpec, fields, prefix="run.spec")


def test_run_defaults() -> None:
    spec = run_spec(models=["precomputed"])
    # unset: the operator's EVALKUBE_SHARD_SIZE in a cluster (pinned into the snapshot), and
    # 10,000 rows for `evalkube run` (engine.driver.plan_run)
    assert spec.shard_size is None
    assert spec.generation.concurrency == 8
    assert spec.generation.retries == 4
    assert spec.providers == {}


@pytest.mark.parametrize(
    "models",
    [
        ["precomputed"],
        ["precomputed:gpt-a"],
        ["openai:gpt-4.1-mini"],
        ["openai:gpt-4.1-mini", "local_vllm:meta/llama-3:8b"],
        ["local:model"],
    ],
)
def test_model_ids_accepted(models: list[str]) -> None:
    providers = {
        "openai": {"baseURL": "https://api.openai.com/v1"},
        "local_vllm": {"baseURL": "http://127.0.0.1:8000/v1"},
    }
    assert run_spec(models=models, providers=providers).models == models


@pytest.mark.parametrize("model", ["GPT-4", "openai:", ":gpt", "open ai:x", "-x:y", ""])
def test_model_ids_rejected(model: str) -> None:
    assert problems(EvalRunSpec, {"models": [model]}, "run.spec") == [
        f"run.spec.models: model {model!r} is not `provider:model` (or `precomputed[:label]`)"
    ]


def test_models_unique_and_not_empty() -> None:
    assert problems(EvalRunSpec, {"models": ["precomputed", "precomputed"]}, "run.spec") == [
        "run.spec.models: models must be unique"
    ]
    (problem,) = problems(EvalRunSpec, {"models": []}, "run.spec")
    assert problem.startswith("run.spec.models: ")


def test_undeclared_provider_of_a_model() -> None:
    assert problems(EvalRunSpec, {"models": ["openai:gpt-4"]}, "run.spec") == [
        "run.spec: models: provider 'openai' of 'openai:gpt-4' is not declared in `providers`; "
        "add providers.openai.baseURL"
    ]


@pytest.mark.parametrize(
    ("field", "shown"), [("judgeModel", "judgeModel"), ("embedding_model", "embeddingModel")]
)
def test_undeclared_provider_of_judge_and_embedding_models(field: str, shown: str) -> None:
    (problem,) = problems(EvalRunSpec, {"models": ["precomputed"], field: "acme:x"}, "run.spec")
    assert problem.startswith(f"run.spec: {shown}: provider 'acme' of 'acme:x' is not declared")


@pytest.mark.parametrize("header", ["Authorization", "authorization", "X-Api-Key", "api-key"])
def test_credentials_in_headers_are_rejected(header: str) -> None:
    data = {
        "models": ["openai:x"],
        "providers": {"openai": {"baseURL": "http://x", "headers": {header: "secret"}}},
    }
    found = problems(EvalRunSpec, data, "run.spec")
    assert found == [
        f"run.spec.providers.openai.headers: header {header!r} carries credentials; "
        "use credentialsSecretRef or apiKeyEnv"
    ]
    assert "secret" not in found[0]


def test_other_headers_are_fine() -> None:
    spec = run_spec(
        models=["openai:x"],
        providers={"openai": {"baseURL": "http://x", "headers": {"OpenAI-Organization": "o"}}},
    )
    assert spec.providers["openai"].headers == {"OpenAI-Organization": "o"}


def test_provider_base_url_spellings() -> None:
    for key in ("baseURL", "base_url"):
        spec = run_spec(models=["p:x"], providers={"p": {key: "http://h/v1"}})
        assert spec.providers["p"].base_url == "http://h/v1"
        assert spec.to_wire()["providers"]["p"]["baseURL"] == "http://h/v1"


def test_provider_names_are_not_camelized_in_messages() -> None:
    found = problems(EvalRunSpec, {"models": ["my_llm:x"], "providers": {"my_llm": {}}}, "run.spec")
    assert found == ["run.spec.providers.my_llm.baseURL: required field is missing"]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"shardSize": 0}, "spec.shardSize: must be between 1 and 1000000 (got 0)"),
        (
            {"generation": {"temperature": 3}},
            "spec.generation.temperature: must be between 0 and 2 (got 3)",
        ),
        (
            {"generation": {"concurrency": 0}},
            "spec.generation.concurrency: must be between 1 and 256 (got 0)",
        ),
        (
            {"generation": {"retries": 21}},
            "spec.generation.retries: must be between 0 and 20 (got 21)",
        ),
    ],
)
def test_run_ranges(fields: dict[str, Any], expected: str) -> None:
    doc = {"metadata": {"name": "r"}, "spec": {"models": ["precomputed"], **fields}}
    assert problems(EvalRun, doc, prefix="") == [expected]


def test_shard_size_both_spellings() -> None:
    assert run_spec(models=["precomputed"], shardSize=7).shard_size == 7
    assert run_spec(models=["precomputed"], shard_size=7).shard_size == 7


def test_eval_run_kind_and_api_version() -> None:
    doc = {"kind": "EvalSuite", "metadata": {"name": "r"}, "spec": {"models": ["precomputed"]}}
    (problem,) = problems(EvalRun, doc, prefix="")
    assert problem.startswith("kind: must be one of 'EvalRun'")


MESSAGES = [{"role": "user", "content": "{{ sample.output_text }}"}]


@pytest.mark.parametrize(
    ("grader", "message"),
    [
        ({"type": "score_model", "input": "text"}, "`input` of a model grader is a list"),
        ({"type": "score_model", "input": MESSAGES, "range": [1, 0]}, "min < max"),
        ({"type": "score_model", "input": MESSAGES, "labels": ["a"]}, "`labels` is not a field"),
        (
            {"type": "label_model", "input": MESSAGES, "labels": ["a"], "passingLabels": ["b"]},
            "`passingLabels` ['b'] are not among `labels`",
        ),
        ({"type": "label_model", "input": MESSAGES, "labels": ["a"]}, "`passingLabels` is"),
        ({"type": "string_check", "input": MESSAGES, "reference": "r", "operation": "eq"},
         "`input` of a string_check grader is a template string"),
    ],
)  # fmt: skip
def test_model_grader_fields(grader: dict[str, Any], message: str) -> None:
    task = {"id": "a", "dataset": {"rows": [{}]}, "grader": grader}
    (problem,) = problems(EvalSuiteSpec, {"tasks": [task]})
    assert message in problem
