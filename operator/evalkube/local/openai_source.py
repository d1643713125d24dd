"""The data source of an exported OpenAI eval run, for :mod:`evalkube.local.openai_import`.

Three kinds of run (OpenAI's ``data_source.type``):

- ``completions`` and ``responses``: items, the ``input_messages`` template (the prompt), the
  model and its ``sampling_params``, all carried: ``temperature``, ``max_completions_tokens``,
  ``top_p``, ``seed``, ``reasoning_effort``, ``response_format`` (``text.format`` for
  ``responses``) and ``tools`` (and ``tool_choice``) become the run's ``generation``;
- ``jsonl``: stored completions to grade, ``{"item": ..., "sample": {...}}`` lines: the items
  become the rows and the samples precomputed outputs (``outputs.jsonl``), so no model is
  called.

Items must be inline (``file_content``). Every item is checked against the eval's
``item_schema`` (jsonschema); every shape that is not what OpenAI's API took names its field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from evalkube.engine.item_schema import item_checker
from evalkube.models.errors import ConfigError

T = TypeVar("T")
_KINDS = ("completions", "responses", "jsonl")
_TYPES: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}
_TEXT_PARTS = ("input_text", "output_text", "text")
#: ``sampling_params`` keys and the run's ``generation`` field each becomes.
_SAMPLING = {
    "temperature": "temperature",
    "max_completions_tokens": "max_output_tokens",
    "top_p": "top_p",
    "seed": "seed",
    "reasoning_effort": "reasoning_effort",
    "response_format": "response_format",
    "tools": "tools",
    "tool_choice": "tool_choice",
}


def expect(value: Any, kind: type[T], where: str, what: str) -> T:
    """``value`` if it is a ``kind``; else a :class:`ConfigError` naming ``where``."""
    if not isinstance(value, kind):
        got = type(value).__name__ if value is not None else "nothing"
        raise ConfigError(
            f"{where}: expected {what} ({_TYPES.get(kind, kind.__name__)}), got {got}"
        )
    return value


def model_id(model: Any) -> str:
    text = str(model)
    return text if ":" in text else f"openai:{text}"


def _text(content: Any, where: str) -> str:
    """A message content: a string, ``{"type": "input_text", "text"}`` or a list of those;
    anything else (an image, audio) cannot be carried and is named."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping) and content.get("type", "input_text") in _TEXT_PARTS:
        return expect(content.get("text"), str, f"{where}.text", "the text")
    if isinstance(content, list):
        return "".join(_text(part, f"{where}[{i}]") for i, part in enumerate(content))
    kind = content.get("type") if isinstance(content, Mapping) else type(content).__name__
    raise ConfigError(f"{where}: content of type {kind!r} cannot be imported (text only)")


def messages(raw: Any, where: str) -> list[dict[str, str]]:
    """Chat messages ``[{role, content}]`` with text contents."""
    raw = expect(raw, list, where, "a list of messages")
    if not raw:
        raise ConfigError(f"{where}: expected a list of messages, got an empty list")
    out = []
    for i, message in enumerate(raw):
        at = f"{where}[{i}]"
        message = expect(message, dict, at, "a message {role, content}")
        if message.get("type") == "item_reference":
            raise ConfigError(
                f"{at}: an item_reference (messages taken from the item) cannot be imported; "
                "write the messages as a template"
            )
        if "role" not in message:
            raise ConfigError(f"{at}: expected {{role, content}}")
        content = _text(message.get("content"), f"{at}.content")
        out.append({"role": str(message["role"]), "content": content})
    return out


@dataclass
class RunSource:
    """What a run's data source becomes."""

    items: list[dict[str, Any]]
    items_where: str
    prompt: list[dict[str, str]] | None = None
    model: str | None = None
    generation: dict[str, Any] = field(default_factory=dict)
    outputs: list[dict[str, Any]] | None = None
    """``outputs.jsonl`` lines of a ``jsonl`` run (``id`` = the item's position)."""
    structured: bool = False
    """Graders may read ``sample.output_json``: the run asked for JSON, or stored samples
    carry it."""


