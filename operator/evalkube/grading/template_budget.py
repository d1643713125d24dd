"""A Jinja environment whose templates render within a byte, work and time budget.

Jinja's sandbox stops templates from reaching Python internals, not from spending the
host's memory and time: it folds ``'x' * 500000000`` and ``9 ** (9 ** 9)`` into constants
while *compiling* (gigabytes, or a pinned core, at ``evalkube validate``), and nested
``range`` loops render hundreds of megabytes per sample. Templates come from suite files and
imports, rendered on rows from datasets: all hostile (docs/security.md). Here:

- ``*``, ``**``, ``+`` and ``%`` are intercepted operators: never folded at compile time,
  and at render time refused *before* they run when their result would be larger than the
  budget (the result's size is computed from the operands: ``len(s) * n``, the bits of
  ``a ** b``, the widths of a format string);
- every call (methods, functions, macros) and every filter (wrapped, so never folded
  either) is charged its estimated result size; the ones that grow text by a parameter
  (``center``, ``ljust``, ``replace``, ``join``, ``indent``, ``format``, ``tojson``,
  ``batch``, ``sum``, ...) by their own bound, any other filter by the product of its input
  and its arguments (what it could do with each pair); a generator passed to either (a
  ``map`` or ``select`` result) is drawn into a list first, item by item within the budget,
  so that it is sized like any list;
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
    Sized,
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
# where a printf width or precision can be: digits after ``%`` or a mapping key's ``)`` and
# the flags (a superset of what Python reads: no key, however nested, hides one)
_PRINTF_WIDTH = re.compile(r"[%)][-+ #0]*(\d*)(?:\.(\d*))?")
# a ``*`` width or precision (read from the arguments); after a key it fails before printing
_PRINTF_STAR = re.compile(r"%[-+ #0]*(?:\*|\d*\.\*)")
_DIGITS = re.compile(r"\d+")
# the most characters one number prints as, past its width: ``'%f' % 1e308`` is 316,
# ``'{:,f}'.format(1e308)`` 418 (a float holds 24 in :func:`size_of`)
_NUMBER_CHARS = 420
# every character ``str.splitlines`` breaks a line at (``\r\n`` counts twice: a bound)
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
# filters whose arguments appear at most once in the result, never once per character or
# item: charged their input and arguments, not the product
_ADDITIVE_FILTERS = frozenset({"default", "d", "truncate", "int", "float", "filesizeformat"})
# filters that take their input item by item and apply their arguments (an attribute path,
# a test or filter name) to each: the arguments cost once per item, not per character
_PER_ITEM_FILTERS = frozenset(
    {"map", "select", "reject", "selectattr", "rejectattr", "sort", "unique", "groupby"}
    | {"dictsort", "min", "max", "attr"}
)
# the largest integer a product or power may build (315,652 digits, milliseconds to compute)
_INTEGER_BITS = 1 << 20
# list and tuple methods that compare or reorder every element (``l.count(x)`` walks ``l``)
_WALKING_METHODS = frozenset({"count", "index", "remove", "sort"})
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
        size = max(size, 0)  # a bound computed from a negative width must not refund
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
    return max(number, 0)  # ``' ' * -5`` is empty: a negative size would refund the budget


def _integer(bits: int, what: str) -> None:
    """Refuse an integer of more than :data:`_INTEGER_BITS` bits: Python multiplies big
    integers in superlinear time, inside one call the clock cannot stop (``3 ** 20000000``
    is 13,000,000 characters, within the budget, and seconds of CPU, even while compiling);
    and none that large prints (``str()`` refuses more than 4,300 digits)."""
    if bits > _INTEGER_BITS:
        raise TemplateBudgetError(
            f"{what} would build an integer of more than {_INTEGER_BITS:,} bits"
        )


def _number(digits: str) -> int:
    """The value of a run of digits, at most 10**18 (``int()`` refuses 4,300 digits, and a
    width past 16,000,000 is refused anyway)."""
    digits = digits.lstrip("0")
    return int(digits or "0") if len(digits) <= 18 else 10**18


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _count(value: Any) -> int:
    """How many items (characters, for text) ``value`` holds: an upper bound when it has no
    length."""
    return len(value) if isinstance(value, Sized) else size_of(value)


def _text(value: Any, what: str) -> str:
    """``value`` as the text a filter makes of it (``str(value)``), charged before it is
    built: a list grown after it was built (``x.append(...)`` into ``[x, x]``) may print as
    gigabytes, and sizing an argument must not build them."""
    if isinstance(value, str):
        return value
    _budget().charge(size_of(value), what)
    return str(value)


def _drawn(value: Any, what: str) -> Any:
    """``value`` drawn into a list when it is an iterable without a length (a generator, a
    ``map`` or ``select`` result), each item charged as it comes: the filter or call is
    then sized on all of it (``join`` over a generator of a thousand items is a thousand
    separators, not none), and drawing an endless or huge one stops at the budget."""
    if not isinstance(value, Iterable) or isinstance(value, Sized):
        return value
    budget = _budget()
    items = []
    for item in value:
        budget.charge(size_of(item, limits.TEMPLATE_WORK_CHARS - budget.work) + 1, what)
        items.append(item)
    return items


def _drawn_all(
    args: tuple[Any, ...], kwargs: dict[str, Any], what: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (
        tuple(_drawn(arg, what) for arg in args),
        {name: _drawn(arg, what) for name, arg in kwargs.items()},
    )


def _printf_size(fmt: str, args: Any) -> int:
    """Upper bound of ``fmt % args`` that no spelling of ``fmt`` can fool: each ``%`` prints
    at most all of ``args`` (a mapping key can repeat: ``'%(a)s' * 1000``) padded to the
    widest width or precision ``fmt`` can hold (a key may nest parentheses: ``%(a(b))9s``),
    or a float's digits. A ``*`` width, read from the arguments, is refused."""
    if _PRINTF_STAR.search(fmt):
        raise TemplateBudgetError("`%` formatting: `*` widths are not allowed")
    widest = max(
        (_number(d) for match in _PRINTF_WIDTH.finditer(fmt) for d in match.groups() if d),
        default=0,
    )
    _count_width(widest, "`%` formatting")
    return len(fmt) + fmt.count("%") * (size_of(args) + widest + _NUMBER_CHARS)


