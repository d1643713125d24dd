"""Compile user code and find its entry point, deciding whether it takes ``ctx``."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

TYPE_CHECKING = False  # typing is not imported at run time: a module costs each fork
if TYPE_CHECKING:
    from typing import Any

#: Entry points and the number of positional data parameters before an optional ``ctx``.
ENTRYPOINTS = {"grade": 2, "grade_batch": 1, "transform": 1, "transform_batch": 1}


class LoadError(Exception):
    """The user code cannot be used; ``info`` is the error payload for the host."""

    def __init__(self, info: dict[str, Any]) -> None:
        super().__init__(info.get("message", ""))
        self.info = info


def wants_ctx(function: Callable[..., Any], data_params: int) -> bool:
    """True when ``function`` takes a ``ctx`` after its data parameters.

    ``ctx`` is the next positional parameter *without a default*; a parameter with a default
    (``weights=[...]``) is the user's own and is left alone.
    """
    if type(function) is types.FunctionType and not hasattr(function, "__wrapped__"):
        # A plain ``def``: read its code object (``inspect`` is a slow import under gVisor).
        count = function.__code__.co_argcount
        first_default = count - len(function.__defaults__ or ())
        return count > data_params and data_params < first_default
    import inspect

    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if len(positional) <= data_params:
        return False
    return positional[data_params].default is inspect.Parameter.empty


def load(
    source: str, filename: str, entrypoint: str, module_name: str
) -> tuple[Callable[..., Any], bool]:
    """Compile ``source`` as module ``module_name``; return ``(entrypoint, wants_ctx)``."""
    if entrypoint not in ENTRYPOINTS:
        raise LoadError({"type": "LoadError", "message": f"unknown entry point {entrypoint}"})
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise LoadError(
            {
                "type": "SyntaxError",
                "message": f"{exc.msg} ({filename}, line {exc.lineno})",
                "line": exc.lineno,
            }
        ) from None
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)
    except BaseException as exc:  # the module body is user code: anything can happen
        raise LoadError(
            {
                "type": type(exc).__name__,
                "message": f"importing {filename} failed: {exc}",
                "line": _user_line(exc, filename),
            }
        ) from None
    function = module.__dict__.get(entrypoint)
    if not callable(function):
        raise LoadError(
            {
                "type": "MissingFunction",
                "message": f"{filename} does not define `{entrypoint}(...)`",
                "line": None,
            }
        )
    return function, wants_ctx(function, ENTRYPOINTS[entrypoint])


def _user_line(exc: BaseException, filename: str) -> int | None:
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
