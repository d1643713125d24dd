"""From ``output_text`` to ``extracted_output``: stop sequences, none, regex, json, choice."""

from __future__ import annotations

import pytest

from evalkube.grading import ExtractionMiss, Extractor, apply_stop, parse_output_json

# -- stop sequences -----------------------------------------------------------------------------


def test_stop_cuts_at_the_earliest_sequence_not_the_first_listed() -> None:
    assert apply_stop("answer: 4\nQ: next\n###", ["###", "\nQ:"]) == "answer: 4"


def test_stop_without_match_keeps_everything() -> None:
    assert apply_stop("abc", ["x", "y"]) == "abc"


def test_stop_at_position_zero_gives_empty() -> None:
    assert apply_stop("###abc", ["###"]) == ""


def test_empty_stop_sequences_are_ignored() -> None:
    assert apply_stop("abc", ["", "c"]) == "ab"
    assert apply_stop("abc", []) == "abc"


# -- none ---------------------------------------------------------------------------------------


def test_none_strips_whitespace() -> None:
    assert Extractor("none").extract("  Paris \n") == "Paris"


def test_none_keeps_inner_text() -> None:
    assert Extractor().extract("The answer is 4.") == "The answer is 4."


# -- regex --------------------------------------------------------------------------------------


def test_regex_takes_the_first_group() -> None:
    extractor = Extractor("regex", pattern=r"answer is (-?\d+)")
    assert extractor.extract("I think the answer is -12. Or 13.") == "-12"


def test_regex_takes_the_first_group_of_several() -> None:
    extractor = Extractor("regex", pattern=r"(\d+)\s*/\s*(\d+)")
    assert extractor.extract("ratio 3 / 4") == "3"


def test_regex_without_groups_takes_the_whole_match() -> None:
    extractor = Extractor("regex", pattern=r"-?\d+(?:\.\d+)?")
    assert extractor.extract("About 3.14 or so") == "3.14"


def test_regex_first_match_wins() -> None:
    assert Extractor("regex", pattern=r"(\d+)").extract("1 then 2") == "1"


def test_regex_result_is_stripped() -> None:
    assert Extractor("regex", pattern=r"A:(.*)").extract("A:  yes  ") == "yes"


def test_regex_miss_raises_with_the_pattern() -> None:
    pattern = r"answer is (\d+)"
    with pytest.raises(ExtractionMiss) as info:
        Extractor("regex", pattern=pattern).extract("I am not sure.")
    assert str(info.value) == f"pattern {pattern!r} did not match the output"


def test_regex_ignore_case() -> None:
    assert (
        Extractor("regex", pattern=r"answer: (\w+)", ignore_case=True).extract("ANSWER: Yes")
        == "Yes"
    )
    with pytest.raises(ExtractionMiss):
        Extractor("regex", pattern=r"answer: (\w+)").extract("ANSWER: Yes")


# -- json ---------------------------------------------------------------------------------------


JSON_FOUND = [
    pytest.param("answer", '{"answer": "B", "why": "x"}', "B", id="field"),
    pytest.param(
        "result.label", '{"result": {"label": "positive", "score": 0.9}}', "positive", id="nested"
    ),
    pytest.param(
        "items.1.name", '{"items": [{"name": "a"}, {"name": "b"}]}', "b", id="list-index-in-path"
    ),
    # a value that is not a string is serialized
    pytest.param("n", '{"n": 42}', "42", id="number"),
    pytest.param("v", '{"v": {"a": [1, true]}}', '{"a": [1, true]}', id="object"),
    pytest.param("answer", '```json\n{"answer": "C"}\n```', "C", id="fenced-with-language-tag"),
    pytest.param("answer", '```\n{"answer": "D"}\n```', "D", id="fenced-without-language-tag"),
    pytest.param(
        "answer",
        'Here is my answer:\n```json\n{"answer": "E"}\n```\nHope it helps.',
        "E",
        id="fenced-after-prose",
    ),
    pytest.param(
        "answer",
        'Sure! {"answer": "A"} is my final answer {"answer": "B"}',
        "A",
        id="first-object-embedded-in-text",
    ),
    pytest.param(
        "answer", 'Use {curly} braces: {"answer": "F"}', "F", id="skips-braces-that-are-not-json"
    ),
]


