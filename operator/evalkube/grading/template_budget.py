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
  produced, inside macros and ``{% set %}`` blocks too;
- list, tuple and dict literals and ``{% set %}`` values are charged their size, and the
  operands of ``==``, ``<``, ``in`` (and the tests ``eq``, ``in``, ...) their walk: Python
  compares containers element by element without ever checking the clock.

Sizes (:func:`size_of`) count a shared part each time it appears, as ``str()`` and ``==``
walk it: ``{% set a = [a, a] %}`` forty times is 41 objects that render 2**40 leaves.

Limits: :data:`limits.TEMPLATE_OUTPUT_CHARS`, :data:`limits.TEMPLATE_WORK_CHARS`,
:data:`limits.TEMPLATE_RENDER_SECONDS`. Going past one raises :class:`TemplateBudgetError`
(a Jinja ``SecurityError``), which the caller reports with the field named.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import re
import time
from collections.abc import (
    Callable,
    ItemsView,
    Iterable,
    Iterator,
    Mapping,
    MappingView,
    ValuesView,
)
from string import Formatter
from typing import Any, cast

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import Namespace, pass_context
from jinja2.visitor import NodeTransformer

from evalkube import limits

LOOP = "_evalkube_loop"
OUT = "_evalkube_out"
CONCAT = "_evalkube_concat"
LIST = "_evalkube_list"
TUPLE = "_evalkube_tuple"
DICT = "_evalkube_dict"
ASSIGNED = "_evalkube_assigned"
COMPARED = "_evalkube_compared"
_GROWING = frozenset({"+", "*", "**", "%"})
# printf-style conversion specs: flags, width, precision (``*`` reads them from the args)
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
_DIGITS = re.compile(r"\d+")
_END = object()
_SYMBOLS = {
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "lteq": "<=",
    "gt": ">",
    "gteq": ">=",
    "in": "in",
    "notin": "not in",
}
_COMPARING_TESTS = frozenset(
    {"==", "eq", "equalto", "!=", "ne", ">", "gt", "greaterthan", ">=", "ge"}
    | {"<", "lt", "lessthan", "<=", "le", "in"}
)


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

    def charge(self, size: int, what: str, verb: str = "would build") -> None:
        self.tick()
        if size > limits.TEMPLATE_WORK_CHARS - self.work:
            raise TemplateBudgetError(
                f"{what} {verb} more than {limits.TEMPLATE_WORK_CHARS:,} characters in one render"
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


def _leaf_size(item: Any) -> int | None:
    """Characters of a value with no parts to walk; ``None`` for a container."""
    if isinstance(item, str | bytes):
        return len(item)
    if isinstance(item, bool) or item is None:
        return 5
    if isinstance(item, int):
        return item.bit_length() // 3 + 1
    if isinstance(item, float):
        return 24
    if isinstance(item, range):
        return len(item) * 7
    if isinstance(item, list | tuple | set | frozenset | Mapping | MappingView | Namespace):
        return None
    return 8


def _parts(item: Any) -> tuple[int, Iterator[Any]]:
    """A container's own characters (brackets, separators) and the values inside it."""
    if isinstance(item, Namespace):
        item = getattr(item, "_Namespace__attrs", {})
    if isinstance(item, Mapping):
        return 2 + len(item), itertools.chain.from_iterable(item.items())
    if isinstance(item, ItemsView):  # ``d.items()`` renders a ``(k, v)`` per entry
        return 2 + 5 * len(item), itertools.chain.from_iterable(item)
    return 2 + len(item), iter(item)


class _Open:
    """A container being walked: what it holds, not yet counted, and its size so far."""

    __slots__ = ("container", "parts", "size")

    def __init__(self, container: Any) -> None:
        self.container = container
        self.size, self.parts = _parts(container)


def size_of(value: Any, cap: int = limits.TEMPLATE_WORK_CHARS) -> int:
    """Characters ``value`` stands for when rendered, joined or compared: what building it
    again, or walking it with ``==``, costs. A part held twice counts twice, as ``str()``
    prints it twice: ``{% set a = [a, a] %}`` doubles the size, not the objects.

    Each container is walked once (its size remembered), so that list nested 40 times is
    40 steps, not 2**40; the walk stops as soon as a size passes ``cap`` and returns
    ``cap + 1``, as it does for a container that holds itself (``==`` on it never ends).
    """
    leaf = _leaf_size(value)
    if leaf is not None:
        return leaf
    done: dict[int, tuple[Any, int]] = {}  # the container too: its id stays unique
    walking = {id(value)}
    stack = [_Open(value)]
    steps = 0
    size: int | None
    while True:
        top = stack[-1]
        item = next(top.parts, _END)
        if item is _END:  # every part of ``top`` counted
            stack.pop()
            if not stack:
                return top.size
            walking.discard(id(top.container))
            done[id(top.container)] = (top.container, top.size)
            size = top.size
        else:
            size = _leaf_size(item)
            if size is None:
                if id(item) in walking:  # it holds itself
                    return cap + 1
                if id(item) not in done:
                    walking.add(id(item))
                    stack.append(_Open(item))
                    continue
                size = done[id(item)][1]
        steps += 1
        stack[-1].size += size
        if stack[-1].size > cap or steps > cap:  # a part is never larger than its whole
            return cap + 1


def _compare_size(op: str, side: str, value: Any) -> int:
    """What ``value`` costs as the ``side`` (``left``/``right``) operand of ``op``.

    ``==`` and ordering walk both containers in step (charged as both); ``in`` hashes or
    compares the needle, and walks a list or tuple haystack, while a dict or set haystack
    is one lookup. Strings, numbers and ranges (at most ``MAX_RANGE`` long in the sandbox)
    compare in one pass of C and are not charged.
    """
    if op in ("in", "notin") and side == "right":
        return size_of(value) if isinstance(value, list | tuple | ValuesView) else 0
    return size_of(value) if _leaf_size(value) is None else 0


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


def _test_size(name: str, args: tuple[Any, ...]) -> int:
    """What the comparing tests (``x is eq y``, ``x is in y``) walk; the others are O(1)."""
    if name not in _COMPARING_TESTS:
        return 0
    op = "in" if name == "in" else "eq"
    return sum(
        _compare_size(op, side, arg) for side, arg in zip(("left", "right"), args, strict=False)
    )


def _bounded(function: Callable[..., Any], charge: Callable[..., None]) -> Callable[..., Any]:
    """``function`` with ``charge(args, kwargs)`` first; ``pass_context`` so Jinja never
    calls it while compiling (constant folding)."""
    wants = getattr(getattr(function, "jinja_pass_arg", None), "name", None)

    @pass_context
    @functools.wraps(function)
    def bounded(context: Any, *args: Any, **kwargs: Any) -> Any:
        charge(args, kwargs)
        if wants == "context":
            return function(context, *args, **kwargs)
        if wants == "eval_context":
            return function(context.eval_ctx, *args, **kwargs)
        if wants == "environment":
            return function(context.environment, *args, **kwargs)
        return function(*args, **kwargs)

    return bounded


def _wrap_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` charged its result size first."""

    def charge(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _budget().charge(_filter_size(name, args, kwargs), f"the `{name}` filter")

    return _bounded(function, charge)


def _wrap_test(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` charged the containers it compares first."""

    def charge(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _budget().charge(_test_size(name, args), f"the `{name}` test", "would compare")

    return _bounded(function, charge)


def _loop(iterable: Any) -> Iterator[Any]:
    budget = _budget()
    for item in iterable:
        budget.charge(1, "a loop")
        yield item


def _out(value: Any) -> Any:
    budget = _budget()
    budget.emit(size_of(value, budget.output_cap - budget.output))
    return value


def _concat(*parts: Any) -> str:
    budget = _budget()
    budget.charge(sum(size_of(p) for p in parts), "`~`")
    return "".join(map(str, parts))


def _list(*items: Any) -> list[Any]:
    """A list literal, charged before it exists (``[a, a]`` is twice ``a``)."""
    _budget().charge(size_of(items), "a list literal")
    return list(items)


def _tuple(*items: Any) -> tuple[Any, ...]:
    """A tuple literal, charged before it exists."""
    _budget().charge(size_of(items), "a tuple literal")
    return items


def _dict(*pairs: Any) -> dict[Any, Any]:
    """A dict literal from its keys and values in turn, charged before its keys are hashed
    (hashing a nested tuple walks all of it)."""
    _budget().charge(size_of(pairs), "a dict literal")
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def _assigned(value: Any, what: str) -> Any:
    """A ``{% set %}`` value, charged when it is a container: a list grown in place after
    it was built (``x.append(...)`` where ``x`` is shared) is counted in full here too."""
    if _leaf_size(value) is None:
        _budget().charge(size_of(value), what, "would hold")
    return value


def _compared(value: Any, op: str, side: str) -> Any:
    """An operand of ``op``, charged what comparing it walks (:func:`_compare_size`)."""
    _budget().charge(_compare_size(op, side, value), f"`{_SYMBOLS[op]}`", "would compare")
    return value


# called on every comparison and literal: straight, past the sandbox's per-call checks
_HELPERS = frozenset(map(id, (_loop, _out, _concat, _list, _tuple, _dict, _assigned, _compared)))


class BoundedEnvironment(SandboxedEnvironment):
    """Jinja's sandbox plus the budgets above (compile with :func:`bounded_tree`)."""

    intercepted_binops = _GROWING

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: _wrap_filter(name, f) for name, f in self.filters.items()}
        tests = cast("dict[str, Callable[..., Any]]", self.tests)  # jinja2: dict[str, function]
        for name in _COMPARING_TESTS:
            tests[name] = _wrap_test(name, tests[name])
        self.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs
        self.globals.update(
            {
                LOOP: _loop,
                OUT: _out,
                CONCAT: _concat,
                LIST: _list,
                TUPLE: _tuple,
                DICT: _dict,
                ASSIGNED: _assigned,
                COMPARED: _compared,
            }
        )

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
        if id(__obj) in _HELPERS:  # charged inside, knowing what it does
            kwargs.pop("_loop_vars", None)
            kwargs.pop("_block_vars", None)
            return __obj(*args, **kwargs)
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "a call")
        if isinstance(owner, str):
            size = _str_method_size(name, owner, args, kwargs)
        else:
            size = size_of(args) + size_of(kwargs)
        _budget().charge(size, f"`{name}`")
        return super().call(__context, __obj, *args, **kwargs)


