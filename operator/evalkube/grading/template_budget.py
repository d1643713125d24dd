"""A Jinja environment whose templates render within a byte, work and time budget.

Jinja's sandbox stops templates from reaching Python internals, not from spending the
host's memory and time: it folds ``'x' * 500000000`` and ``9 ** (9 ** 9)`` into constants
while *compiling* (gigabytes, or a pinned core, at ``evalkube validate``), and nested
``range`` loops render hundreds of megabytes per sample. Templates come from suite files and
imports, rendered on rows from datasets: all hostile (DESIGN.md §5). Here:

- ``*``, ``**``, ``+`` and ``%`` are intercepted operators: never folded at compile time,
  and at render time refused *before* they run when their result would be larger than the
  budget (the result's size is computed from the operands: ``len(s) * n``, the bits of
  ``a ** b``, the widths of a format string);
- every call (methods, functions, macros) and every filter (wrapped, so never folded
  either) is charged its estimated result size; the ones that grow text by a parameter
  (``center``, ``ljust``, ``replace``, ``join``, ``indent``, ``format``, ...) by their exact
  bound;
- every loop step and every output checks the wall clock; output is counted as it is
  produced, inside macros and ``{% set %}`` blocks too.

Limits: :data:`limits.TEMPLATE_OUTPUT_CHARS`, :data:`limits.TEMPLATE_WORK_CHARS`,
:data:`limits.TEMPLATE_RENDER_SECONDS`. Going past one raises :class:`TemplateBudgetError`
(a Jinja ``SecurityError``), which the caller reports with the field named.
"""

from __future__ import annotations

import contextvars
import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from string import Formatter
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import Namespace, pass_context
from jinja2.visitor import NodeTransformer

from evalkube import limits

LOOP = "_evalkube_loop"
OUT = "_evalkube_out"
CONCAT = "_evalkube_concat"
_GROWING = frozenset({"+", "*", "**", "%"})
# printf-style conversion specs: flags, width, precision (``*`` reads them from the args)
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
_DIGITS = re.compile(r"\d+")


class TemplateBudgetError(jinja2.exceptions.SecurityError):
    """A template went past its output, work or time budget."""


class _Budget:
    __slots__ = ("deadline", "output", "output_cap", "work")

    def __init__(self, output_cap: int) -> None:
        self.deadline = time.monotonic() + limits.TEMPLATE_RENDER_SECONDS
        self.output = 0
        self.output_cap = output_cap
        self.work = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateBudgetError(
                f"rendering took longer than {limits.TEMPLATE_RENDER_SECONDS:g} s"
            )

    def charge(self, size: int, what: str) -> None:
        self.tick()
        if size > limits.TEMPLATE_WORK_CHARS - self.work:
            raise TemplateBudgetError(
                f"{what} would build more than {limits.TEMPLATE_WORK_CHARS:,} characters "
                "in one render"
            )
        self.work += size

    def emit(self, size: int) -> None:
        self.tick()
        self.output += size
        if self.output > self.output_cap:
            raise TemplateBudgetError(f"renders more than {self.output_cap:,} characters")


_CURRENT: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "evalkube_template_budget", default=None
)


def _budget() -> _Budget:
    """The render's budget (a fresh one when a template is rendered outside
    :func:`render_bounded`)."""
    budget = _CURRENT.get()
    if budget is None:
        budget = _Budget(limits.TEMPLATE_OUTPUT_CHARS)
        _CURRENT.set(budget)
    return budget


