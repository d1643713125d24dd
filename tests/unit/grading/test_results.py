"""docs/graders.md, what ``grade()`` may return: every valid and every invalid kind of result."""

from __future__ import annotations

import math
from typing import Any

import pytest

from evalkube import limits
from evalkube.engine.grade import execution_outcome
from evalkube.grading import capped_repr, invalid, is_score, validate_return
from evalkube.sandbox.execution import Execution, from_answer


def assert_invalid(outcome: Any, metric_id: str = "score") -> dict[str, Any]:
    """Invalid means: 0 under metric_id only, counted invalid, judge holds payload + error."""
    assert outcome.status == "invalid"
    assert outcome.scores == {metric_id: 0.0}
    assert outcome.error is not None
    assert set(outcome.error) == {"type", "message", "traceback"}
    assert outcome.error["message"]
    assert isinstance(outcome.judge, dict)
    assert outcome.judge["error"] == outcome.error
    assert isinstance(outcome.judge["invalid_payload"], str)
    return outcome.judge


# -- valid numbers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "stored"),
    [(1, 1.0), (0, 0.0), (-3, -3.0), (0.25, 0.25), (1e300, 1e300), (-0.0, 0.0), (2**70, 2.0**70)],
)
def test_finite_number_is_stored_under_metric_id(value: Any, stored: float) -> None:
    outcome = validate_return(value, "accuracy")
    assert outcome.status == "valid"
    assert outcome.scores == {"accuracy": stored}
    assert isinstance(outcome.scores["accuracy"], float)
    assert outcome.judge is None
    assert outcome.error is None


def test_default_metric_id_is_whatever_the_caller_passes() -> None:
    assert validate_return(0.5, "score").scores == {"score": 0.5}
    assert validate_return(0.5, "exact_match").scores == {"exact_match": 0.5}


# -- invalid kinds, one by one ------------------------------------------------------------------


def test_nan_is_invalid() -> None:
    judge = assert_invalid(validate_return(float("nan"), "m"), "m")
    assert judge["invalid_payload"] == "nan"
    assert "non-finite" in judge["error"]["message"]


@pytest.mark.parametrize(("value", "shown"), [(math.inf, "inf"), (-math.inf, "-inf")])
def test_infinity_is_invalid(value: float, shown: str) -> None:
    judge = assert_invalid(validate_return(value, "m"), "m")
    assert judge["invalid_payload"] == shown
    assert judge["error"]["type"] == "InvalidResult"


@pytest.mark.parametrize("value", [True, False])
def test_bool_is_invalid_not_a_number(value: bool) -> None:
    judge = assert_invalid(validate_return(value, "score"))
    assert judge["invalid_payload"] == repr(value)
    assert "bool" in judge["error"]["message"]


def test_huge_int_is_invalid_not_a_crash() -> None:
    # JSON carries arbitrary-precision ints; float(10**400) overflows.
    judge = assert_invalid(validate_return(10**400, "score"))
    assert judge["invalid_payload"].startswith("1000")


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("1.0", "str"),
        ("", "str"),
        (None, "None"),
        ([1.0], "list"),
        ([], "list"),
        ((1.0, 2.0), "tuple"),
        ({1.0}, "set"),
        (1 + 2j, "complex"),
        (b"1", "bytes"),
    ],
)
def test_non_number_non_dict_is_invalid(value: Any, kind: str) -> None:
    judge = assert_invalid(validate_return(value, "score"))
    assert f"returned {kind}" in judge["error"]["message"]
    assert judge["invalid_payload"] == repr(value)


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"score": 1.0},  # a bare metric dict is not the contract: scores must be under `scores`
        {"judge": {"why": "x"}},
        {"scores": None},
        {"scores": 1.0},
        {"scores": [1.0]},
        {"scores": {}},
    ],
    ids=[
        "empty",
        "no-scores-key",
        "judge-only",
        "scores-none",
        "scores-number",
        "scores-list",
        "scores-empty",
    ],
)
def test_dict_without_scores_is_invalid(value: dict[str, Any]) -> None:
    judge = assert_invalid(validate_return(value, "score"))
    assert "without any finite numeric score" in judge["error"]["message"]
    assert judge["invalid_payload"] == repr(value)


@pytest.mark.parametrize(
    "scores",
    [
        {"a": float("nan")},
        {"a": math.inf, "b": -math.inf},
        {"a": True, "b": False},
        {"a": "1.0", "b": None},
        {"a": [1], "b": {"x": 1}},
        {"a": float("nan"), "b": True, "c": "0.5"},
    ],
)
def test_dict_with_only_non_finite_bool_or_str_scores_is_invalid(scores: dict[str, Any]) -> None:
    outcome = validate_return({"scores": scores, "judge": {"kept": "no"}}, "score")
    judge = assert_invalid(outcome)
    # the judge of an invalid result is the payload + error, not the user's judge
    assert "kept" not in judge


