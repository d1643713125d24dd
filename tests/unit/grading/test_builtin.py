"""Built-in graders (string_check, text_similarity) against the libraries OpenAI's docs name.

Each expected value is computed here, independently, by calling rapidfuzz, sacrebleu, nltk
and rouge-score directly on the same fixed texts.
"""

from __future__ import annotations

import warnings

import pytest
from nltk.translate.gleu_score import sentence_gleu
from rapidfuzz import fuzz
from rouge_score import rouge_scorer
from sacrebleu import sentence_bleu as sacrebleu_sentence_bleu

from evalkube import limits
from evalkube.grading import BuiltinGrader, Formula, MultiGrader, TemplateError

CANDIDATE = "The quick brown fox jumps over the lazy dog near the river bank"
REFERENCE = "A quick brown fox jumped over the lazy dog near the river bank today"
SAMPLE = {"output_text": CANDIDATE, "output_json": None, "output_tools": []}
ITEM = {"answer": REFERENCE}


def grader(kind: str, **fields: str) -> BuiltinGrader:
    return BuiltinGrader(
        kind,
        input=fields.pop("input", "{{ sample.output_text }}"),
        reference=fields.pop("reference", "{{ item.answer }}"),
        metric_id="m",
        where="tasks[t].grader",
        **fields,
    )


def score(kind: str, **fields: str) -> float:
    outcome = grader(kind, **fields).grade(SAMPLE, ITEM)
    assert outcome.status == "valid", outcome.error
    return outcome.scores["m"]


def _ngram(fn: object) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(fn([REFERENCE.split()], CANDIDATE.split()))  # type: ignore[operator]


def _rouge(kind: str) -> float:
    return rouge_scorer.RougeScorer([kind]).score(REFERENCE, CANDIDATE)[kind].fmeasure


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("fuzzy_match", lambda: fuzz.WRatio(CANDIDATE, REFERENCE) / 100),
        ("bleu", lambda: sacrebleu_sentence_bleu(CANDIDATE, [REFERENCE]).score / 100),
        ("gleu", lambda: _ngram(sentence_gleu)),
        ("rouge_1", lambda: _rouge("rouge1")),
        ("rouge_2", lambda: _rouge("rouge2")),
        ("rouge_3", lambda: _rouge("rouge3")),
        ("rouge_4", lambda: _rouge("rouge4")),
        ("rouge_5", lambda: _rouge("rouge5")),
        ("rouge_l", lambda: _rouge("rougeL")),
    ],
)
def test_text_similarity_matches_the_library(metric: str, expected: object) -> None:
    value = expected()  # type: ignore[operator]
    assert 0.0 < value < 1.0  # the fixed texts are neither equal nor disjoint
    assert score("text_similarity", evaluation_metric=metric) == pytest.approx(value, abs=1e-12)


@pytest.mark.parametrize(
    ("text", "reference"),
    [
        ("Paris", "Paris"),
        ("the cat sat", "the cat sat"),
        (
            "The quick brown fox jumps over the lazy dog.",
            "The quick brown fox jumps over the lazy dog.",
        ),
        ("Paris", "London"),
        ("Paris, France", "Paris"),
        ("the cat sat on a mat", "the cat sat on the mat"),
        ("42", "The answer is 42."),
    ],
)
def test_bleu_is_sacrebleus_sentence_bleu(text: str, reference: str) -> None:
    """sacrebleu's documented sentence BLEU (smoothed, effective order): identical texts
    score 1.0 however short; nltk's unsmoothed sentence_bleu gave "Paris" 1.8e-231."""
    expected = sacrebleu_sentence_bleu(text, [reference]).score / 100
    value = grader("text_similarity", evaluation_metric="bleu", reference="{{ item.r }}").grade(
        {"output_text": text}, {"r": reference}
    )
    assert value.scores["m"] == pytest.approx(expected, abs=1e-12)
    if text == reference:
        assert value.scores["m"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("operation", "text", "reference", "expected"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "Paris", "paris", 0.0),
        ("ne", "Paris", "paris", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "It is Paris.", "Paris", 1.0),
        ("like", "It is PARIS.", "Paris", 0.0),
        ("ilike", "It is PARIS.", "paris", 1.0),
        ("ilike", "It is Lyon.", "paris", 0.0),
    ],
)
def test_string_check(operation: str, text: str, reference: str, expected: float) -> None:
    check = grader("string_check", operation=operation, reference="{{ item.r }}")
    outcome = check.grade({"output_text": text}, {"r": reference})
    assert outcome.scores == {"m": expected}
    assert outcome.judge == {"input": text, "reference": reference}


def test_templates_read_output_json() -> None:
    check = grader("string_check", operation="eq", input="{{ sample.output_json.city }}")
    outcome = check.grade({"output_json": {"city": "Rome"}}, {"answer": "Rome"})
    assert outcome.scores == {"m": 1.0}