def size_of(value: Any, cap: int = limits.TEMPLATE_WORK_CHARS) -> int:
    """Characters ``value`` stands for when rendered or joined (deep, each object once,
    stopping past ``cap``): what building it again would cost."""
    total = 0
    seen: set[int] = set()
    stack = [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += len(item)
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 1
        elif isinstance(item, float):
            total += 24
        elif isinstance(item, range):
            total += len(item) * 7
        elif id(item) in seen:
            continue
        elif isinstance(item, list | tuple | set | frozenset):
            seen.add(id(item))
            total += 2 + len(item)
            stack.extend(item)
        elif isinstance(item, Mapping):
            seen.add(id(item))
            total += 2 + len(item)
            for key, entry in item.items():
                stack.extend((key, entry))
        elif isinstance(item, Namespace):
            seen.add(id(item))
            stack.append(dict(getattr(item, "_Namespace__attrs", {})))
        else:
            total += 8
    return total


def _count_width(number: int, what: str) -> int:
    if number > limits.TEMPLATE_WORK_CHARS:
        raise TemplateBudgetError(f"{what}: a width of {number:,} characters")
    return number


def _printf_size(fmt: str, args: Any) -> int:
    """Upper bound of ``fmt % args``: the format, the arguments and every width."""
    extra = 0
    for match in _PRINTF.finditer(fmt):
        for part in match.groups():
            if part == "*":
                raise TemplateBudgetError("`%` formatting: `*` widths are not allowed")
            if part:
                extra += _count_width(int(part), "`%` formatting")
    return len(fmt) + size_of(args) + extra


def _format_size(fmt: str, args: Iterable[Any]) -> int:
    """Upper bound of ``fmt.format(...)``: widths in its replacement fields counted."""
    extra = 0
    try:
        fields = list(Formatter().parse(fmt))
    except ValueError:
        return len(fmt) + size_of(list(args))
    for _literal, _name, spec, _conversion in fields:
        if spec and "{" in spec:
            raise TemplateBudgetError("str.format: nested replacement fields are not allowed")
        for number in _DIGITS.findall(spec or ""):
            extra += _count_width(int(number), "str.format")
    return len(fmt) + size_of(list(args)) + extra


def _binop_size(operator: str, left: Any, right: Any) -> int:
    """The result size of ``left <operator> right`` before computing it."""
    if operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0:
            bits = max(abs(left).bit_length(), 1) * right
            return bits // 3 + 1
        return 24
    if operator == "*":
        sequence, count = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(count, int) and isinstance(sequence, str | list | tuple):
            return size_of(sequence) * max(count, 0)
        return size_of(left) + size_of(right)
    if operator == "%" and isinstance(left, str):
        return _printf_size(left, right)
    return size_of(left) + size_of(right)


def _str_method_size(method: str, text: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Upper bound of ``text.<method>(*args)`` for the methods that grow text."""
    values = [*args, *kwargs.values()]
    if method in ("center", "ljust", "rjust", "zfill"):
        width = values[0] if values and isinstance(values[0], int) else 0
        return max(len(text), _count_width(width, f"str.{method}"))
    if method == "expandtabs":
        size = values[0] if values and isinstance(values[0], int) else 8
        return len(text) + text.count("\t") * _count_width(size, "str.expandtabs")
    if method == "replace" and len(values) >= 2:
        old, new = str(values[0]), str(values[1])
        hits = text.count(old) if old else len(text) + 1
        return len(text) + hits * len(new)
    if method == "join" and values:
        items = values[0]
        count = len(items) if hasattr(items, "__len__") else 0
        return size_of(items) + len(text) * count
    if method == "format":
        return _format_size(text, values)
    return len(text) + size_of(values)


def _filter_size(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Upper bound of a filter's result, for the filters that grow their input."""
    value, rest = (args[0], args[1:]) if args else ("", ())
    if name == "format" and isinstance(value, str):
        return _printf_size(value, rest)
    if name in ("center", "replace") and isinstance(value, str):
        return _str_method_size(name, value, rest, kwargs)
    if name == "wordwrap":
        wrap = rest[2] if len(rest) > 2 else kwargs.get("wrapstring") or "\n"
        return size_of(value) * (1 + len(str(wrap)))
    if name == "join":
        sep = rest[0] if rest else kwargs.get("d", "")
        count = len(value) if hasattr(value, "__len__") else 0
        return size_of(value) + len(str(sep)) * count
    if name == "indent":
        width = rest[0] if rest else kwargs.get("width", 4)
        width = len(width) if isinstance(width, str) else width
        lines = str(value).count("\n") + 1 if isinstance(value, str) else 1
        return size_of(value) + lines * _count_width(int(width), "indent")
    if name in ("slice", "batch"):
        count = rest[0] if rest else 1
        if isinstance(count, int):
            _count_width(count, name)
    # escaping and serializing filters grow text by a bounded factor (``&`` -> ``&amp;``)
    return 6 * (size_of(args) + size_of(kwargs))


def _wrap_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` charged its result size first; ``pass_context`` so Jinja never calls it
    while compiling (constant folding)."""
    wants = getattr(getattr(function, "jinja_pass_arg", None), "name", None)

    @pass_context
    @functools.wraps(function)
    def bounded(context: Any, *args: Any, **kwargs: Any) -> Any:
        _budget().charge(_filter_size(name, args, kwargs), f"the `{name}` filter")
        if wants == "context":
            return function(context, *args, **kwargs)
        if wants == "eval_context":
            return function(context.eval_ctx, *args, **kwargs)
        if wants == "environment":
            return function(context.environment, *args, **kwargs)
        return function(*args, **kwargs)

    return bounded


def _loop(iterable: Any) -> Iterator[Any]:
    budget = _budget()
    for item in iterable:
        budget.charge(1, "a loop")
        yield item


def _out(value: Any) -> Any:
    _budget().emit(size_of(value))
    return value


def _concat(*parts: Any) -> str:
    budget = _budget()
    budget.charge(sum(size_of(p) for p in parts), "`~`")
    return "".join(map(str, parts))


class BoundedEnvironment(SandboxedEnvironment):
    """Jinja's sandbox plus the budgets above (compile with :func:`bounded_tree`)."""

    intercepted_binops = _GROWING

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: _wrap_filter(name, f) for name, f in self.filters.items()}
        self.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs
        self.globals.update({LOOP: _loop, OUT: _out, CONCAT: _concat})

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format``/``format_map`` as Jinja's sandbox wraps them, charged first."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        text: str = value.__self__

        def bounded(*args: Any, **kwargs: Any) -> str:
            _budget().charge(_format_size(text, [*args, *kwargs.values()]), "str.format")
            return wrapped(*args, **kwargs)

        return bounded

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _budget().charge(_binop_size(operator, left, right), f"`{operator}`")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "a call")
        if isinstance(owner, str):
            size = _str_method_size(name, owner, args, kwargs)
        elif __obj is _loop or __obj is _out or __obj is _concat:
            size = 0
        else:
            size = size_of(args) + size_of(kwargs)
        _budget().charge(size, f"`{name}`")
        return super().call(__context, __obj, *args, **kwargs)


class _Guard(NodeTransformer):
    """Routes every loop, output and ``~`` of a parsed template through the budget."""

    def _call(self, name: str, args: list[Any], lineno: int) -> nodes.Call:
        call = nodes.Call(nodes.Name(name, "load"), args, [], None, None)
        call.set_lineno(lineno)
        return call

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = self._call(LOOP, [node.iter], node.lineno)
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [
            self._call(
                OUT,
                [nodes.Const(child.data) if isinstance(child, nodes.TemplateData) else child],
                node.lineno,
            )
            for child in node.nodes
        ]
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return self._call(CONCAT, list(node.nodes), node.lineno)


def _fold(node: nodes.Node, environment: BoundedEnvironment) -> Any:
    """The value of a constant expression, its growing operators run within the budget."""
    if isinstance(node, nodes.BinExpr) and node.operator in _GROWING:
        left, right = _fold(node.left, environment), _fold(node.right, environment)
        return environment.call_binop(None, node.operator, left, right)
    if isinstance(node, nodes.Expr):
        return node.as_const(nodes.EvalContext(environment))
    raise nodes.Impossible()


def check_constants(tree: nodes.Template, environment: BoundedEnvironment) -> None:
    """Refuse, while compiling, a constant expression whose value is over budget
    (``{{ 'x' * 500000000 }}``, ``{{ 9 ** (9 ** 9) }}``): the error then comes at
    ``validate``, not on every sample. :class:`TemplateBudgetError` names what."""
    token = _CURRENT.set(_Budget(limits.TEMPLATE_OUTPUT_CHARS))
    try:
        for node in tree.find_all(nodes.BinExpr):
            if node.operator in _GROWING:
                try:
                    _fold(node, environment)
                except nodes.Impossible:
                    continue
                except TemplateBudgetError as exc:
                    raise TemplateBudgetError(f"line {node.lineno}: {exc}") from None
                except Exception:  # the expression fails at render time too: say it there
                    continue
    finally:
        _CURRENT.reset(token)


def bounded_tree(tree: nodes.Template, environment: jinja2.Environment) -> nodes.Template:
    """``tree`` with its loops, outputs and concatenations charged to the budget."""
    guarded = _Guard().visit(tree)
    assert isinstance(guarded, nodes.Template)
    guarded.set_environment(environment)
    return guarded


def render_bounded(template: jinja2.Template, variables: Mapping[str, Any], output_cap: int) -> str:
    """Render with a fresh budget; :class:`TemplateBudgetError` past it."""
    token = _CURRENT.set(_Budget(output_cap))
    try:
        return template.render(variables)
    finally:
        _CURRENT.reset(token)
