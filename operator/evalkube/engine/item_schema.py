"""An imported eval's ``item_schema``, checked against its items without trusting it.

The schema comes from an export file, i.e. from whoever wrote that file. jsonschema on its
own would fetch an ``http://`` or ``file://`` ``$ref`` (a listener that never answers hangs
the import; ``file:///dev/zero`` grows memory until killed), run ``pattern`` and
``patternProperties`` in Python's backtracking ``re`` (``(a+)+$`` takes forever), and follow
``$ref`` fan-out for as long as it takes. Here:

- references resolve inside the schema (and JSON Schema's own meta-schemas) only: a
  ``referencing`` registry whose retrieval refuses every URI;
- patterns run in RE2, a linear-time engine; a pattern RE2 cannot run (lookaround,
  backreferences) is refused, naming where it is;
- every keyword evaluation counts against :data:`limits.SCHEMA_STEPS_MAX` (the whole import)
  and nesting against :data:`limits.SCHEMA_DEPTH_MAX`;
- ``enum`` and ``const`` walk their whole value: one holding more than
  :data:`limits.SCHEMA_ENUM_VALUES_MAX` values or :data:`limits.SCHEMA_ENUM_BYTES_MAX` bytes
  of JSON is refused, naming where it is, and each check is charged by the value's size.

Every failure is a :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jsonschema
import re2
import referencing
import referencing.exceptions
from jsonschema.exceptions import ValidationError

from evalkube import limits
from evalkube.models import ConfigError

_MESSAGE_CHARS = 300


def _refuse(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(uri)


_REGISTRY: referencing.Registry[Any] = referencing.Registry(retrieve=_refuse)  # type: ignore[call-arg]


class _PatternRefused(Exception):
    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(pattern, reason)
        self.pattern, self.reason = pattern, reason


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> Any:
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise _PatternRefused(pattern, str(reason)) from None


class _TooComplex(Exception):
    pass


class _Budget:
    """Keyword evaluations so far (the whole import, the current item) and the current
    nesting depth."""

    def __init__(self) -> None:
        self.steps = 0
        self.item_steps = 0
        #: Per item; the schema's own check against the meta-schema gets the whole budget.
        self.item_cap = limits.SCHEMA_STEPS_MAX
        self.depth = 0
        #: ``id(value) -> (value, JSON values in it)`` of the ``enum``/``const`` values seen.
        self.sizes: dict[int, tuple[Any, int]] = {}

    def charge_walk(self, value: Any) -> None:
        """Charge a walk of ``value`` (an ``enum`` or ``const``) before it is made."""
        known = self.sizes.get(id(value))
        if known is None or known[0] is not value:
            known = self.sizes[id(value)] = (value, _json_values(value))
        self.charge(known[1] // limits.SCHEMA_VALUE_NODES_PER_STEP)

    def charge(self, steps: int = 1) -> None:
        self.steps += steps
        self.item_steps += steps
        if self.item_steps > self.item_cap:
            raise _TooComplex(
                f"validating one item takes more than {self.item_cap:,} schema "
                "steps ($ref fan-out or nested anyOf/oneOf?)"
            )
        if self.steps > limits.SCHEMA_STEPS_MAX:
            raise _TooComplex(
                f"validating the items takes more than {limits.SCHEMA_STEPS_MAX:,} schema "
                "steps in all"
            )


Keyword = Callable[[Any, Any, Any, Any], Iterator[ValidationError] | None]


def _json_values(value: Any) -> int:
    """Values in ``value``: itself, and every item and key-value pair inside it."""
    count, stack = 0, [value]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, Mapping):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def _bounded(keyword: Keyword, budget: _Budget) -> Keyword:
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        budget.charge()
        budget.depth += 1
        try:
            if budget.depth > limits.SCHEMA_DEPTH_MAX:
                raise _TooComplex(
                    f"the schema nests deeper than {limits.SCHEMA_DEPTH_MAX} levels "
                    "(a recursive $ref?)"
                )
            yield from keyword(validator, value, instance, schema) or ()
        finally:
            budget.depth -= 1

    return run


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _regex(pattern).search(instance):
        yield ValidationError(f"{_clip(repr(instance), 80)} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = _regex(pattern)
        for key, value in instance.items():
            if regex.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    regexes = [_regex(p) for p in schema.get("patternProperties", {})]
    extras = [
        key for key in instance if key not in properties and not any(r.search(key) for r in regexes)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        shown = ", ".join(repr(e)[:60] for e in sorted(extras, key=str)[:5])
        more = f" and {len(extras) - 5} more" if len(extras) > 5 else ""
        yield ValidationError(f"additional properties are not allowed ({shown}{more})")


def _keywords(budget: _Budget) -> dict[str, Keyword]:
    base: dict[str, Keyword] = dict(jsonschema.Draft202012Validator.VALIDATORS)
    unique, enum, const = base["uniqueItems"], base["enum"], base["const"]

    def unique_items(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        if value and isinstance(instance, list):  # quadratic for unhashable items
            budget.charge(len(instance) ** 2 // 100)
        return unique(validator, value, instance, schema)

    def walked(keyword: Keyword) -> Keyword:
        def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
            budget.charge_walk(value)
            return keyword(validator, value, instance, schema)

        return run

    base.update(
        pattern=_pattern,
        patternProperties=_pattern_properties,
        additionalProperties=_additional_properties,
        uniqueItems=unique_items,
        enum=walked(enum),
        const=walked(const),
    )
    return {name: _bounded(keyword, budget) for name, keyword in base.items()}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _walk_keywords(
    node: Any, at: str, keywords: tuple[str, ...], descend: bool = True
) -> Iterator[tuple[str, str, Any]]:
    """``(where, keyword, value)`` of every key named in ``keywords`` in a schema
    (iteratively: a schema may nest deeply); not inside their values unless ``descend``."""
    stack = [(node, at)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key in keywords:
                    yield f"{at}.{key}", str(key), value
                    if not descend:
                        continue
                stack.append((value, f"{at}.{key}"))
        elif isinstance(node, list):
            stack.extend((value, f"{at}[{i}]") for i, value in enumerate(node))


_PATTERN_KEYWORDS = ("pattern", "patternProperties", "unevaluatedProperties")


def _check_values(schema: Any, where: str) -> None:
    """Refuse an ``enum`` or ``const`` too large to walk at every check (their values are
    data: not searched for more)."""
    for at, keyword, value in _walk_keywords(schema, where, ("enum", "const"), descend=False):
        if (
            keyword == "enum"
            and isinstance(value, list)
            and len(value) > limits.SCHEMA_ENUM_VALUES_MAX
        ):
            raise ConfigError(
                f"{at}: {len(value):,} values; an enum may hold at most "
                f"{limits.SCHEMA_ENUM_VALUES_MAX:,} (check a larger set in a grader)"
            )
        try:
            size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
        except (TypeError, ValueError, RecursionError):
            continue  # not JSON: the meta-schema check names it
        if size > limits.SCHEMA_ENUM_BYTES_MAX:
            raise ConfigError(
                f"{at}: {size:,} bytes of JSON; an enum or const may hold at most "
                f"{limits.SCHEMA_ENUM_BYTES_MAX:,} (check a larger value in a grader)"
            )


def _check_patterns(schema: Any, where: str) -> None:
    uses_unevaluated = uses_patterns = False
    for at, keyword, value in _walk_keywords(schema, where, _PATTERN_KEYWORDS):
        patterns: list[Any] = []
        if keyword == "pattern":
            patterns = [value]
        elif keyword == "patternProperties" and isinstance(value, Mapping):
            patterns = list(value)
            uses_patterns = uses_patterns or bool(patterns)
        elif keyword == "unevaluatedProperties":
            uses_unevaluated = True
        for pattern in patterns:
            if not isinstance(pattern, str):
                continue
            try:
                _regex(pattern)
            except _PatternRefused as exc:
                raise ConfigError(
                    f"{at}: the pattern {pattern[:100]!r} cannot be checked in linear time "
                    f"({exc.reason}); rewrite it without lookaround or backreferences"
                ) from None
    if uses_unevaluated and uses_patterns:
        raise ConfigError(
            f"{where}: `unevaluatedProperties` together with `patternProperties` is not "
            "supported (its patterns would run in a backtracking engine); use "
            "`additionalProperties`"
        )


def item_checker(schema: Any, where: str) -> Callable[[Any, str], None]:
    """A function ``check(item, at)`` that raises :class:`ConfigError` when ``item`` does
    not match ``schema`` (named ``where`` in messages); the schema itself is checked first."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, Mapping):
        raise ConfigError(f"{where}: expected a JSON Schema object, got {type(schema).__name__}")
    _check_patterns(schema, where)
    _check_values(schema, where)
    budget = _Budget()
    cls = jsonschema.validators.extend(jsonschema.Draft202012Validator, _keywords(budget))
    meta = cls(jsonschema.Draft202012Validator.META_SCHEMA, registry=_REGISTRY)
    _first_error(meta, schema, where, "is not a valid JSON Schema", where)
    validator = cls(schema, registry=_REGISTRY)
    budget.item_cap = limits.SCHEMA_ITEM_STEPS_MAX

    def check(item: Any, at: str) -> None:
        budget.item_steps = 0
        _first_error(validator, item, at, "does not match data_source_config.item_schema", where)

    return check


def _first_error(validator: Any, instance: Any, at: str, what: str, schema_at: str) -> None:
    """Raise the most relevant error of ``instance`` at ``at``; problems of the schema
    itself (references, complexity) are named at ``schema_at``."""
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    except referencing.exceptions.Unresolvable as exc:
        ref = str(getattr(exc, "ref", exc))[:200]
        raise ConfigError(
            f"{schema_at}: $ref {ref!r} points outside it; an import resolves references "
            "inside the schema only (nothing is fetched from the network or files)"
        ) from None
    except _TooComplex as exc:
        raise ConfigError(f"{schema_at}: refused while checking {at}: {exc}") from None
    except (RecursionError, MemoryError):
        raise ConfigError(
            f"{schema_at}: refused while checking {at}: the schema or item nests too deeply"
        ) from None
    if error is None:
        return
    path = "".join(f"[{p!r}]" for p in error.absolute_path)
    raise ConfigError(f"{at}{path}: {_clip(error.message, _MESSAGE_CHARS)} ({what})")
