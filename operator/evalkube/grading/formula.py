"""``calculate_output`` of a ``multi`` grader: arithmetic over sub-grader scores, safely.

The formula comes from a suite author, but it is never run as Python: it is parsed with
:mod:`ast` and only a whitelist of nodes is evaluated (numbers, the sub-graders' names,
``+ - * / ^ **``, unary ``-``/``+`` and the functions OpenAI documented: ``min``, ``max``,
``abs``, ``floor``, ``ceil``, ``exp``, ``sqrt``, ``log``). Anything else (attributes,
subscripts, comprehensions, other names, keyword arguments) is refused when the suite is
loaded, naming the field.

``^`` is a power, as in OpenAI's formulas and in arithmetic: it binds tighter than ``*`` and
unary ``-`` and groups from the right (``a + 1 ^ 2`` is ``a + 1``, ``2 ^ 3 ^ 2`` is 512).
Python parses ``^`` as XOR (looser than ``+``, grouped from the left), so every ``^`` token
becomes ``**`` before parsing; no string can hide one (strings are refused).
"""

from __future__ import annotations

import ast
import io
import math
import tokenize
from collections.abc import Callable, Collection, Mapping

from evalkube import limits

_FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "floor": math.floor,
    "ceil": math.ceil,
    "exp": math.exp,
    "sqrt": math.sqrt,
    "log": math.log,
}
_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: math.pow,
}


def _powers(source: str) -> str:
    """``source`` with each ``^`` operator token spelled ``**`` (Python's power)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return tokenize.untokenize(
        (token.type, "**" if token.exact_type == tokenize.CIRCUMFLEX else token.string)
        for token in tokens
    )


class FormulaError(ValueError):
    """The formula uses something outside the whitelist, or does not parse."""


class Formula:
    """A checked ``calculate_output``, evaluated per sample with the sub-graders' scores."""

    def __init__(self, source: str, names: Collection[str], where: str) -> None:
        if len(source) > limits.FORMULA_CHARS_MAX:
            raise FormulaError(f"{where}: longer than {limits.FORMULA_CHARS_MAX} characters")
        try:
            tree = ast.parse(_powers(source.strip()), mode="eval")
            self._check(tree.body, set(names), where)
        except SyntaxError as exc:
            raise FormulaError(f"{where}: not a formula ({exc.msg})") from None
        except tokenize.TokenError as exc:
            raise FormulaError(f"{where}: not a formula ({exc.args[0]})") from None
        except (RecursionError, MemoryError):
            raise FormulaError(f"{where}: nested too deeply") from None
        self.tree = tree.body
        self.source = source

    def _check(self, node: ast.AST, names: set[str], where: str) -> None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise FormulaError(f"{where}: only numbers are allowed, not {node.value!r}")
        elif isinstance(node, ast.Name):
            if node.id not in names:
                known = ", ".join(sorted(names))
                raise FormulaError(f"{where}: unknown name `{node.id}`; use the graders: {known}")
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            self._check(node.left, names, where)
            self._check(node.right, names, where)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            self._check(node.operand, names, where)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and not node.keywords
            and node.args
        ):
            for arg in node.args:
                if isinstance(arg, ast.Starred):
                    raise FormulaError(f"{where}: `*` arguments are not allowed")
                self._check(arg, names, where)
        else:
            allowed = ", ".join(_FUNCTIONS)
            raise FormulaError(
                f"{where}: `{ast.unparse(node)}` is not allowed; use numbers, the graders' "
                f"names, + - * / ^ and {allowed}"
            )

    def evaluate(self, scores: Mapping[str, float]) -> float:
        """The value for one sample; ``ArithmeticError``/``ValueError`` on a bad operation."""
        return float(self._eval(self.tree, scores))

    def _eval(self, node: ast.AST, scores: Mapping[str, float]) -> float:
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, int | float)
            return float(node.value)
        if isinstance(node, ast.Name):
            return scores[node.id]
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](
                self._eval(node.left, scores), self._eval(node.right, scores)
            )
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, scores)
            return -value if isinstance(node.op, ast.USub) else value
        assert isinstance(node, ast.Call)
        assert isinstance(node.func, ast.Name)
        args = [self._eval(arg, scores) for arg in node.args]
        return float(_FUNCTIONS[node.func.id](*args))
