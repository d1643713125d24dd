"""OpenAI's built-in grader types, evaluated in the engine process (not the sandbox).

Why the host: the code is ours and trusted (rapidfuzz, nltk, rouge-score), it reads only two
rendered strings, and a sandbox round trip per sample would cost more than the metric. The
strings are untrusted (model output), so they are length-capped
(:data:`evalkube.limits.BUILTIN_INPUT_CHARS`) and every failure becomes an invalid result of
that sample, never an engine error. The libraries are the ``graders`` extra; a suite that
needs a missing one fails when it is loaded (``evalkube validate``), naming the extra.

Scores (OpenAI's semantics, with the libraries its docs name):

- ``string_check``: 1.0 or 0.0; ``eq`` equal, ``ne`` different, ``like`` the reference is a
  substring of the input, ``ilike`` the same ignoring case.
- ``text_similarity`` (input = candidate, reference = expected):
  ``fuzzy_match`` ``rapidfuzz.fuzz.WRatio(input, reference) / 100``;
  ``bleu`` ``sacrebleu.sentence_bleu(input, [reference]).score / 100``: sacrebleu's
  documented sentence BLEU (13a tokenization, exponential smoothing, effective n-gram
  order), under which identical texts score 1.0 however short (nltk's unsmoothed
  ``sentence_bleu`` gives a one-word exact answer 1.8e-231, Azure's ``method4`` smoothing a
  three-word one 0.58);
  ``gleu`` ``nltk`` ``sentence_gleu([reference tokens], input tokens)`` (tokens: split on
  whitespace); ``meteor`` ``nltk`` ``meteor_score([reference tokens], input tokens)``
  with WordNet 3.0 from the system (:mod:`evalkube.grading.wordnet`); ``rouge_N``/
  ``rouge_l`` the F-measure of ``rouge_score``'s ``rougeN``/``rougeL`` scorer,
  ``score(reference, input)``.
- ``multi``: each (built-in) grader's score under its name, combined by ``calculate_output``
  (:mod:`evalkube.grading.formula`, never run as code).
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from evalkube import limits
from evalkube.grading.formula import Formula
from evalkube.grading.results import GradeOutcome, invalid
from evalkube.grading.templates import GraderTemplate, TemplateError

_LIBRARIES = {
    "fuzzy_match": "rapidfuzz",
    "bleu": "sacrebleu",
    "gleu": "nltk",
    "meteor": "nltk",
    **{f"rouge_{n}": "rouge_score" for n in ("1", "2", "3", "4", "5", "l")},
}


class InputTooLarge(ValueError):
    """A metric's cost on these texts is above its limit (the sample is invalid)."""


class MissingLibrary(ValueError):
    """A built-in grader needs a library this installation lacks."""


def _string_check(operation: str) -> Callable[[str, str], float]:
    checks: dict[str, Callable[[str, str], bool]] = {
        "eq": lambda a, b: a == b,
        "ne": lambda a, b: a != b,
        "like": lambda a, b: b in a,
        "ilike": lambda a, b: b.casefold() in a.casefold(),
    }
    check = checks[operation]
    return lambda text, reference: 1.0 if check(text, reference) else 0.0


def _similarity(metric: str) -> Callable[[str, str], float]:
    library = _LIBRARIES[metric]
    try:
        importlib.import_module(library)
    except ImportError:
        raise MissingLibrary(
            f"text_similarity `{metric}` needs the {library} package: "
            "pip install 'evalkube[graders]'"
        ) from None
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return lambda text, reference: float(fuzz.WRatio(text, reference)) / 100.0
    if metric == "bleu":
        from sacrebleu.metrics.bleu import BLEU

        bleu = BLEU(effective_order=True)  # sacrebleu.sentence_bleu's settings

        return lambda text, reference: float(bleu.sentence_score(text, [reference]).score) / 100
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        def gleu(text: str, reference: str) -> float:
            with warnings.catch_warnings():  # nltk warns when an n-gram order has no match
                warnings.simplefilter("ignore")
                return float(sentence_gleu([reference.split()], text.split()))

        return gleu
    if metric == "meteor":
        return _meteor()
    from rouge_score import rouge_scorer

    kind = "rougeL" if metric == "rouge_l" else f"rouge{metric[-1]}"
    scorer = rouge_scorer.RougeScorer([kind])

    def rouge(text: str, reference: str) -> float:
        if kind == "rougeL":
            _check_pairs("rouge_l compares", text.split(), reference.split())
        return float(scorer.score(reference, text)[kind].fmeasure)

    return rouge


