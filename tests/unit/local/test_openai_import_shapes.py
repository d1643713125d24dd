"""Any field of an OpenAI export replaced by any JSON value: the import succeeds or raises
:class:`ConfigError` (exit 2 with the field named), never another exception (a traceback)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalkube.local.openai_import import import_openai
from evalkube.models import ConfigError

EXPORT = json.loads(
    (Path(__file__).parent.parent.parent / "fixtures" / "openai_eval_export.json").read_text()
)


def _paths(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [at]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*at, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*at, index))
    return found


PATHS = _paths(EXPORT)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)


def _replaced(path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    changed = copy.deepcopy(EXPORT)
    node = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return changed


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=JSON)
def test_any_field_of_any_shape_is_a_config_error_or_imports(
    path: tuple[Any, ...], value: Any
) -> None:
    message = ""
    try:
        import_openai(_replaced(path, value))
    except ConfigError as exc:
        message = str(exc) or "(empty)"
    assert message != "(empty)"