# -- dicts with scores --------------------------------------------------------------------------


def test_dict_scores_are_filtered_to_finite_numbers() -> None:
    outcome = validate_return(
        {
            "scores": {
                "good": 1,
                "half": 0.5,
                "nan": float("nan"),
                "inf": math.inf,
                "ninf": -math.inf,
                "flag": True,
                "text": "1",
                "none": None,
                "list": [1],
            }
        },
        "score",
    )
    assert outcome.status == "valid"
    assert outcome.scores == {"good": 1.0, "half": 0.5}
    assert all(type(v) is float for v in outcome.scores.values())
    assert outcome.error is None


def test_dict_scores_do_not_add_metric_id() -> None:
    outcome = validate_return({"scores": {"a": 1.0}}, "score")
    assert "score" not in outcome.scores


def test_judge_is_kept_as_is() -> None:
    judge = {"reason": "close enough", "nested": {"list": [1, 2, None]}, "n": 3}
    outcome = validate_return({"scores": {"f1": 0.75}, "judge": judge}, "score")
    assert outcome.status == "valid"
    assert outcome.scores == {"f1": 0.75}
    assert outcome.judge == judge


@pytest.mark.parametrize("judge", ["plain text", 42, ["a", "b"], None])
def test_judge_of_any_json_shape_is_kept(judge: Any) -> None:
    outcome = validate_return({"scores": {"x": 0.0}, "judge": judge}, "score")
    assert outcome.status == "valid"
    assert outcome.judge == judge


def test_extra_keys_of_the_dict_are_ignored() -> None:
    outcome = validate_return({"scores": {"x": 1}, "comment": "hi"}, "score")
    assert outcome.status == "valid"
    assert outcome.scores == {"x": 1.0}


def test_non_string_score_names_are_stringified() -> None:
    outcome = validate_return({"scores": {1: 1.0}}, "score")
    assert outcome.scores == {"1": 1.0}


# -- is_score -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, -1, 0.5, 1e308, 2**70])
def test_is_score_accepts_finite_numbers(value: Any) -> None:
    assert is_score(value)


@pytest.mark.parametrize(
    "value",
    [True, False, float("nan"), math.inf, -math.inf, "1", None, [1], 10**400],
    ids=["true", "false", "nan", "inf", "-inf", "str", "none", "list", "huge-int"],
)
def test_is_score_rejects_everything_else(value: Any) -> None:
    assert not is_score(value)


# -- capping ------------------------------------------------------------------------------------


def test_capped_repr_keeps_short_values_whole() -> None:
    assert capped_repr("abc") == "'abc'"
    assert capped_repr([1, 2]) == "[1, 2]"


def test_capped_repr_cuts_at_the_limit_and_says_how_much() -> None:
    text = capped_repr("x" * 5000, limit=100)
    assert text.startswith("'" + "x" * 99)
    assert len(text.split("...")[0]) == 100
    assert text.endswith(f"... [{5002 - 100} more characters]")


def test_capped_repr_default_limit_is_the_invalid_payload_cap() -> None:
    text = capped_repr("y" * 10_000)
    assert text.startswith("'" + "y" * (limits.INVALID_PAYLOAD_REPR_CHARS - 1) + "...")


def test_capped_repr_survives_a_hostile_repr() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert capped_repr(Hostile()) == "<unrepresentable Hostile>"


def test_invalid_payload_of_a_huge_return_is_capped() -> None:
    outcome = validate_return("z" * 50_000, "score")
    judge = assert_invalid(outcome)
    assert len(judge["invalid_payload"]) < limits.INVALID_PAYLOAD_REPR_CHARS + 60
    assert judge["invalid_payload"].endswith("more characters]")


def test_invalid_keeps_traceback_tail_and_caps_message() -> None:
    traceback = "\n".join(f"line {i}" for i in range(100))
    outcome = invalid(
        "m", error_type="ValueError", message="e" * 10_000, traceback=traceback, raw=None
    )
    assert outcome.error is not None
    assert outcome.error["type"] == "ValueError"
    assert len(outcome.error["message"]) == limits.ERROR_MESSAGE_CHARS
    tail = outcome.error["traceback"].splitlines()
    assert len(tail) == limits.TRACEBACK_TAIL_LINES
    assert tail[-1] == "line 99"
    assert tail[0] == f"line {100 - limits.TRACEBACK_TAIL_LINES}"
    assert outcome.judge["invalid_payload"] == "None"