class _Guard(NodeTransformer):
    """Routes every loop, output, ``~``, literal, ``{% set %}`` and comparison of a parsed
    template through the budget."""

    def _call(self, name: str, args: list[Any], lineno: int) -> nodes.Call:
        call = nodes.Call(nodes.Name(name, "load"), args, [], None, None)
        call.set_lineno(lineno)
        return call

    def _compared(self, expr: nodes.Expr, op: str, side: str) -> nodes.Expr:
        if isinstance(expr, nodes.Const):  # a string or number: never charged
            return expr
        return self._call(COMPARED, [expr, nodes.Const(op), nodes.Const(side)], expr.lineno)

    def visit_List(self, node: nodes.List) -> nodes.Node:
        self.generic_visit(node)
        return self._call(LIST, list(node.items), node.lineno)

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        self.generic_visit(node)
        if node.ctx != "load":  # ``{% for k, v in ... %}``: names, not a value
            return node
        return self._call(TUPLE, list(node.items), node.lineno)

    def visit_Dict(self, node: nodes.Dict) -> nodes.Node:
        self.generic_visit(node)
        parts = [part for pair in node.items for part in (pair.key, pair.value)]
        return self._call(DICT, parts, node.lineno)

    def visit_Assign(self, node: nodes.Assign) -> nodes.Node:
        fresh = isinstance(node.node, nodes.Const | nodes.List | nodes.Tuple | nodes.Dict)
        self.generic_visit(node)
        if fresh:  # a constant, or a literal charged as it is built
            return node
        target = node.target
        if isinstance(target, nodes.Name):
            what = f"`{{% set {target.name} %}}`"
        elif isinstance(target, nodes.NSRef):
            what = f"`{{% set {target.name}.{target.attr} %}}`"
        else:
            what = "`{% set %}`"
        node.node = self._call(ASSIGNED, [node.node, nodes.Const(what)], node.lineno)
        return node

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        """Each operand charged as it is evaluated, so ``a < b < c`` still stops early; a
        middle operand is charged as the right of one operator and the left of the next."""
        self.generic_visit(node)
        node.expr = self._compared(node.expr, node.ops[0].op, "left")
        for operand, following in itertools.zip_longest(node.ops, node.ops[1:]):
            operand.expr = self._compared(operand.expr, operand.op, "right")
            if following is not None:
                operand.expr = self._compared(operand.expr, following.op, "left")
        return node

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
