"""``calculate_output`` of multi graders: arithmetic evaluated from a whitelisted AST only."""

from __future__ import annotations

import pytest

from evalkube.grading import Formula, FormulaError

NAMES = ("fuzzy", "exact")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("0.5 * fuzzy + 0.5 * exact", 0.5 * 0.8 + 0.5 * 1.0),
        ("fuzzy ^ 2", 0.8**2),
        ("fuzzy ** 2 - -exact", 0.8**2 + 1.0),
        ("min(fuzzy, exact) / 2", 0.4),
        ("max(fuzzy, 0.9, exact)", 1.0),
        ("abs(fuzzy - exact)", abs(0.8 - 1.0)),
        ("floor(fuzzy * 10) + ceil(0.2)", 9.0),
        ("sqrt(exact) + exp(0) + log(exact)", 2.0),
        ("+fuzzy", 0.8),
    ],
)
def test_arithmetic(source: str, expected: float) -> None:
    value = Formula(source, NAMES, "f").evaluate({"fuzzy": 0.8, "exact": 1.0})
    assert value == pytest.approx(expected)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("fuzzy + nope", "unknown name `nope`; use the graders: exact, fuzzy"),
        ("__import__('os').system('id')", "is not allowed"),
        ("fuzzy.__class__", "is not allowed"),
        ("[x for x in ()]", "is not allowed"),
        ("(lambda: 1)()", "is not allowed"),
        ("exact if fuzzy else 0", "is not allowed"),
        ("fuzzy < exact", "is not allowed"),
        ("'a' * 10", "only numbers are allowed"),
        ("True + fuzzy", "only numbers are allowed"),
        ("max(*[1, 2])", "`*` arguments are not allowed"),
        ("round(fuzzy)", "is not allowed"),
        ("min(fuzzy, key=abs)", "is not allowed"),
        ("fuzzy +", "not a formula"),
        ("(" * 300 + "1" + ")" * 300, "too many nested parentheses"),
        ("-" * 990 + "1", "nested too deeply"),
        ("1 + " * 400 + "1", "longer than 1000 characters"),
    ],
)
def test_anything_else_is_refused_naming_the_field(source: str, message: str) -> None:
    with pytest.raises(FormulaError, match=r"^tasks\[t\]\.grader\.calculateOutput: ") as info:
        Formula(source, NAMES, "tasks[t].grader.calculateOutput")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("fuzzy + 1 ^ 2", 0.8 + 1.0),  # ^ binds tighter than + (Python's XOR would not)
        ("2 ^ 3 ^ 2", 512.0),  # and groups from the right: 2 ^ (3 ^ 2)
        ("2 * 3 ^ 2", 18.0),  # tighter than *
        ("-2 ^ 2", -4.0),  # and than unary minus, as in arithmetic
        ("(2 ^ 3) ^ 2", 64.0),
        ("exact ^ fuzzy ^ 0", 1.0),
    ],
)
def test_caret_is_a_power_with_arithmetic_precedence(source: str, expected: float) -> None:
    value = Formula(source, NAMES, "f").evaluate({"fuzzy": 0.8, "exact": 1.0})
    assert value == pytest.approx(expected)


def test_bad_arithmetic_raises_for_that_sample() -> None:
    with pytest.raises(ZeroDivisionError):
        Formula("fuzzy / exact", NAMES, "f").evaluate({"fuzzy": 1.0, "exact": 0.0})
    with pytest.raises(OverflowError):
        Formula("exact ^ 1e9", NAMES, "f").evaluate({"fuzzy": 1.0, "exact": 10.0})