def test_a_missing_field_is_an_invalid_sample_not_an_engine_error() -> None:
    outcome = grader("string_check", operation="eq").grade(SAMPLE, {})
    assert outcome.status == "invalid"
    assert outcome.scores == {"m": 0.0}
    assert outcome.error is not None
    assert "'answer'" in outcome.error["message"]


def test_oversized_model_output_is_invalid() -> None:
    huge = {"output_text": "x" * (limits.BUILTIN_INPUT_CHARS + 1)}
    outcome = grader("text_similarity", evaluation_metric="bleu").grade(huge, ITEM)
    assert outcome.status == "invalid"
    assert outcome.error is not None
    assert outcome.error["type"] == "InputTooLarge"


def test_an_unknown_namespace_in_a_builtin_template_names_the_field() -> None:
    with pytest.raises(TemplateError, match=r"^tasks\[t\]\.grader\.reference: unknown name"):
        grader("string_check", operation="eq", reference="{{ itme.answer }}")


def multi(formula: str) -> MultiGrader:
    graders = {
        "a": grader("string_check", operation="eq"),
        "b": grader("string_check", operation="ne"),
    }
    return MultiGrader(graders, Formula(formula, graders, "f"), "m")


def test_multi_scores_and_keeps_each_graders_score() -> None:
    outcome = multi("a * 0.25 + b").grade(SAMPLE, ITEM)
    assert outcome.scores == {"m": 1.0}
    assert outcome.judge == {"scores": {"a": 0.0, "b": 1.0}}


@pytest.mark.parametrize(
    ("formula", "item", "kind"),
    [
        ("b / a", ITEM, "ZeroDivisionError"),
        ("log(a)", ITEM, "ValueError"),
        ("a + b", {}, "TemplateError"),
    ],
)
def test_multi_failures_make_the_sample_invalid(
    formula: str, item: dict[str, str], kind: str
) -> None:
    outcome = multi(formula).grade(SAMPLE, item)
    assert outcome.status == "invalid"
    assert outcome.scores == {"m": 0.0}
    assert outcome.error is not None
    assert outcome.error["type"] == kind


def test_rouge_l_refuses_texts_whose_lcs_would_stall_the_engine() -> None:
    words = " ".join(["w"] * 2_001)  # 2001 x 2001 words > 4M pairs; under the character cap
    assert len(words) < limits.BUILTIN_INPUT_CHARS
    outcome = grader("text_similarity", evaluation_metric="rouge_l", input="{{ item.answer }}",
                     reference="{{ item.answer }}").grade({}, {"answer": words})  # fmt: skip
    assert outcome.status == "invalid"
    assert outcome.error is not None
    assert outcome.error["type"] == "InputTooLarge"
    assert "rouge_1..rouge_5" in outcome.error["message"]


# -- meteor: nltk's meteor_score over WordNet 3.0 from Debian's packages ---------------------
#: nltk's own doctest (nltk/translate/meteor_score.py), computed with nltk's downloaded WordNet:
#: the same value from the system's WordNet shows the two databases agree where it matters.
NLTK_HYPOTHESIS = (
    "It is a guide to action which ensures that the military always obeys the commands of the party"
)
NLTK_REFERENCE = (
    "It is a guide to action that ensures that the military will forever heed Party commands"
)


def meteor(text: str, reference: str) -> float:
    scorer = grader(
        "text_similarity",
        evaluation_metric="meteor",
        input="{{ item.text }}",
        reference="{{ item.answer }}",
    )
    outcome = scorer.grade({}, {"text": text, "answer": reference})
    assert outcome.status == "valid", outcome.error
    return outcome.scores["m"]


def test_meteor_gives_nltks_documented_scores() -> None:
    assert round(meteor(NLTK_HYPOTHESIS, NLTK_REFERENCE), 4) == 0.6944
    assert meteor("non matching hypothesis", "this is a cat") == 0.0


def test_meteor_matches_synonyms_through_wordnet() -> None:
    """``sofa``/``couch`` share a WordNet synset: with the synonym stage the score rises
    above what exact and stem matches alone give (``divan`` is no synonym of ``sofa``)."""
    synonym = meteor("the cat sat on the couch", "the cat sat on the sofa")
    unrelated = meteor("the cat sat on the divan", "the cat sat on the sofa")
    assert synonym > unrelated
    assert synonym == pytest.approx(
        meteor("the cat sat on the sofa", "the cat sat on the sofa"), abs=0.05
    )


def test_meteor_refuses_texts_whose_alignment_would_stall_the_engine() -> None:
    words = " ".join(["w"] * 2_001)
    outcome = grader("text_similarity", evaluation_metric="meteor", input="{{ item.answer }}",
                     reference="{{ item.answer }}").grade({}, {"answer": words})  # fmt: skip
    assert outcome.status == "invalid"
    assert outcome.error is not None
    assert outcome.error["type"] == "InputTooLarge"