def read_run(run: Mapping[str, Any], schema: Mapping[str, Any] | None) -> RunSource:
    """The run's items, prompt, model and generation, or its stored samples."""
    where = "run.data_source"
    data_source = expect(run.get("data_source"), dict, where, "the run's data source")
    kind = data_source.get("type")
    if kind not in _KINDS:
        raise ConfigError(
            f"{where}.type: {kind!r}; supported: {', '.join(_KINDS)} (export the run's items "
            "and, for stored completions, its samples as `jsonl` file_content)"
        )
    lines = _lines(data_source, where)
    items_where = f"{where}.source.content"
    # no $ref fetched, patterns in linear time, bounded steps (evalkube.engine.item_schema)
    schema_at = "eval.data_source_config.item_schema"
    check = item_checker(schema, schema_at) if schema is not None else None
    items: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        at = f"{items_where}[{i}]"
        line = expect(line, dict, at, '{"item": {...}}')
        item = expect(line.get("item"), dict, f"{at}.item", "the item object")
        if check is not None:
            check(item, f"{at}.item")
        items.append(item)
        if kind == "jsonl":
            outputs.append({"id": str(i), **_sample(line.get("sample"), f"{at}.sample")})
    if kind == "jsonl":
        for key in ("input_messages", "model", "sampling_params"):
            if data_source.get(key) is not None:
                raise ConfigError(
                    f"{where}.{key}: a jsonl run grades stored samples and calls no model; "
                    "remove it, or export the run as `completions`"
                )
        structured = any("output_json" in o for o in outputs)
        return RunSource(items, items_where, outputs=outputs, structured=structured)
    template = expect(
        data_source.get("input_messages"), dict, f"{where}.input_messages", "{type, template}"
    )
    if template.get("type") != "template":
        raise ConfigError(
            f"{where}.input_messages.type: {template.get('type')!r}; only `template` "
            "(messages rendered from each item) can be imported"
        )
    prompt = messages(template.get("template"), f"{where}.input_messages.template")
    model = data_source.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{where}.model: the model that generated the candidates")
    generation = _generation(data_source.get("sampling_params"), kind, f"{where}.sampling_params")
    fmt = generation.get("response_format") or {}
    structured = fmt.get("type") in ("json_object", "json_schema")
    return RunSource(items, items_where, prompt, model_id(model), generation, None, structured)


def _lines(data_source: Mapping[str, Any], where: str) -> list[Any]:
    source = expect(data_source.get("source"), dict, f"{where}.source", "{type, content}")
    if source.get("type") != "file_content":
        raise ConfigError(
            f"{where}.source.type: {source.get('type')!r}; export the run's items inline "
            "(`file_content`): a `file_id` or a stored-completions query cannot be read here"
        )
    lines = expect(source.get("content"), list, f"{where}.source.content", "a list of lines")
    if not lines:
        raise ConfigError(f"{where}.source.content: no items")
    return lines


def _sample(raw: Any, where: str) -> dict[str, Any]:
    """A stored sample as an ``outputs.jsonl`` line (OpenAI's sample fields)."""
    sample = expect(raw, dict, where, "the sample {output_text, ...} a jsonl run grades")
    text = sample.get("output_text")
    if text is None:
        choices = sample.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, dict) else None
        text = message.get("content") if isinstance(message, dict) else None
    if not isinstance(text, str):
        raise ConfigError(f"{where}.output_text: expected the sampled text (a string)")
    line: dict[str, Any] = {"output_text": text}
    if "output_json" in sample:
        line["output_json"] = sample["output_json"]
    for key in ("output_tools", "choices"):
        if sample.get(key) is not None:
            line[key] = expect(sample[key], list, f"{where}.{key}", "a list")
    return line


def _generation(raw: Any, kind: str, where: str) -> dict[str, Any]:
    """``sampling_params`` as the run's ``generation`` (every key carried, or named)."""
    if raw is None:
        return {}
    params = dict(expect(raw, dict, where, "an object"))
    text = params.pop("text", None) if kind == "responses" else None
    if text is not None:
        fmt = expect(text, dict, f"{where}.text", "{format}").get("format")
        if fmt is not None:
            fmt = expect(fmt, dict, f"{where}.text.format", "an object")
            if fmt.get("type") == "json_schema":
                inner = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
                params["response_format"] = {"type": "json_schema", "json_schema": inner}
            elif fmt.get("type") != "text":
                params["response_format"] = {"type": fmt.get("type")}
    generation: dict[str, Any] = {}
    for key, value in params.items():
        if key not in _SAMPLING:
            raise ConfigError(
                f"{where}.{key}: not a sampling parameter evalkube can carry "
                f"({', '.join(_SAMPLING)})"
            )
        if value is not None:
            generation[_SAMPLING[key]] = value
    fmt = generation.get("response_format")
    if fmt is not None:
        expect(fmt, dict, f"{where}.response_format", "{type, json_schema?}")
        if fmt.get("type") == "text":
            del generation["response_format"]
    return generation
