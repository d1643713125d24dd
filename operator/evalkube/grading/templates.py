"""Prompts and targets rendered with Jinja2's sandboxed environment.

Templates come from suite authors and rows from datasets, so rendering runs in Jinja2's
sandbox (no attribute access to internals), bounded in output, work and time
(:mod:`evalkube.grading.template_budget`), with ``StrictUndefined``: a missing field is an
error the sample records, not a silently blank prompt.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jinja2
from jinja2 import meta, nodes

from evalkube import limits
from evalkube.grading.template_budget import (
    BoundedEnvironment,
    bounded_tree,
    check_constants,
    render_bounded,
)

_ENV = BoundedEnvironment(
    undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True
)


class TemplateError(ValueError):
    """A template does not compile or cannot render for a row."""


PROMPT_NAMES = frozenset({"item", "row", "few_shot", "task_id"})
"""Names a prompt or target template may use: the row (``item``, alias ``row``), the task's
few-shot rows and its id. ``sample`` does not exist yet when the prompt is rendered."""
GRADER_NAMES = frozenset({"item", "sample"})
"""Names a grader's input template may use (OpenAI's ``item`` and ``sample`` namespaces)."""


def compile_template(
    source: str,
    where: str,
    names: Collection[str] | None = None,
    env: BoundedEnvironment = _ENV,
) -> jinja2.Template:
    """Compile once per task; syntax errors name the field and line.

    With ``names``, a template that reads any other top-level name (``{{ sampel.x }}``,
    ``{{ sample.output_text }}`` in a prompt) is refused here, at ``validate``, instead of
    erroring on every sample of the run.
    """
    try:
        tree = env.parse(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"{where}: template syntax error on line {exc.lineno}: {exc.message}"
        ) from None
    except RecursionError:
        raise TemplateError(f"{where}: the template nests too deeply") from None
    if names is not None:
        _check_names(tree, where, names)
    try:  # bounded: no constant is folded past the budget while compiling
        check_constants(tree, env)
        return env.from_string(bounded_tree(tree, env))
    except jinja2.TemplateError as exc:
        raise TemplateError(f"{where}: {exc}") from None
    except Exception as exc:  # RecursionError, or a constant Python refuses (huge int)
        raise TemplateError(f"{where}: cannot compile: {type(exc).__name__}: {exc}") from None


def _check_names(tree: nodes.Template, where: str, names: Collection[str]) -> None:
    unknown = sorted(meta.find_undeclared_variables(tree) - set(names) - set(_ENV.globals))
    if not unknown:
        return
    allowed = ", ".join(sorted(names))
    if "sample" in unknown:
        raise TemplateError(
            f"{where}: `sample` is not available here: the prompt and target are rendered "
            "before the candidate exists; use `sample.*` in a grader's input templates "
            f"(this template may use: {allowed})"
        )
    raise TemplateError(
        f"{where}: unknown name(s) {', '.join(f'`{n}`' for n in unknown)}; "
        f"this template may use: {allowed} (for example `{{{{ item.question }}}}`)"
    )


Part = str | tuple[str, ...]


class _NotFast(Exception):
    """The fast path cannot decide; Jinja renders (and reports errors) instead."""


def _field_path(node: nodes.Node) -> tuple[str, ...] | None:
    keys: list[str] = []
    while isinstance(node, nodes.Getattr | nodes.Getitem):
        if isinstance(node, nodes.Getattr):
            keys.append(node.attr)
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            keys.append(node.arg.value)
        else:
            return None
        node = node.node
    if not keys or not isinstance(node, nodes.Name) or node.name not in ("item", "row"):
        return None
    return tuple(reversed(keys))


def fast_parts(source: str) -> list[Part] | None:
    """Text and ``item.a.b`` lookups, when that is all a template does; else ``None``.

    Most prompts are text with field lookups; rendering those without building a Jinja
    context per row is about ten times faster. Anything else (filters, loops, other
    names) renders through Jinja.
    """
    try:
        tree = _ENV.parse(source)
    except (jinja2.TemplateSyntaxError, RecursionError):
        return None
    parts: list[Part] = []
    for node in tree.body:
        if not isinstance(node, nodes.Output):
            return None
        for child in node.nodes:
            if isinstance(child, nodes.TemplateData):
                parts.append(child.data)
            elif (path := _field_path(child)) is not None:
                parts.append(path)
            else:
                return None
    return parts


def _render_fast(parts: list[Part], row: Mapping[str, Any]) -> str:
    out: list[str] = []
    size = 0
    for part in parts:
        if type(part) is str:
            out.append(part)
            continue
        value: Any = row
        for key in part:
            if type(value) is not dict or key not in value:
                raise _NotFast
            value = value[key]
        out.append(str(value))
        size += len(out[-1])
        if size > limits.TEMPLATE_OUTPUT_CHARS:
            raise _NotFast  # Jinja renders it again, within its budget, and says so
    return "".join(out)


class _Compiled:
    """One template: Jinja always, plus the fast path when it applies."""

    __slots__ = ("fast", "template", "what")

    def __init__(self, source: str, where: str, what: str) -> None:
        self.template = compile_template(source, where, PROMPT_NAMES)
        self.fast = fast_parts(source)
        self.what = what

    def render(self, row: Mapping[str, Any], variables: Mapping[str, Any]) -> str:
        if self.fast is not None:
            try:
                return _render_fast(self.fast, row)
            except _NotFast:
                pass
        return _render(self.template, variables, self.what)


class PromptTemplate:
    """A task's prompt (string or chat messages) and target, compiled once."""

    def __init__(
        self,
        prompt: str | Sequence[tuple[str, str]] | None,
        target: str | None,
        where: str,
    ) -> None:
        self._prompt: _Compiled | list[tuple[str, _Compiled]] | None
        if prompt is None:
            self._prompt = None
        elif isinstance(prompt, str):
            self._prompt = _Compiled(prompt, f"{where}.prompt", "prompt")
        else:
            self._prompt = [
                (role, _Compiled(content, f"{where}.prompt[{i}].content", "prompt"))
                for i, (role, content) in enumerate(prompt)
            ]
        self._target = (
            _Compiled(target, f"{where}.target", "target") if target is not None else None
        )

    def render(self, row: Mapping[str, Any], context: Mapping[str, Any]) -> tuple[Any, str | None]:
        """``(prompt, target)`` for a row; prompt is a string or a list of messages."""
        variables = {**context, "item": row, "row": row}
        prompt: Any = None
        if isinstance(self._prompt, list):
            prompt = [
                {"role": role, "content": template.render(row, variables)}
                for role, template in self._prompt
            ]
        elif self._prompt is not None:
            prompt = self._prompt.render(row, variables)
        target = self._target.render(row, variables) if self._target is not None else None
        return prompt, target