def test_invalid_prefers_an_already_capped_repr() -> None:
    outcome = invalid("m", error_type="T", message="x", raw=[1, 2], raw_repr="<given>")
    assert outcome.judge["invalid_payload"] == "<given>"


# -- exceptions: through the engine's path (worker answer -> Execution -> outcome) --------------


def test_exception_in_grader_is_invalid_with_type_message_traceback() -> None:
    answer = {
        "ok": False,
        "error": {
            "type": "ZeroDivisionError",
            "message": "division by zero",
            "traceback": 'Traceback (most recent call last):\n  File "g.py", line 3, in grade\n'
            "ZeroDivisionError: division by zero",
        },
        "ms": 0.1,
    }
    execution = from_answer(0, answer)
    assert execution.status == "raised"
    outcome = execution_outcome(execution, "exact_match")
    judge = assert_invalid(outcome, "exact_match")
    assert judge["error"]["type"] == "ZeroDivisionError"
    assert judge["error"]["message"] == "division by zero"
    assert 'File "g.py", line 3' in judge["error"]["traceback"]


def test_exception_traceback_is_cut_to_its_tail() -> None:
    long_tb = "\n".join(f"frame {i}" for i in range(200))
    execution = from_answer(
        0, {"ok": False, "error": {"type": "E", "message": "m", "traceback": long_tb}}
    )
    outcome = execution_outcome(execution, "score")
    assert outcome.error is not None
    assert outcome.error["traceback"].splitlines()[-1] == "frame 199"
    assert len(outcome.error["traceback"].splitlines()) == limits.TRACEBACK_TAIL_LINES


def test_returned_value_goes_through_validate_return() -> None:
    assert execution_outcome(from_answer(0, {"ok": True, "value": 0.5}), "m").scores == {"m": 0.5}
    assert execution_outcome(from_answer(0, {"ok": True, "value": True}), "m").status == "invalid"


@pytest.mark.parametrize(("status", "kind"), [("timeout", "Timeout"), ("crashed", "WorkerCrashed")])
def test_host_side_failures_are_invalid(status: Any, kind: str) -> None:
    execution = Execution(0, status, error={"type": kind, "message": "it broke", "traceback": ""})
    judge = assert_invalid(execution_outcome(execution, "score"))
    assert judge["error"]["type"] == kind
    assert judge["error"]["message"] == "it broke"


def test_unserializable_result_is_invalid_and_shows_the_repr() -> None:
    execution = from_answer(
        0,
        {"unserializable": {"type": "object", "repr": "<object at 0x1>", "reason": "nope"}},
    )
    assert execution.status == "unserializable"
    judge = assert_invalid(execution_outcome(execution, "score"))
    assert judge["invalid_payload"] == "<object at 0x1>"
    assert judge["error"]["type"] == "UnserializableResult"


def test_oversized_result_is_invalid() -> None:
    execution = from_answer(0, {"oversized": {"bytes": 5_000_000, "repr": "{'judge': ..."}})
    judge = assert_invalid(execution_outcome(execution, "score"))
    assert judge["error"]["type"] == "ResultTooLarge"
    assert "5000000" in judge["error"]["message"]


@pytest.mark.parametrize("answer", [None, [], "x", {"ms": 1}, {"ok": True}])
def test_malformed_worker_answers_are_protocol_errors(answer: Any) -> None:
    execution = from_answer(3, answer)
    assert execution.index == 3
    assert execution.status == "protocol_error"
    assert_invalid(execution_outcome(execution, "score"))


def test_score_names_past_the_cap_make_the_sample_invalid() -> None:
    """A grader returning more undeclared score names than the cap gets an invalid sample
    that says what to do; declared names do not count towards the cap."""
    flood = {"scores": {f"m{n}": 1.0 for n in range(limits.SCORE_NAMES_PER_SAMPLE + 1)}}
    outcome = validate_return(flood, "score")
    judge = assert_invalid(outcome)
    assert judge["error"]["type"] == "TooManyScores"
    assert "`metrics`" in judge["error"]["message"]
    declared = [f"m{n}" for n in range(10)]
    assert validate_return(flood, "score", declared).status == "valid"
    at_cap = {"scores": {f"m{n}": 1.0 for n in range(limits.SCORE_NAMES_PER_SAMPLE)}}
    assert validate_return(at_cap, "score").status == "valid"


def test_a_score_name_past_the_length_cap_makes_the_sample_invalid() -> None:
    name = "n" * (limits.SCORE_NAME_CHARS + 1)
    judge = assert_invalid(validate_return({"scores": {name: 1.0}}, "score"))
    assert f"{limits.SCORE_NAME_CHARS + 1} characters" in judge["error"]["message"]
    assert len(judge["invalid_payload"]) < 1_000
