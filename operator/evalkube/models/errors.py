"""Turn pydantic validation errors into messages that name the field path and the fix.

``spec.tasks[2].grader.timeoutSeconds: must be between 1 and 600`` rather than pydantic's
default text, because users read these in ``evalkube run`` output and in EvalSuite conditions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import annotated_types
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration problem the user must fix; the message says where and how.

    Raised by the local engine's loaders and the operator's suite checks alike, so it lives
    at the bottom of the package where both may import it.
    """


class SpecError(ValueError):
    """A spec failed validation; ``problems`` holds one ``path: message`` line per error."""

    def __init__(self, problems: Sequence[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(self.problems))


#: Location parts pydantic adds for the member of a union it tried (``str``, ``list[Message]``).
_UNION_MEMBER_TYPES = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _is_union_member(part: str) -> bool:
    return "[" in part or part in _UNION_MEMBER_TYPES


def format_path(
    loc: Iterable[str | int], prefix: str = "", names: dict[str, str] | None = None
) -> str:
    """``("spec", "tasks", 2, "timeout_seconds")`` -> ``spec.tasks[2].timeoutSeconds``.

    With ``names`` (snake_case field name -> its spelling on the wire), only those names are
    respelled: unknown keys and dict keys (provider names) stay as the user wrote them.
    """
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith(("function-", "tagged-union", "union[")) or (
            (names is None or part not in names) and _is_union_member(part)
        ):
            continue
        else:
            spelled = to_camel(part) if names is None else names.get(part, part)
            out += ("." if out else "") + spelled
    return out or "(root)"


def _wire_names(model: Any, seen: dict[str, str] | None = None) -> dict[str, str]:
    """Every field name of ``model`` and its nested models -> how the wire spells it."""
    names = {} if seen is None else seen
    for name, info in getattr(model, "model_fields", {}).items():
        alias = info.validation_alias if isinstance(info.validation_alias, str) else None
        names.setdefault(name, alias or info.alias or to_camel(name))
        nested = _inner_model(info.annotation)
        if nested is not None and nested is not model:
            _wire_names(nested, names)
    return names


def _field_info(model: type[BaseModel], loc: Sequence[str | int]) -> FieldInfo | None:
    """Walk ``loc`` through nested models to the FieldInfo of the failing field, if any."""
    current: Any = model
    info: FieldInfo | None = None
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", None)
        if not fields:
            return None
        info = fields.get(part) or next(
            (f for n, f in fields.items() if f.alias == part or to_camel(n) == part), None
        )
        if info is None:
            return None
        current = _inner_model(info.annotation)
    return info


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args = getattr(annotation, "__args__", ()) or ()
    return next((m for arg in args if (m := _inner_model(arg)) is not None), None)


def _bounds(info: FieldInfo | None) -> tuple[Any, Any]:
    lo = hi = None
    for meta in info.metadata if info else ():
        if isinstance(meta, annotated_types.Ge):
            lo = meta.ge
        elif isinstance(meta, annotated_types.Le):
            hi = meta.le
    return lo, hi


def _message(model: type[BaseModel], err: Any) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        lo, hi = _bounds(_field_info(model, err["loc"]))
        if lo is not None and hi is not None:
            return f"must be between {lo} and {hi} (got {err.get('input')!r})"
    if kind == "extra_forbidden":
        return "unknown field; remove it or check its spelling"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')} (got {err.get('input')!r})"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return str(err["msg"])


def format_validation_error(
    model: type[BaseModel], error: ValidationError, prefix: str = ""
) -> list[str]:
    """One ``path: message`` line per pydantic error, deduplicated, in input order.

    For a union field (``prompt: str | list[Message]``) pydantic reports every member it
    tried; when one member got further into the value, the others' "wrong type" lines are
    noise and are dropped.
    """
    names = _wire_names(model)
    entries: list[tuple[str, str, str | None]] = []
    for err in error.errors():
        loc = err["loc"]
        union = next(
            (
                i
                for i, part in enumerate(loc)
                if isinstance(part, str) and part not in names and _is_union_member(part)
            ),
            None,
        )
        path = format_path(loc, prefix, names)
        at = format_path(loc[:union], prefix, names) if union is not None else None
        entries.append((path, _message(model, err), at))
    lines: list[str] = []
    for path, message, at in entries:
        if at is not None and path == at and any(o == at and p != at for p, _, o in entries):
            continue
        line = f"{path}: {message}"
        if line not in lines:
            lines.append(line)
    return lines


def validate_spec(model: type[M], data: Any, prefix: str = "spec", source: str | None = None) -> M:
    """Validate ``data`` as ``model``; raise :class:`SpecError` with field-named messages."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(model, exc, prefix), source) from None
