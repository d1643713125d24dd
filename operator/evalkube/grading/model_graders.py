"""OpenAI's ``score_model`` and ``label_model`` graders: the request and the verdict (pure).

The engine sends :meth:`ModelJudge.request` through the run's model bridge (as a grader's
``ctx.responses_create`` would: the bridge holds the key, resolves ``model: auto`` to the
run's ``judgeModel``, enforces the budget and counts the call) and hands the answer to
:meth:`ModelJudge.verdict`. The model is asked for JSON by a strict schema
(``{"steps": [...], "result": ...}``); its answer is untrusted. As OpenAI documents
``score_model``, a number outside ``range`` is clamped into it (1.5 with range [0, 1] scores
1.0) and anything but a finite number scores 0 (the sample is invalid, with the answer and
why); a ``label_model`` answer that is not one of ``labels`` is invalid too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from evalkube import limits
from evalkube.grading.results import GradeOutcome, capped_repr, invalid, is_score
from evalkube.grading.templates import GraderTemplate, TemplateError


def _output_text(response: Mapping[str, Any]) -> str:
    parts: list[str] = []
    items = response.get("output")
    for entry in items if isinstance(items, list) else []:
        if isinstance(entry, dict) and entry.get("type") == "message":
            for content in entry.get("content") or []:
                if isinstance(content, dict) and content.get("type") == "output_text":
                    parts.append(str(content.get("text") or ""))
    return "".join(parts)


class ModelJudge:
    """One model criterion, compiled once per task."""

    path = "/v1/responses"

    def __init__(
        self,
        kind: str,
        *,
        messages: Sequence[tuple[str, str]],
        metric_id: str,
        where: str,
        model: str | None = None,
        score_range: Sequence[float] | None = None,
        labels: Sequence[str] | None = None,
        passing_labels: Sequence[str] | None = None,
        sampling: Mapping[str, Any] | None = None,
    ) -> None:
        """Raises :class:`evalkube.grading.TemplateError` for a bad message template."""
        self.kind = kind
        self.metric_id = metric_id
        self.messages = [
            (role, GraderTemplate(content, f"{where}.input[{i}].content"))
            for i, (role, content) in enumerate(messages)
        ]
        self.model = model or "auto"
        self.low, self.high = (score_range or (0.0, 1.0))[:2]
        self.labels = list(labels or [])
        self.passing = set(passing_labels or [])
        self.sampling = dict(sampling or {})

    def _schema(self) -> dict[str, Any]:
        result: dict[str, Any] = (
            {"type": "number"}
            if self.kind == "score_model"
            else {"type": "string", "enum": self.labels}
        )
        return {
            "type": "object",
            "properties": {
                "steps": {"type": "array", "items": {"type": "string"}},
                "result": result,
            },
            "required": ["steps", "result"],
            "additionalProperties": False,
        }

    def request(self, sample: Mapping[str, Any], item: Mapping[str, Any]) -> dict[str, Any]:
        """The Responses API request for one sample (``TemplateError`` if a field is missing)."""
        body: dict[str, Any] = {
            "model": self.model,
            "input": [
                {"role": role, "content": template.render(item, sample)}
                for role, template in self.messages
            ],
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": self.kind,
                    "schema": self._schema(),
                    "strict": True,
                }
            },
        }
        sampling = self.sampling
        for key in ("temperature", "top_p", "seed"):
            if sampling.get(key) is not None:
                body[key] = sampling[key]
        if sampling.get("max_completions_tokens") is not None:
            body["max_output_tokens"] = sampling["max_completions_tokens"]
        if sampling.get("reasoning_effort") is not None:
            body["reasoning"] = {"effort": sampling["reasoning_effort"]}
        return body

    def failed(self, kind: str, message: str) -> GradeOutcome:
        """An invalid outcome (the call failed, or the answer is unusable)."""
        return invalid(self.metric_id, error_type=kind, message=f"{self.kind}: {message}")

    def verdict(self, response: Mapping[str, Any]) -> GradeOutcome:
        """The sample's outcome from the model's answer."""
        text = _output_text(response)
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or "result" not in answer:
            return self.failed(
                "InvalidModelAnswer",
                f"the model did not answer {{'result': ...}} JSON: {text[:200]!r}",
            )
        result = answer["result"]
        steps = answer.get("steps")
        judge: dict[str, Any] = {
            "result": result,
            "steps": steps if isinstance(steps, list) else None,
            "response_id": response.get("id"),
        }
        if len(json.dumps(judge, default=str)) > limits.INVALID_PAYLOAD_REPR_CHARS * 8:
            judge["steps"] = None
        if self.kind == "label_model":
            if not isinstance(result, str) or result not in self.labels:
                return self.failed("InvalidModelAnswer", f"{result!r} is not one of {self.labels}")
            return GradeOutcome(
                "valid", {self.metric_id: 1.0 if result in self.passing else 0.0}, judge
            )
        if not is_score(result):  # a judge's 400-digit integer too: no float holds it
            return self.failed(
                "InvalidModelAnswer", f"result {capped_repr(result)} is not a finite number"
            )
        value = min(max(float(result), self.low), self.high)
        return GradeOutcome("valid", {self.metric_id: value}, judge)


class EmbeddingJudge:
    """``text_similarity`` with ``cosine``: the cosine of the input's and the reference's
    embeddings, by the run's ``embeddingModel`` (``model: auto`` through the bridge)."""

    path = "/v1/embeddings"

    def __init__(self, *, input: str, reference: str, metric_id: str, where: str) -> None:
        self.metric_id = metric_id
        self.input = GraderTemplate(input, f"{where}.input")
        self.reference = GraderTemplate(reference, f"{where}.reference")

    def request(self, sample: Mapping[str, Any], item: Mapping[str, Any]) -> dict[str, Any]:
        """The Embeddings API request: both texts in one call."""
        texts = [self.input.render(item, sample), self.reference.render(item, sample)]
        if any(len(t) > limits.BUILTIN_INPUT_CHARS for t in texts):
            raise TemplateError(f"input or reference longer than {limits.BUILTIN_INPUT_CHARS}")
        return {"model": "auto", "input": texts}

    def failed(self, kind: str, message: str) -> GradeOutcome:
        return invalid(self.metric_id, error_type=kind, message=f"cosine: {message}")

    def verdict(self, response: Mapping[str, Any]) -> GradeOutcome:
        data = response.get("data")
        vectors: list[list[float]] = []
        for entry in data if isinstance(data, list) else []:
            vector = entry.get("embedding") if isinstance(entry, dict) else None
            if isinstance(vector, list) and all(is_score(x) for x in vector):
                vectors.append([float(x) for x in vector])
        if len(vectors) != 2 or len(vectors[0]) != len(vectors[1]) or not vectors[0]:
            return self.failed("InvalidModelAnswer", "expected two embeddings of one size")
        a, b = vectors
        norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
        if not math.isfinite(norm) or norm == 0.0:
            return self.failed("InvalidModelAnswer", "an embedding has no length")
        value = sum(x * y for x, y in zip(a, b, strict=True)) / norm
        if not math.isfinite(value):
            return self.failed("InvalidModelAnswer", "cosine is not finite")
        return GradeOutcome("valid", {self.metric_id: value}, None)