def _render(template: jinja2.Template, variables: Mapping[str, Any], what: str) -> str:
    try:
        return render_bounded(template, variables, limits.TEMPLATE_OUTPUT_CHARS)
    except jinja2.UndefinedError as exc:
        raise TemplateError(
            f"{what}: {exc.message}; check the row's field names and the preprocessor"
        ) from None
    except jinja2.TemplateError as exc:
        raise TemplateError(f"{what}: {exc}") from None
    except Exception as exc:  # template filters on bad data (e.g. int("x"))
        raise TemplateError(f"{what}: {type(exc).__name__}: {exc}") from None


def _finalize(value: Any) -> Any:
    """Every non-string value renders as JSON, as OpenAI's templates did: objects and lists
    (``{{ sample.output_json }}``), and ``true``/``false``/``null`` (not Python's ``True``/
    ``None``), so a string_check of the output ``true`` against a boolean field matches."""
    if value is None or isinstance(value, bool | dict | list):
        return json.dumps(value, ensure_ascii=False)
    return value


_GRADER_ENV = BoundedEnvironment(
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    finalize=_finalize,
)


class GraderTemplate:
    """A built-in grader's input (``{{ sample.output_text }}``, ``{{ item.answer }}``).

    Compiled once per task with only the ``item`` and ``sample`` namespaces allowed;
    rendered per sample with the grader's ``item`` and ``sample`` dicts.
    """

    __slots__ = ("template", "what")

    def __init__(self, source: str, where: str) -> None:
        self.template = compile_template(source, where, GRADER_NAMES, _GRADER_ENV)
        self.what = where

    def render(self, item: Mapping[str, Any], sample: Mapping[str, Any]) -> str:
        return _render(self.template, {"item": item, "sample": sample}, self.what)
