"""What a kept model answer carries back on resume: everything a grader's `sample` is built from."""

from __future__ import annotations

import json

from evalkube.engine.answers import candidate_answer, kept_candidate
from evalkube.engine.candidates import Candidate


def test_a_kept_answer_keeps_tool_calls_and_openais_sample_fields() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    extra = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "{}"}}],
             "output_json": {}}  # fmt: skip
    answer = candidate_answer(Candidate("{}", output_tools=[call], sample_extra=extra))
    kept = kept_candidate(json.loads(json.dumps(answer)))  # as the store keeps it
    assert kept.output_tools == [call]
    assert kept.sample_extra == extra
    assert kept.output_text == "{}"


def test_an_answer_kept_before_these_fields_existed_still_resumes() -> None:
    kept = kept_candidate({"output_text": "x", "response_id": "r", "ms": 1.0, "model_calls": {}})
    assert (kept.output_tools, kept.sample_extra) == ([], {})