def _check_pairs(what: str, words: list[str], other: list[str]) -> None:
    """Refuse texts whose word-by-word alignment is above :data:`limits.BUILTIN_LCS_CELLS`."""
    cells = len(words) * len(other)
    if cells > limits.BUILTIN_LCS_CELLS:
        raise InputTooLarge(
            f"{what} every word with every word: {cells} pairs is more than "
            f"{limits.BUILTIN_LCS_CELLS}; shorten the texts or use rouge_1..rouge_5"
        )


def _meteor() -> Callable[[str, str], float]:
    from nltk.translate.meteor_score import meteor_score

    from evalkube.grading.wordnet import WordNetMissing, wordnet_reader

    try:
        wordnet = wordnet_reader()
    except WordNetMissing as exc:
        raise MissingLibrary(f"text_similarity `meteor`: {exc}") from None

    def meteor(text: str, reference: str) -> float:
        hypothesis, expected = text.split(), reference.split()
        _check_pairs("meteor aligns", hypothesis, expected)
        return float(meteor_score([expected], hypothesis, wordnet=wordnet))

    return meteor


class BuiltinGrader:
    """One built-in criterion, compiled once per task: templates and the scoring function."""

    def __init__(
        self,
        kind: str,
        *,
        input: str,
        reference: str,
        metric_id: str,
        where: str,
        operation: str | None = None,
        evaluation_metric: str | None = None,
    ) -> None:
        """Raises :class:`TemplateError` (bad template) or :class:`MissingLibrary`."""
        self.kind = kind
        self.metric_id = metric_id
        self.input = GraderTemplate(input, f"{where}.input")
        self.reference = GraderTemplate(reference, f"{where}.reference")
        if kind == "string_check":
            assert operation is not None
            self.score = _string_check(operation)
        else:
            assert evaluation_metric is not None
            self.score = _similarity(evaluation_metric)

    def grade(self, sample: Mapping[str, Any], item: Mapping[str, Any]) -> GradeOutcome:
        """The sample's outcome; a render failure or an oversized text is invalid."""
        try:
            text = self.input.render(item, sample)
            reference = self.reference.render(item, sample)
        except TemplateError as exc:
            return invalid(self.metric_id, error_type="TemplateError", message=str(exc))
        cap = limits.BUILTIN_INPUT_CHARS
        if len(text) > cap or len(reference) > cap:
            return invalid(
                self.metric_id,
                error_type="InputTooLarge",
                message=f"{self.kind}: input or reference longer than {cap} characters",
            )
        try:
            value = self.score(text, reference)
        except InputTooLarge as exc:
            return invalid(self.metric_id, error_type="InputTooLarge", message=str(exc))
        except Exception as exc:  # a library failing on odd text: that sample only
            return invalid(self.metric_id, error_type=type(exc).__name__, message=str(exc))
        keep = limits.BUILTIN_JUDGE_CHARS
        judge = {"input": text[:keep], "reference": reference[:keep]}
        return GradeOutcome("valid", {self.metric_id: value}, judge)


class MultiGrader:
    """OpenAI's ``multi``: several built-in graders, one score from ``calculate_output``."""

    def __init__(
        self, graders: Mapping[str, BuiltinGrader], formula: Formula, metric_id: str
    ) -> None:
        self.graders = dict(graders)
        self.formula = formula
        self.metric_id = metric_id

    def grade(self, sample: Mapping[str, Any], item: Mapping[str, Any]) -> GradeOutcome:
        """Each grader's score, then the formula; any failure makes the sample invalid."""
        scores: dict[str, float] = {}
        for name, grader in self.graders.items():
            outcome = grader.grade(sample, item)
            if (error := outcome.error) is not None:
                return invalid(
                    self.metric_id,
                    error_type=str(error.get("type")),
                    message=f"grader {name!r}: {error.get('message')}",
                )
            scores[name] = outcome.scores[grader.metric_id]
        try:
            value = self.formula.evaluate(scores)
        except Exception as exc:  # division by zero, log(0), overflow, min(x) of one number
            return invalid(
                self.metric_id,
                error_type=type(exc).__name__,
                message=f"calculate_output {self.formula.source!r}: {exc}",
            )
        if not math.isfinite(value):
            return invalid(
                self.metric_id,
                error_type="InvalidResult",
                message=f"calculate_output {self.formula.source!r} gave {value}",
            )
        return GradeOutcome("valid", {self.metric_id: value}, {"scores": scores})
