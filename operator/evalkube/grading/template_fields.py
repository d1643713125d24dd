"""The row fields a template reads, found before any row is rendered.

A template naming a field that no row has (``{{ item.answr }}``) would fail on every sample of
a run; :func:`field_paths` lists the ``item.a.b`` lookups of a template so that ``evalkube
validate`` and ``evalkube import openai`` can check them against the rows first, naming the
template and the first row without the field. Lookups a template guards itself (``| default``,
``is defined``) are optional and not listed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment

Path = tuple[str | int, ...]

_ENV = SandboxedEnvironment()
_GUARDS = frozenset({"default", "d"})
_TESTS = frozenset({"defined", "undefined", "none"})


def _path(node: nodes.Node, namespaces: Collection[str]) -> tuple[str, Path] | None:
    keys: list[str | int] = []
    while isinstance(node, nodes.Getattr | nodes.Getitem):
        if isinstance(node, nodes.Getattr):
            keys.append(node.attr)
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str | int):
            keys.append(node.arg.value)
        else:
            keys.clear()  # a computed key: only the part before it is known
        node = node.node
    if not isinstance(node, nodes.Name) or node.name not in namespaces or not keys:
        return None
    return node.name, tuple(reversed(keys))


def field_paths(source: str, namespaces: Collection[str] = ("item",)) -> list[tuple[str, Path]]:
    """``(namespace, path)`` of each lookup the template always makes (no duplicates, in
    order); ``[]`` for a template that does not parse (its compile error says why)."""
    try:
        tree = _ENV.parse(source)
    except jinja2.TemplateSyntaxError:
        return []
    guarded: set[tuple[str, Path]] = set()  # optional wherever it appears
    for check in tree.find_all((nodes.Filter, nodes.Test)):
        if (isinstance(check, nodes.Filter) and check.name in _GUARDS) or (
            isinstance(check, nodes.Test) and check.name in _TESTS
        ):
            path = _path(check.node, namespaces) if check.node is not None else None
            if path is not None:
                guarded.add(path)
    found: list[tuple[str, Path]] = []
    lookups = [
        node
        for node in tree.find_all((nodes.Getattr, nodes.Getitem))
        if isinstance(node, nodes.Getattr | nodes.Getitem)
    ]
    # a lookup another one extends (its prefixes are lookups too, each extended in turn)
    prefixes = {id(lookup.node) for lookup in lookups}
    for lookup in lookups:
        if id(lookup) in prefixes:
            continue
        path = _path(lookup, namespaces)
        if path is None or path in found:
            continue
        namespace, keys = path
        if any((namespace, keys[:n]) in guarded for n in range(1, len(keys) + 1)):
            continue
        found.append(path)
    return found


def missing(row: Mapping[str, Any], path: Path) -> str | None:
    """The part of ``path`` that ``row`` lacks (``"answr"``, ``"meta.lang"``), or ``None``."""
    value: Any = row
    for depth, key in enumerate(path):
        present = (isinstance(value, Mapping) and key in value) or (
            isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value)
        )
        if not present:
            return ".".join(str(k) for k in path[: depth + 1])
        value = value[key]
    return None


def spelled(namespace: str, path: Iterable[str | int]) -> str:
    """``item.a.b`` / ``item.a[0]``, as a template writes it."""
    return namespace + "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path)
