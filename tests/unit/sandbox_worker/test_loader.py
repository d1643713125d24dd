"""Worker side: compiling user code, finding entry points, deciding whether to pass ``ctx``."""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

from evalkube_sandbox.loader import ENTRYPOINTS, LoadError, load, wants_ctx

_counter = iter(range(1_000_000))


@pytest.fixture(autouse=True)
def _clean_modules() -> Iterator[None]:
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("evalkube_user_test_"):
            del sys.modules[name]


def load_source(source: str, entrypoint: str = "grade", filename: str = "/graders/g.py") -> Any:
    return load(source, filename, entrypoint, f"evalkube_user_test_{next(_counter)}")


def load_error(source: str, entrypoint: str = "grade", filename: str = "/graders/g.py") -> dict:
    with pytest.raises(LoadError) as info:
        load_source(source, entrypoint, filename)
    return info.value.info


# -- signature detection ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signature", "expected"),
    [
        ("sample, item", False),
        ("sample, item, ctx", True),
        ("s, i, context", True),  # the name does not matter, the position does
        ("sample, item, weights=[0.5, 0.5]", False),
        ("sample, item, weights=None, scale=1.0", False),
        ("sample, item, ctx, weights=[1]", True),
        ("*args", False),
        ("sample, *args", False),
        ("sample, item, *args", False),
        ("*args, **kwargs", False),
        ("sample, item, *, ctx", False),  # keyword-only: never passed positionally
        ("sample, item, *, ctx=None", False),
        ("sample, item, **kwargs", False),
        ("sample, item, ctx, /", True),  # positional-only
        ("sample, /, item, ctx", True),
        ("sample", False),
    ],
)
def test_grade_signature_detection(signature: str, expected: bool) -> None:
    function, takes_ctx = load_source(f"def grade({signature}):\n    return 1.0\n")
    assert takes_ctx is expected
    assert wants_ctx(function, 2) is expected


@pytest.mark.parametrize(
    ("entrypoint", "signature", "expected"),
    [
        ("grade_batch", "samples", False),
        ("grade_batch", "samples, ctx", True),
        ("grade_batch", "samples, top_k=3", False),
        ("transform", "row", False),
        ("transform", "row, ctx", True),
        ("transform_batch", "rows", False),
        ("transform_batch", "rows, ctx", True),
    ],
)
def test_other_entrypoints(entrypoint: str, signature: str, expected: bool) -> None:
    _, takes_ctx = load_source(f"def {entrypoint}({signature}):\n    return None\n", entrypoint)
    assert takes_ctx is expected


def test_entrypoint_table() -> None:
    assert ENTRYPOINTS == {"grade": 2, "grade_batch": 1, "transform": 1, "transform_batch": 1}


def test_lambda_and_callable_instances() -> None:
    _, takes = load_source("grade = lambda sample, item, ctx: 1.0\n")
    assert takes is True
    source = (
        "class Grader:\n"
        "    def __call__(self, sample, item, ctx):\n"
        "        return 1.0\n"
        "grade = Grader()\n"
    )
    _, takes = load_source(source)
    assert takes is True  # ``self`` is bound, not a data parameter


def test_partial_hides_bound_parameters() -> None:
    def raw(scale: float, sample: Any, item: Any, ctx: Any) -> float:
        return scale

    assert wants_ctx(functools.partial(raw, 2.0), 2) is True
    assert wants_ctx(functools.partial(raw, 2.0, ctx=None), 2) is False


def test_builtin_without_signature_is_not_given_ctx() -> None:
    assert wants_ctx(print, 2) is False  # print has *args: nothing to decide from
    assert wants_ctx(dict, 2) is False  # no inspectable signature


def test_decorated_function_uses_the_wrapped_signature() -> None:
    source = (
        "import functools\n"
        "def deco(f):\n"
        "    @functools.wraps(f)\n"
        "    def inner(*a, **k):\n"
        "        return f(*a, **k)\n"
        "    return inner\n"
        "@deco\n"
        "def grade(sample, item, ctx):\n"
        "    return 1.0\n"
    )
    _, takes = load_source(source)
    assert takes is True


def test_loaded_function_runs_and_sees_its_module_globals() -> None:
    source = "THRESHOLD = 0.5\ndef grade(sample, item):\n    return THRESHOLD\n"
    function, _ = load_source(source)
    assert function({}, {}) == 0.5
    assert function.__module__.startswith("evalkube_user_test_")


