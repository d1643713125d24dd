"""`import_openai`: every declared field is carried or named, every wrong shape names its field.

The exports are built from tests/fixtures/openai_eval_export.json (the shapes OpenAI's Evals
API returned) with one part changed per test.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from evalkube.local.openai_import import COSINE_MODEL, import_openai
from evalkube.models.errors import ConfigError

EXPORT = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "openai_eval_export.json").read_text()
)
FUZZY = {
    "type": "text_similarity",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "evaluation_metric": "fuzzy_match",
}


def export(**changes: Any) -> dict[str, Any]:
    """The fixture with ``changes`` applied: ``{"eval.name": "x", ...}`` by dotted path."""
    doc = copy.deepcopy(EXPORT)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return doc


def refused(doc: Any) -> str:
    with pytest.raises(ConfigError) as info:
        import_openai(doc)
    return str(info.value)


CRITERION = "eval.testing_criteria.0"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([EXPORT], "the export: expected"),
        ({"eval": [], "run": {}}, "eval: expected the eval object (an object), got list"),
        (export(**{"eval.testing_criteria": {"a": 1}}), "eval.testing_criteria: expected a list"),
        (export(**{CRITERION: "string_check"}), "eval.testing_criteria[0]: expected a criterion"),
        (export(**{"eval.data_source_config": "custom"}), "eval.data_source_config: expected an"),
        (
            export(**{"eval.data_source_config.item_schema": ["question"]}),
            "eval.data_source_config.item_schema: expected a JSON Schema object",
        ),
        (
            export(**{"run.data_source.sampling_params": [0.1]}),
            "run.data_source.sampling_params: expected an object",
        ),
        (
            export(**{"run.data_source.sampling_params.logprobs": True}),
            "run.data_source.sampling_params.logprobs: not a sampling parameter",
        ),
        (
            export(**{"run.data_source.source.content": {"item": {}}}),
            "run.data_source.source.content: expected a list of lines",
        ),
        (
            export(**{"run.data_source.source.content.0": ["Say Paris"]}),
            "run.data_source.source.content[0]: expected",
        ),
        (
            export(
                **{"run.data_source.input_messages.template.1.content": {"type": "input_image"}}
            ),
            "run.data_source.input_messages.template[1].content: content of type 'input_image'",
        ),
        (
            export(**{"run.data_source.type": "stored_completions"}),
            "run.data_source.type: 'stored_completions'; supported: completions, responses, jsonl",
        ),
        (
            export(
                **{
                    CRITERION: {
                        "type": "multi",
                        "name": "m",
                        "graders": ["x"],
                        "calculate_output": "x",
                    }
                }
            ),
            "eval.testing_criteria[0].graders: expected an object of named graders",
        ),
        (
            export(
                **{
                    CRITERION: {
                        "type": "multi",
                        "name": "m",
                        "graders": {"x": FUZZY},
                        "calculate_output": "x + y",
                    }
                }
            ),
            "unknown name `y`; use the graders: x",
        ),
        (
            export(**{"eval.testing_criteria.0.input": "{{ smple.output_text }}"}),
            "eval.testing_criteria[0].input: unknown name(s) `smple`",
        ),
        (
            export(**{"eval.testing_criteria.0.reference": "{{ item.answr }}"}),
            "eval.testing_criteria[0].reference: `item.answr` is not in item 0",
        ),
        (
            export(**{"run.data_source.input_messages.template.1.content": "{{ sample.x }}"}),
            "run.data_source.input_messages.template[1].content: `sample` is not available here",
        ),
        (
            export(**{"run.data_source.input_messages.template.1.content": "{{ item.q }}"}),
            "run.data_source.input_messages.template[1].content: `item.q` is not in item 0",
        ),
        (
            export(**{"eval.testing_criteria.0.input": "{{ sample.output_json.city }}"}),
            "`sample.output_json` exists only when the run asks for structured output",
        ),
        (
            export(**{"eval.testing_criteria.0.input": "{{ sample.extracted_output }}"}),
            "`sample.extracted_output` is not in OpenAI's sample namespace",
        ),
        (
            export(**{"eval.testing_criteria.2.pass_threshold": 1.5}),
            "eval.testing_criteria[2].pass_threshold: 1.5 is outside the text_similarity score "
            "range (0.0, 1.0]: no sample could pass",
        ),
        (
            export(
                **{
                    CRITERION: {
                        "type": "score_model",
                        "name": "s",
                        "model": "gpt-4.1",
                        "input": [{"role": "user", "content": "x"}],
                        "range": [1, 7],
                        "pass_threshold": 0.5,
                    }
                }
            ),
            "pass_threshold: 0.5 is outside the score_model score range (1.0, 7.0]",
        ),
        (
            export(**{"eval.testing_criteria.0.ignore_case": True}),
            "eval.testing_criteria[0].ignore_case: not a field evalkube can carry",
        ),
        (
            export(**{"eval.testing_criteria.1.source": "def grade(sample, item) return 1"}),
            "eval.testing_criteria[1].source",
        ),
    ],
)
def test_a_malformed_export_is_refused_naming_the_field(doc: Any, message: str) -> None:
    assert message in refused(doc)


def test_every_sampling_parameter_reaches_the_runs_generation() -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "strict": True}}
    doc = export(**{"run.data_source.sampling_params": {
        "temperature": 0.2, "max_completions_tokens": 50, "top_p": 0.9, "seed": 7,
        "reasoning_effort": "high", "response_format": fmt, "tools": tools,
    }})  # fmt: skip
    generation = import_openai(doc).run.spec.generation
    assert (generation.temperature, generation.max_output_tokens) == (0.2, 50)
    assert (generation.top_p, generation.seed, generation.reasoning_effort) == (0.9, 7, "high")
    assert generation.response_format == fmt
    assert generation.tools == tools


def test_a_responses_run_carries_text_format_and_tools() -> None:
    doc = export(**{"run.data_source.type": "responses",
                    "run.data_source.sampling_params": {
                        "text": {"format": {"type": "json_schema", "name": "a", "schema": {}}},
                        "tools": [{"type": "function", "name": "f", "parameters": {}}],
                    }})  # fmt: skip
    generation = import_openai(doc).run.spec.generation
    assert generation.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": {}},
    }
    assert generation.tools == [{"type": "function", "name": "f", "parameters": {}}]


def test_a_cosine_criterion_gets_openais_embedding_model() -> None:
    cosine = {**FUZZY, "name": "cos", "evaluation_metric": "cosine", "pass_threshold": 0.8}
    run = import_openai(export(**{CRITERION: cosine})).run
    assert run.spec.embedding_model == COSINE_MODEL == "openai:text-embedding-3-large"


def test_multi_graders_whose_names_sanitize_alike_are_both_kept() -> None:
    multi = {
        "type": "multi",
        "name": "both",
        "graders": {"a b": FUZZY, "a_b": {**FUZZY, "evaluation_metric": "rouge_1"}},
        "calculate_output": "0.5 * a_b",
    }
    criteria = import_openai(export(**{CRITERION: multi})).suite.spec.tasks[0].criteria
    (grader,) = [g for g in criteria if g.type == "multi"]
    assert grader.graders is not None
    assert sorted(grader.graders) == ["a_b", "a_b_2"]
    assert grader.graders["a_b_2"].evaluation_metric == "rouge_1"
    assert grader.calculate_output == "0.5 * a_b_2"  # the formula follows its grader


def test_a_jsonl_run_imports_as_precomputed_outputs() -> None:
    lines = [
        {"item": {"question": "Say Paris", "answer": "Paris"},
         "sample": {"output_text": "Paris", "output_tools": []}},
        {"item": {"question": "Say Rome", "answer": "Rome"},
         "sample": {"choices": [{"index": 0,
                                 "message": {"role": "assistant", "content": "Milan"}}]}},
    ]  # fmt: skip
    source = {"type": "file_content", "content": lines}
    doc = export(**{"run.data_source": {"type": "jsonl", "source": source}})
    imported = import_openai(doc)
    (task,) = imported.suite.spec.tasks
    assert imported.run.spec.models == ["precomputed"]
    assert task.outputs is not None
    assert task.outputs.path == "outputs.jsonl"
    assert task.dataset.rows == [line["item"] for line in lines]
    assert imported.outputs == [
        {"id": "0", "output_text": "Paris", "output_tools": []},
        {"id": "1", "output_text": "Milan", "choices": lines[1]["sample"]["choices"]},
    ]


def test_items_keep_every_field_and_graders_see_them_openai_style() -> None:
    imported = import_openai(EXPORT)
    (task,) = imported.suite.spec.tasks
    assert task.grader_inputs == "openai"
    assert task.dataset.rows == [
        line["item"] for line in EXPORT["run"]["data_source"]["source"]["content"]
    ]
    assert imported.run.spec.generation.seed == 42
    assert imported.run.spec.generation.top_p == 1
