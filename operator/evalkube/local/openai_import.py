"""``evalkube import openai``: an exported OpenAI eval (+ run) -> EvalSuite and EvalRun.

Reads what OpenAI's Evals API returned for an eval (``data_source_config`` with its
``item_schema``, ``testing_criteria``) and for one of its runs (``data_source``), in one JSON
file ``{"eval": {...}, "run": {...}}``. The run's data source (items, the prompt, the model and
every sampling parameter, or stored samples to grade) is read by
:mod:`evalkube.local.openai_source`. Every shape is checked and a wrong one names its field;
the result is checked as a run would check it (the models, the criteria's templates and
formulas compiled, every template's fields against every item, thresholds against ranges), so
an import that succeeds runs. Nothing declared is dropped silently: what has no equivalent
stops the import, naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evalkube.engine.runtime import builtin_criterion
from evalkube.engine.validate import check_source
from evalkube.grading import (
    PROMPT_NAMES,
    FormulaError,
    MissingLibrary,
    TemplateError,
    compile_template,
)
from evalkube.grading.template_fields import field_paths, missing, spelled
from evalkube.local.openai_source import RunSource, read_run
from evalkube.local.openai_source import expect as _expect
from evalkube.local.openai_source import messages as _messages
from evalkube.local.openai_source import model_id as _model
from evalkube.models import EvalRun, EvalSuite, GraderSpec, SpecError, validate_spec
from evalkube.models.errors import ConfigError

_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]+")
_WORD = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_GRADER_KEYS = {
    "python": ("source", "pass_threshold"),
    "string_check": ("input", "reference", "operation"),
    "text_similarity": ("input", "reference", "evaluation_metric", "pass_threshold"),
    "score_model": ("input", "model", "range", "sampling_params", "pass_threshold"),
    "label_model": ("input", "model", "labels", "passing_labels"),
    "multi": ("graders", "calculate_output", "pass_threshold"),
}
#: Fields of a criterion that need no counterpart (``image_tag``: the grader environment is
#: OpenAI's python-grader package set, docs/graders.md).
_IGNORED = frozenset({"type", "name", "image_tag", "id"})
_SUB_TYPES = ("string_check", "text_similarity")
#: The embedding model OpenAI's ``cosine`` metric used.
COSINE_MODEL = "openai:text-embedding-3-large"
#: OpenAI's ``sample`` namespace.
SAMPLE_FIELDS = ("output_text", "output_json", "output_tools", "choices")


@dataclass
class ImportedEval:
    """What ``evalkube import openai`` writes: the suite, the run and, for a run that graded
    stored samples, the precomputed outputs (``outputs.jsonl``)."""

    suite: EvalSuite
    run: EvalRun
    outputs: list[dict[str, Any]] | None = None


def _name(raw: Any, fallback: str, pattern: re.Pattern[str] = _NAME) -> str:
    """OpenAI criterion names are free text; ours are ``[A-Za-z0-9_.-]`` (metric ids)."""
    cleaned = pattern.sub("_", str(raw or "")).strip("_.-")[:63]
    return cleaned or fallback


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 2
    while candidate in taken:
        candidate = f"{name[:59]}_{n}"
        n += 1
    taken.add(candidate)
    return candidate


def _criterion(raw: Any, where: str, names: set[str], index: int) -> dict[str, Any]:
    raw = _expect(raw, dict, where, "a criterion object {type, name, ...}")
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in _GRADER_KEYS:
        raise ConfigError(
            f"{where}.type: {kind!r} has no evalkube equivalent; supported: "
            + ", ".join(_GRADER_KEYS)
        )
    _no_unknown(raw, _GRADER_KEYS[kind], where)
    grader: dict[str, Any] = {
        "type": kind,
        "name": _unique(_name(raw.get("name"), f"criterion_{index}"), names),
    }
    for key in _GRADER_KEYS[kind]:
        if raw.get(key) is not None:
            grader[key] = raw[key]
    if kind in ("score_model", "label_model"):
        grader["input"] = _messages(raw.get("input"), f"{where}.input")
        if raw.get("model"):
            grader["model"] = _model(raw["model"])
        if raw.get("sampling_params") is not None:
            _expect(raw["sampling_params"], dict, f"{where}.sampling_params", "an object")
    if kind == "multi":
        grader["graders"], grader["calculate_output"] = _multi(raw, where)
    _check_threshold(grader, where)
    return grader


def _no_unknown(raw: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in raw:
        if key not in known and key not in _IGNORED and raw[key] is not None:
            raise ConfigError(
                f"{where}.{key}: not a field evalkube can carry for a {raw.get('type')} "
                f"criterion (it takes: {', '.join(known)})"
            )


def _multi(raw: Mapping[str, Any], where: str) -> tuple[dict[str, Any], str]:
    """``graders`` keyed by formula-safe names, and ``calculate_output`` with the names
    renamed where a key had to change (two keys that sanitize alike keep both graders)."""
    graders = raw.get("graders")
    if isinstance(graders, Mapping) and isinstance(graders.get("type"), str):
        graders = {str(graders.get("name") or "grader"): graders}  # openai-python: one grader
    graders = _expect(graders, dict, f"{where}.graders", "an object of named graders")
    if not graders:
        raise ConfigError(f"{where}.graders: no graders")
    formula = _expect(raw.get("calculate_output"), str, f"{where}.calculate_output", "a formula")
    taken: set[str] = set()
    renamed: dict[str, str] = {}
    out: dict[str, Any] = {}
    for i, (key, sub) in enumerate(graders.items()):
        at = f"{where}.graders.{key}"
        sub = _expect(sub, dict, at, "a grader object")
        if sub.get("type") not in _SUB_TYPES:
            raise ConfigError(
                f"{at}.type: {sub.get('type')!r} inside multi has no evalkube equivalent; "
                f"supported: {', '.join(_SUB_TYPES)}"
            )
        if sub.get("evaluation_metric") == "cosine":
            raise ConfigError(f"{at}.evaluation_metric: cosine is not supported inside multi")
        _no_unknown(sub, _GRADER_KEYS[sub["type"]], at)
        name = _unique(_name(key, f"g{i}", _IDENTIFIER), taken)
        renamed[str(key)] = name
        out[name] = {k: v for k, v in sub.items() if k not in _IGNORED or k == "type"}
        out[name].pop("pass_threshold", None)
    return out, _rename(formula, renamed)


def _rename(formula: str, renamed: Mapping[str, str]) -> str:
    """``formula`` with each grader name replaced by its new name (a formula holds no
    strings, so every identifier is a name or a function)."""
    return _WORD.sub(lambda m: renamed.get(m.group(0), m.group(0)), formula)


def _check_threshold(grader: Mapping[str, Any], where: str) -> None:
    """A ``pass_threshold`` no score could reach, or every score reaches, named here (the
    model refuses it too, naming the suite's field)."""
    threshold = grader.get("pass_threshold")
    if threshold is None:
        return
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ConfigError(f"{where}.pass_threshold: {threshold!r} is not a number")
    probe = {k: grader[k] for k in ("type", "range", "evaluation_metric") if k in grader}
    bounds = GraderSpec.model_construct(**probe).score_bounds
    if bounds is not None and not bounds[0] < threshold <= bounds[1]:
        low, high = bounds
        raise ConfigError(
            f"{where}.pass_threshold: {threshold} is outside the {grader['type']} score range "
            f"({low}, {high}]: "
            + ("no sample could pass" if threshold > high else "every sample would pass")
        )


def import_openai(export: Any, name: str | None = None) -> ImportedEval:
    """The EvalSuite, EvalRun (and outputs) of an export ``{"eval": {...}, "run": {...}}``."""
    export = _expect(export, dict, "the export", '{"eval": {...}, "run": {...}} as exported')
    evaluation = _expect(export.get("eval"), dict, "eval", "the eval object")
    run = _expect(export.get("run"), dict, "run", "the run object")
    suite_name = _name(name or evaluation.get("name"), "imported").lower().replace("_", "-")
    config = _expect(
        evaluation.get("data_source_config") or {}, dict, "eval.data_source_config", "an object"
    )
    schema = config.get("item_schema")
    if schema is not None:
        _expect(schema, dict, "eval.data_source_config.item_schema", "a JSON Schema object")
    criteria = _expect(evaluation.get("testing_criteria"), list, "eval.testing_criteria", "a list")
    if not criteria:
        raise ConfigError("eval.testing_criteria: no criteria")
    names: set[str] = set()
    graders = [
        _criterion(c, f"eval.testing_criteria[{i}]", names, i) for i, c in enumerate(criteria)
    ]
    source = read_run(run, schema)
    _check_templates(graders, source)
    suite, run_resource = _resources(suite_name, graders, source)
    return ImportedEval(suite, run_resource, source.outputs)


def _check_templates(graders: list[dict[str, Any]], source: RunSource) -> None:
    """Every field the prompt or a criterion's template reads exists in every item, and
    ``sample.*`` names a field OpenAI's sample has for this run."""
    for i, message in enumerate(source.prompt or []):
        where = f"run.data_source.input_messages.template[{i}].content"
        try:
            compile_template(message["content"], where, PROMPT_NAMES)
        except TemplateError as exc:
            raise ConfigError(str(exc)) from None
        _check_fields(where, message["content"], source)
    for index, grader in enumerate(graders):
        where = f"eval.testing_criteria[{index}]"
        subs = [(f"{where}.graders.{k}", g) for k, g in (grader.get("graders") or {}).items()]
        for at, spec in [(where, grader), *subs]:
            value = spec.get("input")
            if isinstance(value, str):
                _check_fields(f"{at}.input", value, source)
            elif isinstance(value, list):
                for i, m in enumerate(value):
                    if isinstance(m, dict) and isinstance(m.get("content"), str):
                        _check_fields(f"{at}.input[{i}].content", m["content"], source)
            if isinstance(spec.get("reference"), str):
                _check_fields(f"{at}.reference", spec["reference"], source)


def _check_fields(where: str, template: str, source: RunSource) -> None:
    for namespace, path in field_paths(template, ("item", "sample")):
        if namespace == "sample":
            if path[0] not in SAMPLE_FIELDS:
                raise ConfigError(
                    f"{where}: `{spelled('sample', path[:1])}` is not in OpenAI's sample "
                    f"namespace ({', '.join(SAMPLE_FIELDS)})"
                )
            if path[0] == "output_json" and not source.structured:
                raise ConfigError(
                    f"{where}: `sample.output_json` exists only when the run asks for "
                    "structured output (sampling_params.response_format or text.format)"
                )
            continue
        for number, item in enumerate(source.items):
            lacks = missing(item, path)
            if lacks is not None:
                raise ConfigError(
                    f"{where}: `{spelled('item', path)}` is not in item {number} "
                    f"({source.items_where}[{number}].item has no `{lacks}`); every sample "
                    "would be invalid"
                )


def _resources(
    suite_name: str, graders: list[dict[str, Any]], source: RunSource
) -> tuple[EvalSuite, EvalRun]:
    task: dict[str, Any] = {
        "id": "eval",
        "dataset": {"rows": source.items},
        "graders": graders,
        "grader_inputs": "openai",
    }
    if source.prompt is not None:
        task["prompt"] = source.prompt
    else:
        task["outputs"] = {"path": "outputs.jsonl"}
    judges = [g["model"] for g in graders if g.get("model")]
    cosine = any(g.get("evaluation_metric") == "cosine" for g in graders)
    calls_openai = bool(judges or cosine or source.model)
    spec: dict[str, Any] = {
        "suiteRef": {"name": suite_name},
        "models": [source.model or "precomputed"],
        "generation": source.generation,
    }
    if calls_openai:
        spec["providers"] = {
            "openai": {"baseURL": "https://api.openai.com/v1", "apiKeyEnv": "OPENAI_API_KEY"}
        }
    if judges:
        spec["judgeModel"] = judges[0]
    if cosine:
        spec["embeddingModel"] = COSINE_MODEL
    run_doc = {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalRun",
               "metadata": {"name": suite_name}, "spec": spec}  # fmt: skip
    suite_doc = {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalSuite",
                 "metadata": {"name": suite_name}, "spec": {"tasks": [task]}}  # fmt: skip
    try:
        suite = validate_spec(EvalSuite, suite_doc, prefix="")
        run = validate_spec(EvalRun, run_doc, prefix="")
    except SpecError as exc:
        raise ConfigError(f"the imported eval does not fit evalkube: {exc}") from None
    (imported,) = suite.spec.tasks
    for index, (kind, spec_) in enumerate(imported.grader_fields()):
        where = f"eval.testing_criteria[{index}]"
        try:
            if spec_.builtin:
                builtin_criterion(spec_, where)
            else:
                assert spec_.source is not None
                check_source(spec_.source, f"<{kind}>", spec_.entrypoint, f"{where}.source")
        except (TemplateError, FormulaError, MissingLibrary) as exc:
            raise ConfigError(str(exc)) from None
    return suite, run