@pytest.mark.parametrize(("field", "text", "expected"), JSON_FOUND)
def test_json_extracts_the_field(field: str, text: str, expected: str) -> None:
    assert Extractor("json", field=field).extract(text) == expected


JSON_MISSES = [
    pytest.param(
        "result.label",
        '{"result": {"score": 1}}',
        r"no field 'result\.label'",
        id="missing-field-named",
    ),
    pytest.param("answer", '{"answer": null}', "is null", id="null-field"),
    pytest.param("answer", "no json here", "no JSON object", id="no-object"),
    pytest.param("a.b", '{"a": "text"}', None, id="path-through-a-scalar"),
    pytest.param("a.5", '{"a": [1]}', None, id="index-out-of-range"),
]


@pytest.mark.parametrize(("field", "text", "match"), JSON_MISSES)
def test_json_miss(field: str, text: str, match: str | None) -> None:
    with pytest.raises(ExtractionMiss, match=match):
        Extractor("json", field=field).extract(text)


# -- choice -------------------------------------------------------------------------------------

CHOICES = ["positive", "negative", "neutral"]


def test_choice_earliest_match_wins() -> None:
    assert Extractor("choice").extract("neutral, maybe negative", CHOICES) == "neutral"
    assert Extractor("choice").extract("negative, maybe neutral", CHOICES) == "negative"


def test_choice_respects_word_boundaries() -> None:
    # "positively" and "nonnegative" contain choices but are not them
    assert Extractor("choice").extract("positively nonnegative: neutral", CHOICES) == "neutral"


def test_choice_boundaries_for_letters() -> None:
    assert Extractor("choice").extract("I pick B, not A", ["A", "B", "C"]) == "B"
    with pytest.raises(ExtractionMiss):
        Extractor("choice").extract("BAD", ["A", "B"])


def test_choice_is_case_sensitive_by_default() -> None:
    with pytest.raises(ExtractionMiss, match="none of the choices"):
        Extractor("choice").extract("Positive!", CHOICES)


def test_choice_ignore_case_returns_the_declared_spelling() -> None:
    assert Extractor("choice", ignore_case=True).extract("POSITIVE!", CHOICES) == "positive"


def test_choice_at_the_same_position_prefers_the_longest() -> None:
    assert Extractor("choice").extract("New York City", ["New", "New York"]) == "New York"


def test_choice_with_regex_metacharacters() -> None:
    assert Extractor("choice").extract("the answer is (c)", ["(a)", "(b)", "(c)"]) == "(c)"
    assert Extractor("choice").extract("pick c++ today", ["c", "c++"]) == "c++"


def test_choice_miss_lists_the_choices() -> None:
    with pytest.raises(ExtractionMiss, match=r"\['positive', 'negative', 'neutral'\]"):
        Extractor("choice").extract("I can't tell", CHOICES)


def test_no_choices_is_a_miss() -> None:
    with pytest.raises(ExtractionMiss, match="needs `choices`"):
        Extractor("choice").extract("positive", [])


def test_regex_optional_group_that_did_not_match_is_a_miss() -> None:
    extractor = Extractor("regex", pattern=r"answer(?: is (\d+))?")
    with pytest.raises(ExtractionMiss, match="first group did not"):
        extractor.extract("the answer, maybe")
    assert extractor.extract("the answer is 42") == "42"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ('{"a": 1}', {"a": 1}),
        ("[1, 2]", [1, 2]),
        (" 3 ", 3),
        ('"x"', "x"),
        ("The answer is 4", None),
        ("", None),
        (None, None),
        ('{"a": NaN}', None),
        ("Infinity", None),
        ("[" * 100_000, None),
        ('\t\r\n {"a": 1}', {"a": 1}),
        ("true", True),
        ("null", None),
        ("nope", None),
        ("\ufeff{}", None),  # json.loads refuses a BOM too
        ("\u00a0{}", None),  # only JSON's own whitespace may lead
    ],
)
def test_output_json(text: str | None, parsed: object) -> None:
    assert parse_output_json(text) == parsed