def _format_size(fmt: str, args: Iterable[Any]) -> int:
    """Upper bound of ``fmt.format(...)`` or ``format_map``: each replacement field prints at
    most all the arguments (``'{0}' * 1000`` repeats one) padded to the widest width in any
    field, or a float's digits. The fields are read by the parser ``str.format`` uses, up to
    where it fails: what comes before that error is built before it is raised."""
    fields = widest = 0
    try:
        for _literal, name, spec, _conversion in Formatter().parse(fmt):
            if name is None:
                continue
            if spec and "{" in spec:
                raise TemplateBudgetError("str.format: nested replacement fields are not allowed")
            fields += 1
            widest = max([widest, *map(_number, _DIGITS.findall(spec or ""))])
    except ValueError:
        pass
    _count_width(widest, "str.format")
    return len(fmt) + fields * (size_of(list(args)) + widest + _NUMBER_CHARS)


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


def _binop_bits(operator: str, left: Any, right: Any) -> int:
    """Bits of an integer product or power (0 for anything else)."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return 0
    if operator == "**" and right > 0:
        return max(abs(left).bit_length(), 1) * right
    if operator == "*":
        return left.bit_length() + right.bit_length()
    return 0


def _str_method_size(
    method: str, text: str, args: tuple[Any, ...], kwargs: dict[str, Any], what: str = ""
) -> int:
    """Upper bound of ``text.<method>(*args)`` for the methods that grow text (the ``center``
    and ``replace`` filters too, by their parameters' names, charged as ``what``)."""
    values = [*args, *kwargs.values()]
    what = what or f"`{method}`"
    if method in ("center", "ljust", "rjust", "zfill"):
        width = _arg(args, kwargs, 0, "width", 0)
        return max(len(text), _count_width(width if isinstance(width, int) else 0, f"str.{method}"))
    if method == "expandtabs":
        size = _arg(args, kwargs, 0, "tabsize", 8)
        size = size if isinstance(size, int) else 8
        return len(text) + text.count("\t") * _count_width(size, "str.expandtabs")
    if method == "replace" and len(values) >= 2:
        old = _text(_arg(args, kwargs, 0, "old", ""), what)
        new = _text(_arg(args, kwargs, 1, "new", ""), what)
        hits = text.count(old) if old else len(text) + 1
        return len(text) + hits * len(new)
    if method == "join" and values:
        items = values[0]
        return size_of(items) + len(text) * _count(items)
    if method in ("strip", "lstrip", "rstrip") and values:
        # each character stripped is looked for in ``chars``: quadratic in one C call
        return len(text) * (1 + size_of(values[0]))
    if method == "format":
        return _format_size(text, values)
    return len(text) + size_of(values)


def _filter_size(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Upper bound of a filter's result, and of the work it does inside one call."""
    value, rest = (args[0], args[1:]) if args else ("", ())
    what = f"the `{name}` filter"
    if name == "format":  # ``str(value) % (kwargs or args)``
        return _printf_size(_text(value, what), kwargs or rest)
    if name in ("center", "replace"):  # on ``str(value)``: ``(10**4000)|replace('', ...)``
        return _str_method_size(name, _text(value, what), rest, kwargs, what)
    if name == "wordwrap":
        wrap = _arg(rest, kwargs, 2, "wrapstring", None) or "\n"
        return size_of(value) * (1 + len(_text(wrap, what)))
    if name == "join":
        sep = _text(_arg(rest, kwargs, 0, "d", ""), what)
        attribute = _arg(rest, kwargs, 1, "attribute", None)
        per_item = len(sep) + (0 if attribute is None else size_of(attribute))
        return size_of(value) + _count(value) * per_item
    if name == "indent":  # each line (as ``str.splitlines`` cuts them) gets the indent
        width = _arg(rest, kwargs, 0, "width", 4)
        width = len(width) if isinstance(width, str) else int(width)
        lines = 1 + sum(map(value.count, _LINE_BREAKS)) if isinstance(value, str) else 1
        return size_of(value) + lines * _count_width(width, what)
    if name in ("batch", "slice"):  # the last batch, or each slice, padded with ``fill_with``
        count = _arg(rest, kwargs, 0, "linecount" if name == "batch" else "slices", 1)
        fill = _arg(rest, kwargs, 1, "fill_with", None)
        count = _count_width(count, what) if isinstance(count, int) else 1
        return size_of(value) + (0 if fill is None else count * (1 + size_of(fill)))
    if name == "sum":
        attribute = _arg(rest, kwargs, 0, "attribute", None)
        start = _arg(rest, kwargs, 1, "start", 0)
        items = _count(value)
        size = size_of(value) + items * (0 if attribute is None else size_of(attribute))
        if isinstance(start, int | float):
            return size
        # ``start + a + b + ...`` copies the growing total at each step (lists, tuples): the
        # clock cannot stop one call of ``sum``, so the quadratic is refused before it runs
        return (size + size_of(start)) * (items + 1)
    if name == "round":  # ``10 ** precision`` (``floor``, ``ceil``), ``round(n, -precision)``
        precision = _arg(rest, kwargs, 0, "precision", 0)
        if isinstance(precision, int):
            _integer(abs(precision) * 4, what)
            return 6 * (size_of(value) + abs(precision))
    if name in ("tojson", "pprint"):  # a line per item, indented per level it is nested at
        size = size_of(value)
        if 6 * size > limits.TEMPLATE_WORK_CHARS:  # refused as it is
            return 6 * size
        if name == "pprint":  # ``pprint`` indents a mapping's value past its key
            return 6 * size + size * (1 + _nesting(value, keys=True))
        indent = _arg(rest, kwargs, 0, "indent", None)
        width = len(indent) if isinstance(indent, str) else int(indent or 0)
        return 6 * size + size * (1 + _count_width(width, what) * _nesting(value, keys=False))
    size = size_of(value)
    other = sum(size_of(arg) for arg in (*rest, *kwargs.values()))
    if name in _ADDITIVE_FILTERS:
        return 6 * (size + other)
    if name in _PER_ITEM_FILTERS:
        return 6 * size + (_count(value) + 1) * (other + 1)
    # escaping and serializing filters grow text by a bounded factor (``&`` -> ``&amp;``), and
    # an argument may be used once per character or item (``urlize(target=...)`` per link,
    # ``trim(chars)`` looks every character up in ``chars``): charged the product
    return 6 * (size + 1) * (other + 1)


class _Nested:
    """A container being walked by :func:`_nesting`: its items, each with the indentation
    it adds, and the deepest found so far."""

    __slots__ = ("container", "deepest", "items", "step")

    def __init__(self, container: Any, step: int, keys: bool) -> None:
        self.container, self.step, self.deepest = container, step, 0
        if isinstance(container, Namespace):
            container = getattr(container, "_Namespace__attrs", {})
        self.items: Iterator[tuple[Any, int]]
        if isinstance(container, Mapping):
            self.items = ((v, 1 + (size_of(k) + 4 if keys else 0)) for k, v in container.items())
        else:
            self.items = ((item, 1) for item in container)


def _nesting(value: Any, keys: bool) -> int:
    """How far ``value``'s deepest item is indented when it prints an item per line: a level
    per container, plus, with ``keys``, the key each mapping value follows (``pprint``
    aligns a value past its key). Each container is walked once; call it on a value whose
    :func:`size_of` is within the budget (so it does not hold itself)."""
    if _leaf_size(value) is not None:
        return 0
    done: dict[int, tuple[Any, int]] = {}  # the container too: its id stays unique
    stack = [_Nested(value, 0, keys)]
    while True:
        top = stack[-1]
        for item, step in top.items:
            if _leaf_size(item) is not None:
                top.deepest = max(top.deepest, step)
            elif id(item) in done:
                top.deepest = max(top.deepest, step + done[id(item)][1])
            else:
                stack.append(_Nested(item, step, keys))
                break
        else:
            stack.pop()
            if not stack:
                return top.deepest
            done[id(top.container)] = (top.container, top.deepest)
            stack[-1].deepest = max(stack[-1].deepest, top.step + top.deepest)


def _test_size(name: str, args: tuple[Any, ...]) -> int:
    """What the comparing tests (``x is eq y``, ``x is in y``) walk; the others are O(1)."""
    if name not in _COMPARING_TESTS:
        return 0
    op = "in" if name == "in" else "eq"
    return sum(
        _compare_size(op, side, arg) for side, arg in zip(("left", "right"), args, strict=False)
    )


def _bounded(
    function: Callable[..., Any], charge: Callable[..., None], drawn: str | None = None
) -> Callable[..., Any]:
    """``function`` with ``charge(args, kwargs)`` first, its arguments :func:`_drawn` (charged
    as ``drawn``) before when given; ``pass_context`` so Jinja never calls it while
    compiling (constant folding)."""
    wants = getattr(getattr(function, "jinja_pass_arg", None), "name", None)

    @pass_context
    @functools.wraps(function)
    def bounded(context: Any, *args: Any, **kwargs: Any) -> Any:
        if drawn is not None:
            args, kwargs = _drawn_all(args, kwargs, drawn)
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
    """``function`` charged its result size first, a generator it is given drawn first."""

    def charge(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _budget().charge(_filter_size(name, args, kwargs), f"the `{name}` filter")

    return _bounded(function, charge, f"the input of the `{name}` filter")


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
        _integer(_binop_bits(operator, left, right), f"`{operator}`")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if id(__obj) in _HELPERS:  # charged inside, knowing what it does
            kwargs.pop("_loop_vars", None)
            kwargs.pop("_block_vars", None)
            return __obj(*args, **kwargs)
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "a call")
        args, kwargs = _drawn_all(args, kwargs, f"the arguments of `{name}`")
        if isinstance(owner, str):
            size = _str_method_size(name, owner, args, kwargs)
        else:
            size = size_of(args) + size_of(kwargs)
            if name in _WALKING_METHODS and isinstance(owner, list | tuple):
                size += size_of(owner)  # ``l.count(x)`` compares ``x`` with all of ``l``
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
