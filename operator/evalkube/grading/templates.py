"""Prompts and targets rendered with Jinja2's sandboxed environment.

Templates come from suite authors and rows from datasets, so rendering runs in Jinja2's
``SandboxedEnvironment`` (no attribute access to internals) with ``StrictUndefined``: a
missing field is an error the sample records, not a silently blank prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import SandboxedEnvironment

_ENV = SandboxedEnvironment(
    undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True
)


class TemplateError(ValueError):
    """A template does not compile or cannot render for a row."""


def compile_template(source: str, where: str) -> jinja2.Template:
    """Compile once per task; syntax errors name the field and line."""
    try:
        return _ENV.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"{where}: template syntax error on line {exc.lineno}: {exc.message}"
        ) from None


class PromptTemplate:
    """A task's prompt (string or chat messages) and target, compiled once."""

    def __init__(
        self,
        prompt: str | Sequence[tuple[str, str]] | None,
        target: str | None,
        where: str,
    ) -> None:
        self._prompt: jinja2.Template | list[tuple[str, jinja2.Template]] | None
        if prompt is None:
            self._prompt = None
        elif isinstance(prompt, str):
            self._prompt = compile_template(prompt, f"{where}.prompt")
        else:
            self._prompt = [
                (role, compile_template(content, f"{where}.prompt[{i}].content"))
                for i, (role, content) in enumerate(prompt)
            ]
        self._target = compile_template(target, f"{where}.target") if target is not None else None

    def render(self, row: Mapping[str, Any], context: Mapping[str, Any]) -> tuple[Any, str | None]:
        """``(prompt, target)`` for a row; prompt is a string or a list of messages."""
        variables = {**context, "item": row, "row": row}
        prompt: Any = None
        if isinstance(self._prompt, list):
            prompt = [
                {"role": role, "content": _render(template, variables, "prompt")}
                for role, template in self._prompt
            ]
        elif self._prompt is not None:
            prompt = _render(self._prompt, variables, "prompt")
        target = _render(self._target, variables, "target") if self._target is not None else None
        return prompt, target


def _render(template: jinja2.Template, variables: Mapping[str, Any], what: str) -> str:
    try:
        return template.render(variables)
    except jinja2.UndefinedError as exc:
        raise TemplateError(
            f"{what}: {exc.message}; check the row's field names and the preprocessor"
        ) from None
    except jinja2.TemplateError as exc:
        raise TemplateError(f"{what}: {exc}") from None
    except Exception as exc:  # template filters on bad data (e.g. int("x"))
        raise TemplateError(f"{what}: {type(exc).__name__}: {exc}") from None
