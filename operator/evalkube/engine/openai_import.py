"""``evalkube import openai``: an exported OpenAI eval (+ run) -> EvalSuite and EvalRun.

Reads what OpenAI's Evals API returned for an eval (``data_source_config`` with its
``item_schema``, ``testing_criteria``) and for one of its runs (``data_source``: JSONL
``file_content``, the ``input_messages`` template, ``model`` and ``sampling_params``), in one
JSON file ``{"eval": {...}, "run": {...}}``. Every item is checked against the
``item_schema`` (jsonschema) first; the result is validated by the same models ``evalkube
validate`` uses, so an import that succeeds runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jsonschema

from evalkube.models import EvalRun, EvalSuite, SpecError, validate_spec
from evalkube.models.errors import ConfigError

_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_GRADER_KEYS = {
    "python": ("source", "pass_threshold"),
    "string_check": ("input", "reference", "operation"),
    "text_similarity": ("input", "reference", "evaluation_metric", "pass_threshold"),
    "score_model": ("input", "model", "range", "sampling_params", "pass_threshold"),
    "label_model": ("input", "model", "labels", "passing_labels"),
    "multi": ("graders", "calculate_output", "pass_threshold"),
}


def _name(raw: Any, fallback: str) -> str:
    """OpenAI criterion names are free text; ours are ``[A-Za-z0-9_.-]`` (metric ids)."""
    cleaned = _NAME.sub("_", str(raw or "")).strip("_.-")[:63]
    return cleaned or fallback


def _text(content: Any) -> str:
    """A message content: a string, ``{"type": "input_text", "text"}`` or a list of those."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        return str(content.get("text") or "")
    if isinstance(content, list):
        return "".join(_text(part) for part in content)
    return ""


def _messages(raw: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: expected a list of messages")
    out = []
    for i, message in enumerate(raw):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ConfigError(f"{where}[{i}]: expected {{role, content}}")
        out.append({"role": str(message["role"]), "content": _text(message.get("content"))})
    return out


def _model(model: Any) -> str:
    text = str(model)
    return text if ":" in text else f"openai:{text}"


def _grader(raw: Mapping[str, Any], where: str, names: set[str], index: int) -> dict[str, Any]:
    kind = raw.get("type")
    if kind not in _GRADER_KEYS:
        raise ConfigError(
            f"{where}.type: {kind!r} has no evalkube equivalent; supported: "
            + ", ".join(_GRADER_KEYS)
        )
    name = _name(raw.get("name"), f"criterion_{index}")
    while name in names:
        name = f"{name}_{index}"
    names.add(name)
    grader: dict[str, Any] = {"type": kind, "name": name}
    for key in _GRADER_KEYS[kind]:
        if raw.get(key) is not None:
            grader[key] = raw[key]
    if kind in ("score_model", "label_model"):
        grader["input"] = _messages(raw.get("input"), f"{where}.input")
        if raw.get("model"):
            grader["model"] = _model(raw["model"])
    if kind == "multi":
        grader["graders"] = {
            _name(key, f"g{i}"): {k: v for k, v in sub.items() if k != "name"}
            for i, (key, sub) in enumerate(dict(raw.get("graders") or {}).items())
        }
    return grader


def _items(data_source: Mapping[str, Any], schema: Any, where: str) -> list[dict[str, Any]]:
    source = data_source.get("source") or {}
    if source.get("type") != "file_content":
        raise ConfigError(
            f"{where}.source.type: {source.get('type')!r}; export the run's items inline "
            "(`file_content`): a `file_id` cannot be read here"
        )
    rows: list[dict[str, Any]] = []
    validator = jsonschema.Draft202012Validator(schema) if isinstance(schema, Mapping) else None
    for i, line in enumerate(source.get("content") or []):
        item = line.get("item") if isinstance(line, Mapping) else None
        if not isinstance(item, dict):
            raise ConfigError(f'{where}.source.content[{i}]: expected {{"item": {{...}}}}')
        if validator is not None:
            error = jsonschema.exceptions.best_match(validator.iter_errors(item))
            if error is not None:
                at = "".join(f"[{p!r}]" for p in error.absolute_path)
                raise ConfigError(
                    f"{where}.source.content[{i}].item{at}: {error.message} "
                    "(does not match data_source_config.item_schema)"
                )
        rows.append(item)
    if not rows:
        raise ConfigError(f"{where}.source.content: no items")
    return rows


def import_openai(export: Mapping[str, Any], name: str | None = None) -> tuple[EvalSuite, EvalRun]:
    """The EvalSuite and EvalRun of an export ``{"eval": {...}, "run": {...}}``."""
    evaluation, run = export.get("eval"), export.get("run")
    if not isinstance(evaluation, Mapping) or not isinstance(run, Mapping):
        raise ConfigError('expected {"eval": {...}, "run": {...}} as exported from OpenAI')
    suite_name = _name(name or evaluation.get("name"), "imported").lower().replace("_", "-")
    config = evaluation.get("data_source_config") or {}
    criteria = evaluation.get("testing_criteria") or []
    if not criteria:
        raise ConfigError("eval.testing_criteria: no criteria")
    names: set[str] = set()
    graders = [_grader(c, f"eval.testing_criteria[{i}]", names, i) for i, c in enumerate(criteria)]
    data_source = run.get("data_source") or {}
    rows = _items(data_source, config.get("item_schema"), "run.data_source")
    template = (data_source.get("input_messages") or {}).get("template")
    task: dict[str, Any] = {
        "id": "eval",
        "dataset": {"rows": rows},
        "prompt": _messages(template, "run.data_source.input_messages.template"),
        "graders": graders,
    }
    sampling = data_source.get("sampling_params") or {}
    generation = {
        key: value
        for key, value in (
            ("temperature", sampling.get("temperature")),
            ("max_output_tokens", sampling.get("max_completions_tokens")),
        )
        if value is not None
    }
    model = data_source.get("model")
    if not model:
        raise ConfigError("run.data_source.model: the model that generated the candidates")
    judges = [g["model"] for g in graders if g.get("model")]
    run_doc: dict[str, Any] = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": suite_name},
        "spec": {
            "suiteRef": {"name": suite_name},
            "models": [_model(model)],
            "providers": {
                "openai": {"baseURL": "https://api.openai.com/v1", "apiKeyEnv": "OPENAI_API_KEY"}
            },
            "generation": generation,
            **({"judgeModel": judges[0]} if judges else {}),
        },
    }
    suite_doc = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": suite_name},
        "spec": {"tasks": [task]},
    }
    try:
        return (
            validate_spec(EvalSuite, suite_doc, prefix=""),
            validate_spec(EvalRun, run_doc, prefix=""),
        )
    except SpecError as exc:
        raise ConfigError(f"the imported eval does not fit evalkube: {exc}") from None