def test_module_is_registered_so_dataclasses_and_pickle_work() -> None:
    source = (
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class Result:\n"
        "    value: float\n"
        "def grade(sample, item):\n"
        "    return Result(0.25).value\n"
    )
    function, _ = load_source(source)
    assert function({}, {}) == 0.25


def test_code_is_compiled_with_the_filename() -> None:
    function, _ = load_source(
        "def grade(sample, item):\n    return 1 / 0\n", filename="/suite/graders/div.py"
    )
    with pytest.raises(ZeroDivisionError) as info:
        function({}, {})
    frames = traceback.extract_tb(info.value.__traceback__)
    assert ("/suite/graders/div.py", 2, "grade") in [(f.filename, f.lineno, f.name) for f in frames]


def test_future_imports_of_the_host_do_not_leak() -> None:
    # the worker compiles with dont_inherit: annotations stay evaluated as in a plain module
    function, _ = load_source("def grade(sample, item) -> 'int':\n    return 1\n")
    assert function.__annotations__ == {"return": "int"}


# -- load errors --------------------------------------------------------------------------------


def test_syntax_error_reports_the_line() -> None:
    info = load_error("def grade(sample, item):\n    x = 1\n    return x +\n")
    assert info["type"] == "SyntaxError"
    assert info["line"] == 3
    assert "(/graders/g.py, line 3)" in info["message"]


def test_missing_function() -> None:
    info = load_error("def score(sample, item):\n    return 1\n")
    assert info == {
        "type": "MissingFunction",
        "message": "/graders/g.py does not define `grade(...)`",
        "line": None,
    }


def test_entrypoint_that_is_not_callable() -> None:
    info = load_error("grade = 1.0\n")
    assert info["type"] == "MissingFunction"


def test_wrong_entrypoint_for_the_contract() -> None:
    info = load_error("def grade(sample, item):\n    return 1\n", entrypoint="grade_batch")
    assert info["message"] == "/graders/g.py does not define `grade_batch(...)`"


def test_unknown_entrypoint() -> None:
    info = load_error("def main(): pass\n", entrypoint="main")
    assert info["type"] == "LoadError"


def test_import_time_exception_reports_type_message_and_user_line() -> None:
    source = (
        "import json\n\nCONFIG = json.loads('{broken')\n\ndef grade(sample, item):\n    return 1\n"
    )
    info = load_error(source)
    assert info["type"] == "JSONDecodeError"
    assert info["message"].startswith("importing /graders/g.py failed: ")
    assert info["line"] == 3


def test_import_of_a_missing_module() -> None:
    info = load_error("import definitely_not_installed_xyz\ndef grade(s, i):\n    return 1\n")
    assert info["type"] == "ModuleNotFoundError"
    assert "definitely_not_installed_xyz" in info["message"]
    assert info["line"] == 1


@pytest.mark.parametrize(
    ("source", "error_type", "line"),
    [
        # an indentation error is a syntax error, with its line
        pytest.param("def grade(sample, item):\nreturn 1\n", "SyntaxError", 2, id="indentation"),
        # SystemExit and KeyboardInterrupt at import are load errors, not an exit
        pytest.param("raise SystemExit(3)\n", "SystemExit", 1, id="system-exit-at-import"),
        pytest.param(
            "def grade(s, i):\n    return 1\nraise KeyboardInterrupt\n",
            "KeyboardInterrupt",
            3,
            id="keyboard-interrupt-at-import",
        ),
    ],
)
def test_a_load_error_names_its_type_and_line(source: str, error_type: str, line: int) -> None:
    info = load_error(source)
    assert info["type"] == error_type
    assert info["line"] == line


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def grade(sample, item): ...", False),
        ("def grade(sample, item, ctx): ...", True),
        ("def grade(sample, item, weights=(1, 2)): ...", False),
        ("def grade(sample, item, ctx, weights=(1, 2)): ...", True),
        ("def grade(sample, item, /, ctx): ...", True),
        ("def grade(sample, item, *, ctx=None): ...", False),
        ("def grade(sample, item, *args): ...", False),
        (
            "import functools\n"
            "def deco(f):\n"
            "    @functools.wraps(f)\n"
            "    def inner(*a):\n"
            "        return f(*a)\n"
            "    return inner\n"
            "@deco\n"
            "def grade(sample, item, ctx): ...",
            True,
        ),
        ("class G:\n    def __call__(self, sample, item, ctx): ...\ngrade = G()", True),
    ],
)
def test_ctx_detection_plain_functions_and_others(source: str, expected: bool) -> None:
    _function, wants = load(source, "/graders/g.py", "grade", "evalkube_user_ctx_test")
    assert wants is expected
