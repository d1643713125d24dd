"""score_model/label_model requests and verdicts: the model's answer is untrusted data."""

from __future__ import annotations

import json
from typing import Any

import pytest

from evalkube.grading import EmbeddingJudge, ModelJudge


def judge(kind: str = "score_model", **fields: Any) -> ModelJudge:
    return ModelJudge(
        kind,
        messages=[("user", "Grade {{ sample.output_text }} vs {{ item.answer }}")],
        metric_id="m",
        where="tasks[t].grader",
        **fields,
    )


def answer(text: str) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
    }


def test_request_renders_messages_and_maps_sampling_params() -> None:
    body = judge(
        sampling={"temperature": 0.2, "top_p": 0.9, "seed": 7, "max_completions_tokens": 20,
                  "reasoning_effort": "low"},
    ).request({"output_text": "x"}, {"answer": "y"})  # fmt: skip
    assert body["model"] == "auto"
    assert body["input"] == [{"role": "user", "content": "Grade x vs y"}]
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.2, 0.9, 7)
    assert body["max_output_tokens"] == 20
    assert body["reasoning"] == {"effort": "low"}
    assert body["text"]["format"]["schema"]["properties"]["result"] == {"type": "number"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("The answer is 7", "did not answer {'result': ...} JSON"),
        (json.dumps({"steps": []}), "did not answer"),
        (json.dumps({"result": True}), "is not a finite number"),
        (json.dumps({"result": "7"}), "is not a finite number"),
        ('{"result": NaN}', "is not a finite number"),
        ('{"result": Infinity}', "is not a finite number"),
        # a judge's integer too large for a float: invalid, not an OverflowError that would
        # fail every sample of the judging batch
        ('{"result": 1' + "0" * 400 + "}", "is not a finite number"),
    ],
)
def test_unusable_scores_are_invalid(text: str, message: str) -> None:
    outcome = judge().verdict(answer(text))
    assert outcome.status == "invalid"
    assert outcome.scores == {"m": 0.0}
    assert outcome.error is not None
    assert message in outcome.error["message"]


@pytest.mark.parametrize(
    ("result", "score_range", "expected"),
    [(1.5, None, 1.0), (-0.5, None, 0.0), (0.25, None, 0.25), (9, [1, 7], 7.0), (0, [1, 7], 1.0)],
)
def test_a_score_outside_the_range_is_clamped_into_it(
    result: float, score_range: list[float] | None, expected: float
) -> None:
    """OpenAI's graders guide: score_model output is clamped to `range`."""
    outcome = judge(score_range=score_range).verdict(answer(json.dumps({"result": result})))
    assert outcome.status == "valid"
    assert outcome.scores == {"m": expected}
    assert outcome.judge is not None
    assert outcome.judge["result"] == result  # what it said


def test_a_score_within_a_custom_range() -> None:
    outcome = judge(score_range=[1, 7]).verdict(answer(json.dumps({"steps": ["s"], "result": 7})))
    assert outcome.scores == {"m": 7.0}
    assert outcome.judge == {"result": 7, "steps": ["s"], "response_id": "resp_1"}


def test_labels() -> None:
    labeler = judge("label_model", labels=["good", "bad", "meh"], passing_labels=["good", "meh"])
    assert labeler.verdict(answer('{"result": "meh"}')).scores == {"m": 1.0}
    assert labeler.verdict(answer('{"result": "bad"}')).scores == {"m": 0.0}
    unknown = labeler.verdict(answer('{"result": "great"}'))
    assert unknown.status == "invalid"
    assert unknown.error is not None
    assert "'great' is not one of ['good', 'bad', 'meh']" in unknown.error["message"]


@pytest.mark.parametrize(
    "data",
    [
        [],
        [{"embedding": [1.0]}],
        [{"embedding": [1.0, 0.0]}, {"embedding": [1.0]}],
        [{"embedding": [0.0, 0.0]}, {"embedding": [1.0, 0.0]}],
        [{"embedding": [True, 0.0]}, {"embedding": [1.0, 0.0]}],
        [{"embedding": [1e200, 1e200]}, {"embedding": [1e200, 1e200]}],
        [{"embedding": [10**400, 1.0]}, {"embedding": [1.0, 0.0]}],
    ],
)
def test_cosine_refuses_unusable_embeddings(data: list[dict[str, Any]]) -> None:
    cosine = EmbeddingJudge(input="{{ sample.output_text }}", reference="r", metric_id="m",
                            where="w")  # fmt: skip
    outcome = cosine.verdict({"data": data})
    assert outcome.status == "invalid"
    assert outcome.scores == {"m": 0.0}


def test_cosine_of_two_embeddings() -> None:
    cosine = EmbeddingJudge(input="{{ sample.output_text }}", reference="r", metric_id="m",
                            where="w")  # fmt: skip
    assert cosine.request({"output_text": "a"}, {}) == {"model": "auto", "input": ["a", "r"]}
    outcome = cosine.verdict({"data": [{"embedding": [3, 4]}, {"embedding": [4, 3]}]})
    assert outcome.scores == pytest.approx({"m": 24 / 25})
