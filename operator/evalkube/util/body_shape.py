"""Validate a JSON request body against a declared shape (a pydantic ``TypeAdapter``).

The bridge's control routes and the operator's ingest routes answer a bad body with one line
naming each wrong field (``tokens[2]: ...``) and the shape to send, instead of hand-written
``isinstance`` checks that each word their errors differently.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

__all__ = ["BodyError", "Shape"]

T = TypeVar("T")


class BodyError(ValueError):
    """A body did not match its shape; the message names the fields and the shape."""


def _where(loc: tuple[int | str, ...]) -> str:
    """``("tokens", 2)`` -> ``tokens[2]``; union member names (``list[str]``) left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" not in part and not part.startswith(("literal", "function-")):
            out += ("." if out else "") + part
    return out or "body"


class Shape(Generic[T]):
    """A request body's type and the hint its error message ends with (``send <hint>``)."""

    def __init__(self, kind: type[T], hint: str) -> None:
        self.adapter = TypeAdapter(kind)
        self.hint = hint

    def parse(self, raw: bytes) -> T:
        """``raw`` (an empty body is ``{}``) validated, or :class:`BodyError`."""
        try:
            return self.adapter.validate_json(raw or b"{}")
        except ValidationError as exc:
            problems = [f"{_where(e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)]
            raise BodyError(f"{'; '.join(problems)}; send {self.hint}") from None
